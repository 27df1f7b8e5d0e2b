"""Every guarantee of the contract against the ``pgqueuer`` kit (``pytest --wd-store
pgqueuer``). Some fail on purpose: docs/peers/pgqueuer.md lists which, and why."""

from without_durability.testing.conformance import *  # noqa: F403
