"""A worker's identity, where a store has one, reused by two live processes (issue #45): a
restarted process that comes back with its predecessor's name while the predecessor still runs
(stalled, or draining). What each store uses as an identity is in docs/reference/guarantees.md:
Postgres's presence id (fast failover) and the Redis stream scheduler's consumer name; no other
store has one. Neither process may take the other's live delivery or claim over by it.

Run with ``--wd-store redis-stream`` and ``--wd-store postgres``."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest

from without_durability.errors import Contended
from without_durability.testing.harness import StoreUnderTest

pytestmark = pytest.mark.asyncio

LONG = timedelta(hours=1)
SHORT = timedelta(milliseconds=200)


@pytest.mark.wd_store("redis-stream")
@pytest.mark.parametrize("answer", ["done", "retry-now", "retry-later"])
async def test_a_stream_consumer_name_shared_by_two_processes_decides_nothing(
    wd_store: StoreUnderTest[Any], answer: str
) -> None:
    """Two schedulers with one consumer name (a restart that kept its name while the old process
    lives on): the old one's delivery runs out and the new one takes the workflow again. The old
    one's late answer, in the same consumer's name, changes nothing; the new one's still acts."""
    pytest.importorskip("redis")
    from without_durability_redis import RedisStreamScheduler

    old = wd_store.scheduler
    assert isinstance(old, RedisStreamScheduler)
    new = RedisStreamScheduler(old.client, namespace=old.namespace, prefix=old.prefix, consumer=old.consumer)
    await old.schedule("twin")
    first = await old.take(SHORT)
    assert first is not None and first.workflow == "twin"
    deadline = time.monotonic() + 10
    while (second := await new.take(LONG)) is None:  # the old delivery runs out
        assert time.monotonic() < deadline, "the unanswered delivery never came back"
        await asyncio.sleep(0.02)
    assert second.workflow == "twin" and second.receipt != first.receipt
    now = await old.now()
    at = {"done": None, "retry-now": now, "retry-later": now + timedelta(milliseconds=50)}[answer]
    await old.wake_at(first, at)  # stale: the same consumer name, a superseded receipt
    await asyncio.sleep(0.1)
    assert await old.take(LONG) is None, (
        f"the old process's stale {answer} answer, in the shared consumer name, made the held workflow takeable"
    )
    await new.wake_at(second, now)  # the current holder's answer acts
    again = await old.take(LONG)
    assert again is not None and again.workflow == "twin", "the current holder's answer was lost"


@pytest.mark.wd_store("postgres")
async def test_a_presence_id_held_by_a_live_process_is_never_taken_by_another(
    wd_store: StoreUnderTest[Any],
) -> None:
    """Two fast-failover workers given the same presence id (a restart that kept it while the old
    process still holds its session, stalled or draining): the second cannot take the held lock,
    so it draws another id; the first's live claim is not taken over by the second."""
    pytest.importorskip("psycopg")
    from without_durability_postgres import PostgresCheckpointer, PostgresWakeup

    pool = wd_store.extra["pool"]
    async with PostgresWakeup(pool, presence=True) as first:
        assert first.owner is not None
        second = PostgresWakeup(pool, presence=True)
        second._owner_id = first.owner  # the predecessor's id, as a restart reusing it would ask for
        async with second:
            assert second.owner is not None and second.owner != first.owner, (
                f"two live processes share presence id {first.owner}"
            )
            held = await PostgresCheckpointer(pool, failover=first).claim("twin-pg", alive=LONG, budget=LONG)
            with pytest.raises(Contended):
                await PostgresCheckpointer(pool, failover=second).claim("twin-pg", alive=LONG, budget=LONG)
            assert held.token > 0
