"""PostgresScheduler's batching option (``take_many``, ``finish_many``): the same guarantees as one
take and one answer per delivery. Run with ``--wd-store postgres``."""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta
from typing import Any

import pytest

from without_durability.testing.harness import StoreUnderTest
from without_durability_postgres import PostgresScheduler
from without_durability_postgres.kit import fresh_schema

pytestmark = [pytest.mark.asyncio, pytest.mark.wd_store("postgres")]

Store = StoreUnderTest[Any]
LONG = timedelta(hours=1)
_ids = itertools.count()


async def test_concurrent_take_many_hand_out_every_workflow_exactly_once(wd_store: Store) -> None:
    async with fresh_schema(wd_store.extra["url"], min_size=4, max_size=4) as (pool, _):
        sched = PostgresScheduler(pool, namespace="batch")
        names = [f"b-{i:03d}" for i in range(60)]
        for n in names:
            await sched.schedule(n)
        got: list[str] = []

        async def taker() -> None:
            while batch := await sched.take_many(LONG, 7):
                got.extend(d.workflow for d in batch)

        await asyncio.gather(*(taker() for _ in range(4)))
        assert sorted(got) == names, f"expected each of 60 once, got {len(got)} ({len(set(got))} distinct)"


async def test_finish_many_removes_only_deliveries_still_current(wd_store: Store) -> None:
    sched = PostgresScheduler(wd_store.extra["pool"], namespace=f"fm-{next(_ids)}")
    for n in ("done", "woken", "cancelled"):
        await sched.schedule(n)
    batch = await sched.take_many(LONG, 10)
    assert sorted(d.workflow for d in batch) == ["cancelled", "done", "woken"]
    await sched.schedule("woken")  # a wakeup since the take: it stands
    await sched.cancel("cancelled")  # cancelled since: not reinstated
    await sched.finish_many(batch)
    left = await sched.take_many(LONG, 10)
    assert [d.workflow for d in left] == ["woken"], f"expected only the woken one queued, got {left!r}"


async def test_take_many_hands_out_only_what_is_due(wd_store: Store) -> None:
    sched = PostgresScheduler(wd_store.extra["pool"], namespace=f"due-{next(_ids)}")
    now = await sched.now()
    await sched.schedule("later", now + timedelta(hours=1))
    await sched.schedule("due", now - timedelta(seconds=1))
    got = await sched.take_many(LONG, 10)
    assert [d.workflow for d in got] == ["due"], f"take_many handed out {got!r}"


async def test_take_many_steps_over_a_locked_row_instead_of_waiting(wd_store: Store) -> None:
    pool = wd_store.extra["pool"]
    sched = PostgresScheduler(pool, namespace=f"lock-{next(_ids)}")
    now = await sched.now()
    await sched.schedule("locked", now - timedelta(seconds=2))
    await sched.schedule("free", now - timedelta(seconds=1))
    async with pool.connection() as holder:  # a taker holding one row: the others must go on
        await holder.execute(
            "SELECT 1 FROM workflow_queue WHERE namespace = %s AND workflow = %s FOR UPDATE",
            (sched.namespace, "locked"),
        )
        got = await asyncio.wait_for(sched.take_many(LONG, 10), 5)
        assert [d.workflow for d in got] == ["free"], f"take_many handed out {got!r}"
