"""The take storm's ``landing`` probe (``wd_chaos.client.landing``) on a real Postgres server: the
interleaving it forces is refused by the store and lands a stale write on the catalogue mutant that
reads its fence from a snapshot, every time, and ``stale-landing`` tells the two apart from what the
probe's clients observed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from wd_chaos import checks
from wd_chaos.client.landing import KEY, landing
from wd_chaos.client.workload import Recorder
from wd_chaos.history import HistoryWriter, read_lines
from without_durability.testing.harness import StoreUnderTest
from without_durability_postgres.mutants import RecordWithoutRowLock

pytest.importorskip("psycopg")
from without_durability_postgres.holds import holds_opener

pytestmark = [pytest.mark.asyncio, pytest.mark.wd_store("postgres")]


class _Durable:
    def __init__(self, checkpointer: Any, scheduler: Any) -> None:
        self.checkpointer = checkpointer
        self.scheduler = scheduler


async def _probe(store: StoreUnderTest[Any], tmp_path: Path, checkpointer: Any) -> tuple[list[Any], checks.Verdict]:
    path = tmp_path / "probe.jsonl"
    hist = HistoryWriter(path, "probe")
    rec = Recorder(_Durable(checkpointer, store.scheduler), hist)
    opener = holds_opener(store.extra["url"], store.extra["schema"])
    for n in range(3):
        await landing(rec, opener, f"probe/landing/{n}")
    hist.close()
    ops = list(read_lines(path))
    verdict = checks.run_checker("stale-landing", checks.checkers()["stale-landing"], ops, {})
    records = [o for o in ops if o["type"] == "complete" and o["f"] == "record"]
    return records, verdict


async def test_the_store_refuses_the_landing_record_every_time(
    wd_store: StoreUnderTest[Any], tmp_path: Path
) -> None:
    records, verdict = await _probe(wd_store, tmp_path, wd_store.checkpointer)
    assert [r["outcome"] for r in records] == ["fenced"] * 3
    assert verdict.valid is True, verdict.summary


async def test_a_snapshot_fence_lands_the_record_after_the_claim_every_time(
    wd_store: StoreUnderTest[Any], tmp_path: Path
) -> None:
    mutant = RecordWithoutRowLock(pool=wd_store.extra["pool"])
    records, verdict = await _probe(wd_store, tmp_path, mutant)
    assert [(r["outcome"], r.get("won")) for r in records] == [("ok", True)] * 3
    assert verdict.valid is False, verdict.summary
    assert [e["key"] for e in verdict.evidence] == [KEY] * 3
