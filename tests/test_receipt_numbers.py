"""Receipts that name one take, on the server stores whose receipt was once a time alone.

Postgres and the Redis sorted set hid a taken workflow until ``now + visibility`` and answered
only while that time was still there. Two takes of one workflow can set the very same time (a take
for 3u, a wakeup at u, a take for 2u; or a server clock stepped back), and then the first holder's
late answer acted on the second holder's delivery. The real clock makes an exact-microsecond
coincidence rare, so these tests make one: after the second take, the queued time is set to the
first take's, as such a coincidence would leave it. The take number in each receipt must then
keep the stale answer out. Each test also runs a scheduler whose answers compare the time alone
(the receipts before the numbers) and expects it to fail, so the tests can say no.

Run with ``--wd-store postgres`` and ``--wd-store redis-set``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from without_durability import Delivery
from without_durability.testing.harness import StoreUnderTest

Store = StoreUnderTest[Any]
LONG = timedelta(hours=1)
_ids = itertools.count()

pytestmark = pytest.mark.asyncio

ANSWERS = {"done": None, "later": timedelta(hours=2), "now": timedelta(0)}
PATHS = ("wake_at", "answer_and_take", "finish_many")


def _cases() -> list[Any]:
    out = []
    for path in PATHS:
        for answer in ANSWERS:
            if path == "finish_many" and answer != "done":
                continue
            out.append(pytest.param(path, answer, id=f"{path}-{answer}"))
    return out


async def _answer(sched: Any, path: str, d: Delivery, at: datetime | None) -> None:
    if path == "wake_at":
        await sched.wake_at(d, at)
    elif path == "answer_and_take":
        await sched.answer_and_take(d, at, LONG)
    else:
        await sched.finish_many([d])


# -- each store's white-box part: read the entry, make it due, set its time ----------------------


def _postgres(store: Store, *, time_only: bool) -> tuple[Any, Callable[..., Awaitable[Any]]]:
    from without_durability_postgres import PostgresScheduler
    from without_durability_postgres import scheduler as pg

    real = store.scheduler
    assert isinstance(real, PostgresScheduler)
    sched = real
    if time_only:

        class TimeOnly(PostgresScheduler):
            """The answers as they were before take numbers: the queued time alone."""

            WAKE_AT = pg.WAKE_AT.replace(" AND took = %(took)s", "")
            FINISH = pg.FINISH.replace(" AND took = %(took)s", "")
            FINISH_MANY = pg.FINISH_MANY.replace("\n   AND q.took = a.took", "")
            FINISH_AND_TAKE = pg.FINISH_AND_TAKE.replace(" AND took = %(took)s", "")
            WAKE_AT_AND_TAKE = pg.WAKE_AT_AND_TAKE.replace(" AND took = %(took)s", "")

        assert TimeOnly.FINISH_MANY != pg.FINISH_MANY and TimeOnly.FINISH != pg.FINISH
        sched = TimeOnly(real.pool, namespace=real.namespace)

    async def entry(workflow: str, *, due: bool = False, at: Any = None) -> Any:
        async with real.pool.connection() as conn:
            if due:
                await conn.execute(
                    "UPDATE workflow_queue SET visibility = now() - interval '1 second' WHERE workflow = %s",
                    (workflow,),
                )
            if at is not None:
                await conn.execute("UPDATE workflow_queue SET visibility = %s WHERE workflow = %s", (at, workflow))
            row = await (
                await conn.execute("SELECT visibility, took FROM workflow_queue WHERE workflow = %s", (workflow,))
            ).fetchone()
        return None if row is None else (row[0], int(row[1]))

    return sched, entry


def _redis_set(store: Store, *, time_only: bool) -> tuple[Any, Callable[..., Awaitable[Any]]]:
    from without_durability_redis import RedisSetScheduler
    from without_durability_redis._scripts import script_source

    real = store.scheduler
    assert isinstance(real, RedisSetScheduler)
    sched = real
    if time_only:
        took_checks = {
            "set_wake": " or redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[3]",
            "set_answer_take": " and redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[3]",
            "set_finish_many": " and redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[i + 2]",
        }
        overrides = {}
        for name, check in took_checks.items():
            source = script_source(name)
            assert check in source, f"{name} changed: the time-only variant no longer applies"
            overrides[name] = source.replace(check, "")

        class TimeOnly(RedisSetScheduler):
            """The answers as they were before take numbers: the score alone."""

            script_overrides = overrides

        sched = TimeOnly(real.client, namespace=real.namespace, prefix=real.prefix)

    async def entry(workflow: str, *, due: bool = False, at: Any = None) -> Any:
        client = real.client
        if due:
            await client.zadd(real.key, {workflow: 0})
        if at is not None:
            await client.zadd(real.key, {workflow: at})
        score = await client.zscore(real.key, workflow)
        took = await client.hget(real.took_key, workflow)
        return None if score is None else (int(score), int(took) if took is not None else None)

    return sched, entry


OPENERS = {"postgres": _postgres, "redis-set": _redis_set}


def _open(store: Store, *, time_only: bool = False) -> tuple[Any, Callable[..., Awaitable[Any]]]:
    return OPENERS[store.name](store, time_only=time_only)


def _time(d: Delivery) -> Any:
    receipt: Any = d.receipt
    return receipt.visible_at


async def _stale_answer_after_a_retake_at_the_same_time(store: Store, path: str, answer: str, *, time_only: bool) -> None:
    sched, entry = _open(store, time_only=time_only)
    workflow = f"receipt-{path}-{answer}-{next(_ids)}"
    await sched.schedule(workflow, await sched.now() - timedelta(seconds=1))
    first = await sched.take(LONG)
    assert first is not None and first.workflow == workflow
    await entry(workflow, due=True)  # a wakeup since the first take made it due again
    second = await sched.take(timedelta(minutes=30))
    assert second is not None and second.workflow == workflow, f"the re-take handed out {second!r}"
    held = await entry(workflow, at=_time(first))  # the second take's time coincides with the first's
    assert held is not None and held[1] != first.receipt.took, f"one take number for two takes: {held}"  # type: ignore[attr-defined]
    offset = ANSWERS[answer]
    at = None if offset is None else await sched.now() + offset
    await _answer(sched, path, first, at)
    after = await entry(workflow)
    assert after == held, (
        f"the first holder's late {answer!r} answer ({path}) acted on the second take's delivery: "
        f"queued {held} before, {after} after, though both takes hid {workflow!r} until the same time"
    )
    # the second holder's receipt, as the coincidence would have made it: its take set that time
    second = Delivery(workflow, dataclasses.replace(second.receipt, visible_at=_time(first)))  # type: ignore[type-var]
    await sched.wake_at(second, None)
    assert await entry(workflow) is None, "the current holder's answer did not act"


@pytest.mark.wd_store(["postgres", "redis-set"])
@pytest.mark.parametrize(("path", "answer"), _cases())
async def test_a_stale_answer_after_a_retake_that_set_the_same_time_changes_nothing(
    wd_store: Store, path: str, answer: str
) -> None:
    await _stale_answer_after_a_retake_at_the_same_time(wd_store, path, answer, time_only=False)


@pytest.mark.wd_store(["postgres", "redis-set"])
@pytest.mark.parametrize(("path", "answer"), _cases())
async def test_the_time_alone_as_a_receipt_fails_it(wd_store: Store, path: str, answer: str) -> None:
    with pytest.raises(AssertionError, match="acted on the second take's delivery"):
        await _stale_answer_after_a_retake_at_the_same_time(wd_store, path, answer, time_only=True)


@pytest.mark.wd_store(["postgres", "redis-set"])
async def test_take_many_numbers_each_delivery(wd_store: Store) -> None:
    sched, entry = _open(wd_store)
    names = [f"many-{i}-{next(_ids)}" for i in range(3)]
    past = await sched.now() - timedelta(seconds=1)
    for name in names:
        await sched.schedule(name, past)
    got = await sched.take_many(LONG, 3)
    assert sorted(d.workflow for d in got) == sorted(names)
    numbers = [d.receipt.took for d in got]  # type: ignore[attr-defined]
    assert len(set(numbers)) == 3, f"take_many gave one number to several deliveries: {numbers}"
    for d in got:
        assert (await entry(d.workflow))[1] == d.receipt.took  # type: ignore[attr-defined]


@pytest.mark.wd_store("redis-set")
async def test_a_cancel_and_a_finish_leave_no_take_number_behind(wd_store: Store) -> None:
    sched, _ = _open(wd_store)
    past = await sched.now() - timedelta(seconds=1)
    a, b = f"left-a-{next(_ids)}", f"left-b-{next(_ids)}"
    await sched.schedule(a, past)
    await sched.schedule(b, past)
    taken = [await sched.take(LONG), await sched.take(LONG)]
    assert all(d is not None for d in taken)
    await sched.cancel(a)
    await sched.wake_at(next(d for d in taken if d is not None and d.workflow == b), None)
    assert await sched.client.hlen(sched.took_key) == 0, "take numbers outlived their entries"


@pytest.mark.wd_store("postgres")
async def test_a_queue_table_from_before_take_numbers_is_upgraded_in_place(wd_store: Store) -> None:
    from without_durability_postgres import migrate

    sched, entry = _open(wd_store)
    workflow = f"upgraded-{next(_ids)}"
    async with sched.pool.connection() as conn:
        await conn.execute("ALTER TABLE workflow_queue DROP COLUMN took")  # what earlier releases made
        await conn.execute(
            "INSERT INTO workflow_queue (namespace, workflow, visibility) VALUES (%s, %s, now() - interval '1 second')",
            (sched.namespace, workflow),
        )
    await migrate(sched.pool)
    assert (await entry(workflow))[1] == 0, "the queued row did not get the column's default"
    got = await sched.take(LONG)
    assert got is not None and got.workflow == workflow and got.receipt.took > 0  # type: ignore[attr-defined]
    await sched.wake_at(got, None)
    assert await entry(workflow) is None, "an answer after the upgrade did not act"


@pytest.mark.wd_store(["postgres", "redis-set"])
@pytest.mark.parametrize(("path", "answer"), _cases())
async def test_a_wakeup_while_held_survives_the_holders_answer_on_every_path(
    wd_store: Store, path: str, answer: str
) -> None:
    """The receipt's time half: a wakeup moved the entry's time but left the take number as it
    was, so an answer checking the number alone would undo the wakeup. The conformance suite asks
    this of ``wake_at``; here of ``answer_and_take`` and ``finish_many`` too."""
    sched, entry = _open(wd_store)
    workflow = f"woken-{path}-{answer}-{next(_ids)}"
    await sched.schedule(workflow, await sched.now() - timedelta(seconds=1))
    held = await sched.take(LONG)
    assert held is not None and held.workflow == workflow
    await sched.schedule(workflow)  # a wakeup while held: due now
    offset = ANSWERS[answer]
    at = None if offset is None else await sched.now() + offset
    await _answer(sched, path, held, at)
    assert await entry(workflow) is not None, f"the holder's {answer!r} answer ({path}) removed the wakeup"
    again = await sched.take(LONG)
    assert again is not None and again.workflow == workflow, (
        f"the wakeup while held did not survive the holder's {answer!r} answer ({path}): took {again!r}"
    )
