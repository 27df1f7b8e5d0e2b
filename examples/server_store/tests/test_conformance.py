"""Every guarantee of the contract against the ``pgqueue`` store (``pytest --wd-store pgqueue``)."""

from without_durability.testing.conformance import *  # noqa: F403
