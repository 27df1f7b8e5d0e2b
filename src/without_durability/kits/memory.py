"""The Memory store's kit: a manual clock the suite moves, effects over the store's own dict. It lives
in one process, so wd-chaos's worker processes cannot run it; ``wd-chaos sim`` can (one process,
one event loop: ``MemorySimulated``), and judges its mutants with the conformance suite."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from .._values import Pass
from ..clock import ManualClock
from ..memory import MemoryCheckpointer, MemoryDurable, MemoryEffect, MemoryScheduler
from ..testing.harness import EffectFailed, EffectKit, ManualTestClock, StoreUnderTest
from ..testing.kit import StoreKit
from ..testing.simulated import SimulatedStore, Wrap


def memory_effects(checkpointer: MemoryCheckpointer) -> EffectKit[MemoryEffect]:
    """Ledger effects over ``checkpointer.state``."""

    def ledger_add(name: str, amount: int) -> MemoryEffect:
        def effect(state: dict[str, Any]) -> object:
            ledger = state.setdefault("ledger", {})
            ledger[name] = ledger.get(name, 0) + amount
            return ledger[name]

        return effect

    async def ledger_read(name: str) -> int:
        return int(checkpointer.state.get("ledger", {}).get(name, 0))

    def superseding(pass_: Pass, inner: MemoryEffect) -> MemoryEffect:
        def effect(state: dict[str, Any]) -> object:
            result = inner(state)
            # Nothing can run inside a synchronous effect, so the newer claim is written directly.
            checkpointer._claims[pass_.workflow].token += 1
            return result

        return effect

    def failing(inner: MemoryEffect) -> MemoryEffect:
        def effect(state: dict[str, Any]) -> object:
            inner(state)
            raise EffectFailed("effect failed after performing its write")

        return effect

    return EffectKit(ledger_add, ledger_read, superseding, failing)


@asynccontextmanager
async def open_memory(_server: object) -> AsyncIterator[StoreUnderTest[MemoryEffect]]:
    """A fresh Memory store on a manual clock."""
    clock = ManualClock()
    checkpointer = MemoryCheckpointer(clock=clock)
    durable = MemoryDurable(checkpointer, MemoryScheduler(clock=clock))
    yield StoreUnderTest("memory", durable, ManualTestClock(clock), memory_effects(checkpointer))


class MemoryKit(StoreKit):
    """The Memory store: conformance suite and conformance-killed mutants only."""

    name = "memory"
    description = "in-process test double"
    provides = frozenset({"simulated"})
    mutant_modules = (
        "without_durability.kits.memory_mutants",
        "without_durability.kits.memory_cancel_mutants",
        "without_durability.kits.runtime_mutants",  # the Worker's and Run's, judged on this store by sim
    )

    def open(self, server: object) -> Any:
        """A fresh Memory store on a manual clock."""
        return open_memory(server)

    def open_simulated(
        self, clock: Callable[[], datetime], lease_clock: Callable[[], int], wrap: Wrap | None = None
    ) -> MemorySimulated:
        """A fresh Memory store on the simulator's clocks (see ``StoreKit.open_simulated``)."""
        return MemorySimulated(clock, lease_clock, wrap)


class MemorySimulated(SimulatedStore):
    """The Memory store in a simulated run: its ledger in the store's own state, its records
    looked at in its dictionary; a reboot keeps it (its records stand for a file's)."""

    def __init__(
        self, clock: Callable[[], datetime], lease_clock: Callable[[], int], wrap: Wrap | None = None
    ) -> None:
        durable = MemoryDurable(
            MemoryCheckpointer(clock=clock, lease_clock=lease_clock), MemoryScheduler(clock=clock)
        )
        self.durable: Any = wrap(durable) if wrap is not None else durable
        self.clock, self.lease_clock, self.wrap = clock, lease_clock, wrap

    def scheduler_in(self, namespace: str) -> Any:
        """A Memory scheduler of its own (the Memory store's namespaces are separate objects), the
        mutant's ``wrap`` applied to a durable around it."""
        # a checkpointer nobody uses: a mutant's wrap takes a whole durable (a scheduler mutant
        # reaches the scheduler through it), so the probe's queue is broken as the run's is
        checkpointer = MemoryCheckpointer(clock=self.clock, lease_clock=self.lease_clock)
        durable = MemoryDurable(checkpointer, MemoryScheduler(clock=self.clock, namespace=namespace))
        return (self.wrap(durable) if self.wrap is not None else durable).scheduler

    def ledger_effect(self, workflow: str, key: str, token: int) -> MemoryEffect:
        """An effect that appends one row to ``state["chaos_ledger"]``."""

        def effect(state: dict[str, Any]) -> object:
            rows = state.setdefault(SIM_LEDGER, [])
            row = len(rows) + 1
            rows.append({"row": row, "workflow": workflow, "key": key, "token": token})
            return {"row": row, "token": token}

        return effect

    def ledger_rows(self) -> list[dict[str, Any]]:
        """Every ledger row, in order."""
        return [dict(r) for r in self.durable.checkpointer.state.get(SIM_LEDGER, [])]

    def peek(self, workflow: str, key: str | None) -> tuple[int, bool]:
        """The workflow's records in the store's dictionary (no step)."""
        records = self.durable.checkpointer._records.get(workflow, {})
        return len(records), key is not None and key in records


SIM_LEDGER = "chaos_ledger"
"""The key of a simulated run's ledger rows in the store's state."""


KIT = MemoryKit()
