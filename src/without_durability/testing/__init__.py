"""The conformance suite, shipped as a pytest plugin (``--wd-store NAME``).

Register a ``StoreFactory`` for your store and import ``without_durability.testing.conformance`` into a
test module; every guarantee of the contract then runs against it, including a Hypothesis model test
that drives it side by side with the Memory store.
"""

from __future__ import annotations

from .harness import (
    EffectFailed,
    EffectKit,
    ManualTestClock,
    RealTestClock,
    StoreFactory,
    StoreUnderTest,
    TestClock,
    register,
    registered,
)

__all__ = [
    "EffectFailed",
    "EffectKit",
    "ManualTestClock",
    "RealTestClock",
    "StoreFactory",
    "StoreUnderTest",
    "TestClock",
    "register",
    "registered",
]
