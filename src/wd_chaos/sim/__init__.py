"""Deterministic simulation (``wd-chaos sim``): the library's own code on one seeded event loop.

Here only what the rest of the harness may read without importing the simulator (the mutant
catalogue's checks of ``sim:`` killers): which stores it simulates and which checkers it adds.
"""

from __future__ import annotations

SIMULATED = "simulated"
"""The capability of a store kit whose store ``wd-chaos sim`` runs (``StoreKit.open_simulated``)."""

SIM_CHECKS = ("cancelled-calls",)
"""Checkers every sim run adds to its scenario's: sim cancels calls at any await."""


def simulated_stores() -> list[str]:
    """The installed store kits ``wd-chaos sim`` runs (those that provide ``simulated``), by name."""
    from without_durability.testing.kit import kits

    return sorted(name for name, kit in kits().items() if SIMULATED in kit.provides)


def simulates(store: str) -> bool:
    """Whether ``wd-chaos sim`` runs ``store`` (a kit name or alias): its kit provides ``simulated``."""
    from without_durability.testing.kit import KitError, find_kit

    try:
        return SIMULATED in find_kit(store).provides
    except KitError:
        return False
