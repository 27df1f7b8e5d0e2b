"""The conformance suite against every selected store (``--wd-store``; default: all that can run)."""

from without_durability.testing.conformance import *  # noqa: F403
