"""Every guarantee of the contract against the ``procrastinate`` kit (``pytest --wd-store
procrastinate``). Some fail on purpose: docs/peers/procrastinate.md lists which, and why."""

from without_durability.testing.conformance import *  # noqa: F403
