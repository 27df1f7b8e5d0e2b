"""The ``worker`` client's recording durable and ``take_and_claim``: offered exactly when the wrapped
durable offers it, and written to the history as the take, claim and load it stands for, so the
checkers judge it as those calls.

Run with ``--wd-store postgres``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from wd_chaos.client.workload import Recorder, recording_durable
from wd_chaos.history import HistoryWriter, pair, read_lines
from without_durability import MemoryCheckpointer, MemoryDurable, MemoryScheduler, Pass, TakesAndClaims
from without_durability.testing.harness import StoreUnderTest
from without_durability_postgres import PostgresCheckpointer, PostgresDurable, PostgresScheduler
from without_durability_postgres.kit import fresh_schema

LONG = timedelta(hours=1)


def _ops(path: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """(f, outcome, invoke and complete fields merged) of each take_and_claim operation, in order."""
    out = []
    for p in pair(read_lines(path)):
        if p["invoke"].get("via") == "take_and_claim":
            done = p["complete"] or {}
            out.append((p["invoke"]["f"], done.get("outcome", "unknown"), {**p["invoke"], **done}))
    return out


@asynccontextmanager
async def durable_and_history(
    wd_store: StoreUnderTest[Any], tmp_path: Path
) -> AsyncIterator[tuple[PostgresDurable, HistoryWriter, Path, str]]:
    """A PostgresDurable in a fresh schema, a worker's history file beside it, and the schema."""
    async with fresh_schema(wd_store.extra["url"], min_size=2, max_size=4) as (pool, schema):
        path = tmp_path / "h.jsonl"
        durable = PostgresDurable(PostgresCheckpointer(pool=pool), PostgresScheduler(pool))
        yield durable, HistoryWriter(path, "worker-0"), path, schema


def test_a_durable_without_it_gets_a_recording_without_it(tmp_path: Path) -> None:
    durable = MemoryDurable(MemoryCheckpointer(), MemoryScheduler())
    assert not isinstance(durable, TakesAndClaims)
    recorded = recording_durable(Recorder(durable, HistoryWriter(tmp_path / "h.jsonl", "worker-0")))
    assert not hasattr(recorded, "take_and_claim"), "the Worker would call a capability the store lacks"
    assert not isinstance(recorded, TakesAndClaims)


@pytest.mark.asyncio
@pytest.mark.wd_store("postgres")
async def test_it_is_recorded_as_the_take_claim_and_load_it_stands_for(
    wd_store: StoreUnderTest[Any], tmp_path: Path
) -> None:
    async with durable_and_history(wd_store, tmp_path) as (durable, hist, path, _):
        rec = Recorder(durable, hist)
        granted: list[Pass] = []
        rec.on_claim = granted.append  # the after-claim failpoint's hook
        recorded = recording_durable(rec)
        assert isinstance(recorded, TakesAndClaims)

        await durable.arrive("w", "k", 1)
        taken = await recorded.take_and_claim(LONG, alive=LONG, budget=LONG)
        assert taken is not None and taken[1] is not None
        assert granted == [taken[1]], "the after-claim failpoint must fire for a pass granted"
        assert await recorded.take_and_claim(LONG, alive=LONG, budget=LONG) is None  # nothing due
        await durable.scheduler.schedule("w")  # due again, its claim still held
        contended = await recorded.take_and_claim(LONG, alive=LONG, budget=LONG)
        assert contended is not None and contended[1] is None and len(granted) == 1
        hist.close()

    ops = _ops(path)
    assert [(f, outcome) for f, outcome, _ in ops] == [
        ("take", "ok"), ("claim", "ok"), ("load", "ok"),
        ("take", "ok"), ("claim", "failed"), ("load", "failed"),  # nothing due: neither was made
        ("take", "ok"), ("claim", "contended"), ("load", "failed"),
    ]  # fmt: skip
    take, claim, load = (fields for _, _, fields in ops[:3])
    assert take["workflow"] == "w" and take["visibility"] == LONG.total_seconds() and take["receipt"]
    assert claim["workflow"] == "w" and claim["token"] == taken[1].token
    assert claim["alive"] == LONG.total_seconds() and claim["budget"] == LONG.total_seconds()
    assert load["workflow"] == "w" and load["token"] == taken[1].token and load["keys"] == ["k"]
    assert ops[3][2]["workflow"] is None
    assert ops[7][2]["workflow"] == "w"
    assert len({fields["call"] for _, _, fields in ops}) == 3, "each call's three share one call id"
    assert all(fields["type"] == "complete" for _, _, fields in ops), "every operation completed"


@pytest.mark.asyncio
@pytest.mark.wd_store("postgres")
async def test_a_busy_claim_row_is_recorded_as_no_claim_not_as_a_refusal(
    wd_store: StoreUnderTest[Any], tmp_path: Path
) -> None:
    """A claim row held by a transaction in flight (a sweep, a discard) leaves the pass None
    without a claim tried. Recorded as a refusal, the checkers would read it as a live pass past
    its lapse (fencing's budget check and lease-lapses did, under a sweep in a CI run)."""
    import psycopg

    async with durable_and_history(wd_store, tmp_path) as (durable, hist, path, schema):
        recorded = recording_durable(Recorder(durable, hist))
        await durable.checkpointer.claim("w", alive=timedelta(milliseconds=1), budget=LONG)
        await durable.arrive("w", "k", 1)
        async with await psycopg.AsyncConnection.connect(
            wd_store.extra["url"], options=f"-c search_path={schema}"
        ) as sweeper:
            await sweeper.execute("SELECT workflow FROM workflow_claim FOR UPDATE")  # held, as a sweep does
            taken = await recorded.take_and_claim(LONG, alive=LONG, budget=LONG)
            await sweeper.rollback()
        assert taken is not None and taken[1] is None
        hist.close()

    ops = _ops(path)
    assert [(f, outcome) for f, outcome, _ in ops] == [("take", "ok"), ("claim", "failed"), ("load", "failed")]
    assert ops[1][2]["workflow"] == "w" and "busy" in ops[1][2]["error"]


class _Silent:
    """A durable offering ``take_and_claim`` whose None pass does not say why (the protocol
    allows a busy row there too)."""

    def __init__(self, inner: PostgresDurable) -> None:
        self.inner = inner
        self.checkpointer = inner.checkpointer
        self.scheduler = inner.scheduler

    async def take_and_claim(self, visibility: timedelta, *, alive: timedelta, budget: timedelta) -> Any:
        return await self.inner.take_and_claim(visibility, alive=alive, budget=budget)


@pytest.mark.asyncio
@pytest.mark.wd_store("postgres")
async def test_a_store_that_does_not_say_why_gets_no_refusal_recorded(
    wd_store: StoreUnderTest[Any], tmp_path: Path
) -> None:
    async with durable_and_history(wd_store, tmp_path) as (durable, hist, path, _):
        recorded = recording_durable(Recorder(_Silent(durable), hist))
        assert isinstance(recorded, TakesAndClaims)
        await durable.checkpointer.claim("w", alive=LONG, budget=LONG)  # a live pass: a real refusal
        await durable.arrive("w", "k", 1)
        taken = await recorded.take_and_claim(LONG, alive=LONG, budget=LONG)
        assert taken is not None and taken[1] is None
        hist.close()

    ops = _ops(path)
    assert [(f, outcome) for f, outcome, _ in ops] == [("take", "ok"), ("claim", "failed"), ("load", "failed")]
    assert "does not say" in ops[1][2]["error"]
