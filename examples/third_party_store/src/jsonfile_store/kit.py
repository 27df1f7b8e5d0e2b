"""The ``jsonfile`` store's kit: what the conformance suite, wd-chaos and the mutant gate need to run
this store, registered in pyproject.toml under the entry-point group ``without_durability.stores``."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from without_durability import Pass
from without_durability.clock import ManualClock, monotonic_micros, system_clock
from without_durability.testing import EffectFailed, EffectKit, ManualTestClock, StoreUnderTest
from without_durability.testing.kit import Opened, Spec, StoreKit, stepped_clock

from . import FileEffect, JsonFile, open_durable

# in memory where the machine has one: the suite judges the rules, and an fsync to disk per write
# would make its thousands of model steps take a minute
_IN_MEMORY = "/dev/shm" if Path("/dev/shm").is_dir() else None


def effects(file: JsonFile) -> EffectKit[FileEffect]:
    """Ledger effects over ``doc["data"]["ledger"]``, for the suite's exactly-once tests."""

    def ledger_add(name: str, amount: int) -> FileEffect:
        def effect(doc: dict[str, Any]) -> object:
            ledger = doc["data"].setdefault("ledger", {})
            ledger[name] = ledger.get(name, 0) + amount
            return ledger[name]

        return effect

    async def ledger_read(name: str) -> int:
        return int(await file.step(lambda doc: (doc["data"].get("ledger", {}).get(name, 0), False)))

    def superseding(pass_: Pass, inner: FileEffect) -> FileEffect:
        def effect(doc: dict[str, Any]) -> object:
            result = inner(doc)
            # inside the lock nobody else can claim, so the newer claim is this effect's own write
            doc["claims"][pass_.workflow]["token"] += 1
            return result

        return effect

    def failing(inner: FileEffect) -> FileEffect:
        def effect(doc: dict[str, Any]) -> object:
            inner(doc)
            raise EffectFailed("effect failed after performing its write")

        return effect

    return EffectKit(ledger_add, ledger_read, superseding, failing)


@asynccontextmanager
async def open_for_test(_server: object) -> AsyncIterator[StoreUnderTest[FileEffect]]:
    """A fresh store in a new temporary folder, on a manual clock the suite moves."""
    clock = ManualClock()
    with tempfile.TemporaryDirectory(prefix="jsonfile-", dir=_IN_MEMORY) as folder:
        durable = open_durable(Path(folder) / "store.json", clock=clock)
        file = durable.checkpointer.file  # type: ignore[attr-defined]
        yield StoreUnderTest("jsonfile", durable, ManualTestClock(clock), effects(file))


class JsonFileKit(StoreKit):
    """One JSON file shared by every process of a run (no server)."""

    name = "jsonfile"
    description = "one JSON file under flock (examples/third_party_store)"
    provides = frozenset({"workers"})
    mutant_modules = ("jsonfile_store.mutants",)

    def open(self, server: object) -> Any:
        """A fresh store for one conformance test."""
        return open_for_test(server)

    def worker_spec(self, server: object, run_dir: Path, tag: str) -> Spec:
        """The run's file, in the run's folder."""
        return {"path": str(run_dir / "store.json")}

    async def open_worker(self, spec: Spec) -> Opened:
        """Open the run's file, with a ledger list under ``doc["data"]``."""
        # the wall clock a wall-step fault moves; leases stay on the monotonic clock
        clock = stepped_clock(spec["wall_offset"]) if spec.get("wall_offset") else system_clock
        durable = open_durable(
            spec["path"], clock=clock, lease_clock=monotonic_micros, namespace=spec.get("namespace", "default")
        )
        file: JsonFile = durable.checkpointer.file  # type: ignore[attr-defined]

        def ledger_effect(workflow: str, key: str, token: int, failpoint: Callable[[], None]) -> FileEffect:
            def effect(doc: dict[str, Any]) -> object:
                rows = doc["data"].setdefault("chaos_ledger", [])
                rows.append({"row": len(rows) + 1, "workflow": workflow, "key": key, "token": token})
                failpoint()  # a kill here dies before the rename: the row is not written
                return {"row": len(rows), "token": token}

            return effect

        async def read_ledger(workflows: list[str]) -> list[dict[str, Any]]:
            wanted = set(workflows)
            rows = await file.step(lambda doc: (list(doc["data"].get("chaos_ledger", [])), False))
            return [r for r in rows if r["workflow"] in wanted]

        async def close() -> None:
            return None

        return Opened(durable, close, ledger_effect, read_ledger)


KIT = JsonFileKit()
