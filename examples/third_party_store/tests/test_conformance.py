"""Every guarantee of the contract against the ``jsonfile`` store (``pytest --wd-store jsonfile``)."""

from without_durability.testing.conformance import *  # noqa: F403
