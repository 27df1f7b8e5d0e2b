"""The store kits of the stores that ship in the core package (Memory, SQLite), registered by entry
point like every other store's (see ``without_durability.testing.kit``)."""

LEASE_CLOCK_KILLERS = (
    "tests/test_lease_clock.py::test_a_wall_clock_step_forward_does_not_lapse_a_live_claim",
    "tests/test_lease_clock.py::test_a_wall_clock_step_back_neither_frees_nor_keeps_a_pass",
)
"""The checks that catch a process-clock store (Memory, SQLite) measuring leases on the wall clock."""
