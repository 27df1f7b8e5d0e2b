"""Deterministic simulation (``wd-chaos sim``): the library's own code on one seeded event loop.

Here only what the rest of the harness may read without importing the simulator (the mutant
catalogue's checks of ``sim:`` killers): which stores it simulates and which checkers it adds.
"""

SIM_STORES = ("memory", "sqlite")
"""The store kits ``wd-chaos sim`` runs (an in-process store whose kit offers ``simulated``)."""

SIM_CHECKS = ("cancelled-calls",)
"""Checkers every sim run adds to its scenario's: sim cancels calls at any await."""
