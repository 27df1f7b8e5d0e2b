"""The conformance suite, shipped as a pytest plugin (``--wd-store NAME``).

Register a ``StoreKit`` for your store under the entry-point group ``without_durability.stores`` (or a
``StoreFactory`` with ``register``) and import ``without_durability.testing.conformance`` into a test
module; every guarantee of the contract then runs against it, including a Hypothesis model test that
drives it side by side with the Memory store. A kit also carries the store into wd-chaos and the
mutant gate (see ``kit.py``); a store writes its own mutants with ``mutants.py``'s types.
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
from .kit import MutatePlan, Opened, StoreKit, find_kit, kits
from .mutants import Mutant, Swap, replaced, swap
from .simulated import SimulatedStore
from .workflow import (
    EffectLedger,
    MissingInput,
    StepReport,
    WorkflowKit,
    WorkflowReport,
    check_upgrade,
    check_workflow,
)

__all__ = [
    "EffectLedger",
    "MissingInput",
    "StepReport",
    "WorkflowKit",
    "WorkflowReport",
    "check_upgrade",
    "check_workflow",
    "MutatePlan",
    "Mutant",
    "Swap",
    "replaced",
    "swap",
    "Opened",
    "SimulatedStore",
    "StoreKit",
    "find_kit",
    "kits",
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
