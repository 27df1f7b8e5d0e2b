"""PostgresScheduler.answer_and_take: one statement that answers a delivery and takes the next, with
the guarantees of ``wake_at`` then ``take``, and the Worker using it. Run with ``--wd-store postgres``."""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from without_durability import AnswersAndTakes, Delivery, Run, Worker
from without_durability.errors import InvalidInput
from without_durability.testing.harness import StoreUnderTest
from without_durability_postgres import (
    PostgresCheckpointer,
    PostgresDurable,
    PostgresScheduler,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.wd_store("postgres")]

Store = StoreUnderTest[Any]
LONG = timedelta(hours=1)
_ids = itertools.count()


def scheduler(wd_store: Store) -> PostgresScheduler:
    """The store's own scheduler (a fresh schema per test), so a mutant swapped in is what runs."""
    sched = wd_store.scheduler
    assert isinstance(sched, PostgresScheduler)
    return sched


async def queued(sched: PostgresScheduler) -> dict[str, Any]:
    """Every row of the scheduler's namespace: workflow -> visibility."""
    async with sched.pool.connection() as conn:
        rows = await (
            await conn.execute(
                "SELECT workflow, visibility FROM workflow_queue WHERE namespace = %s",
                (sched.namespace,),
            )
        ).fetchall()
    return dict(rows)


async def test_its_take_half_is_take_with_only_the_two_conditions_added(wd_store: Store) -> None:
    added = " AND workflow <> %(workflow)s\n       AND (SELECT count(*) FROM answered) >= 0"
    take = PostgresScheduler.TAKE.split("WITH next AS (", 1)[1].replace("visibility <= now()", "visibility <= now()" + added)
    for chain in (PostgresScheduler.FINISH_AND_TAKE, PostgresScheduler.WAKE_AT_AND_TAKE):
        assert chain.split("), next AS (", 1)[1] == take, "the take half drifted from TAKE"


async def test_it_is_offered_as_the_optional_capability(wd_store: Store) -> None:
    assert isinstance(scheduler(wd_store), AnswersAndTakes)


async def test_a_sleep_answer_moves_the_delivery_and_never_hands_it_back(wd_store: Store) -> None:
    sched = scheduler(wd_store)
    await sched.schedule("sleeper")
    d = await sched.take(LONG)
    assert d is not None
    past = await sched.now() - timedelta(seconds=5)
    assert await sched.answer_and_take(d, past, LONG) is None, "it must not hand back its own workflow"
    assert (await queued(sched))["sleeper"] == past
    again = await sched.take(LONG)
    assert again is not None and again.workflow == "sleeper", "a due sleep answer is left for the next take"


async def test_a_delivery_from_elsewhere_is_refused_before_anything_is_written(wd_store: Store) -> None:
    sched = scheduler(wd_store)
    other = PostgresScheduler(sched.pool, namespace="elsewhere")
    await other.schedule("x")
    d = await other.take(LONG)
    assert d is not None
    with pytest.raises(InvalidInput, match="namespace"):
        await sched.answer_and_take(d, None, LONG)
    assert set(await queued(other)) == {"x"}


ANSWERS = ("finish", "wake", "finish-many", "finish-and-take", "wake-and-take")


@pytest.mark.parametrize("answer", ANSWERS)
async def test_an_answer_touches_its_own_row_only_when_others_share_its_receipt_instant(
    wd_store: Store, answer: str
) -> None:
    # a receipt is a visibility instant, and a schedule or a wake-up may name that same instant for
    # another workflow of the namespace, or the same workflow in another namespace: each answer must
    # pick its row by all three of namespace, workflow and receipt, and the chained take by namespace
    sched = scheduler(wd_store)
    other = PostgresScheduler(sched.pool, namespace="b")
    await sched.schedule("w")
    d = await sched.take(LONG)
    assert d is not None and d.workflow == "w"
    receipt = d.receipt.visible_at  # type: ignore[attr-defined]
    await other.schedule("w", receipt)  # the same workflow and instant in another namespace
    await sched.schedule("twin", receipt)  # another workflow of this namespace at the same instant
    past = await sched.now() - timedelta(seconds=1)
    await other.schedule("due-in-b", past - timedelta(seconds=1))  # due first, in the other namespace only
    await sched.schedule("both", past)  # due in both namespaces
    await other.schedule("both", past)
    kept_b = await queued(other)
    at = receipt + timedelta(hours=1)
    got: Delivery | None = None
    if answer == "finish":
        await sched.wake_at(d, None)
    elif answer == "wake":
        await sched.wake_at(d, at)
    elif answer == "finish-many":
        await sched.finish_many([d])
    else:
        got = await sched.answer_and_take(d, None if answer == "finish-and-take" else at, LONG)
        assert got is not None and got.workflow == "both", f"the chained take handed out {got!r}"
    assert await queued(other) == kept_b, "an answer in one namespace changed the other's queue"
    mine = await queued(sched)
    assert mine.get("twin") == receipt, "an answer moved another workflow sharing its receipt instant"
    assert mine.get("w") == (None if answer.startswith("finish") else at), f"the answer left {mine!r}"
    if got is None:
        assert mine.get("both") == past, "an answer alone took or moved a due workflow"


async def test_the_answer_waits_for_a_row_lock_before_the_take_locks_anything(wd_store: Store) -> None:
    """The lock a concurrent take can leave on a row it rechecked and skipped, held while that
    transaction locks the row this call would take: were the take to lock first, the two would
    deadlock (Postgres would fail one after deadlock_timeout). Answering first, nothing is held
    while the answer waits, so both go through."""
    sched = scheduler(wd_store)
    await sched.schedule("a", await sched.now() - timedelta(seconds=1))
    await sched.schedule("x")
    held = await sched.take(LONG)
    assert held is not None and held.workflow == "a"
    where = "SELECT 1 FROM workflow_queue WHERE namespace = %s AND workflow = %s FOR UPDATE"
    url, options = wd_store.extra["url"], f"-c search_path={wd_store.extra['schema']}"
    async with (
        await psycopg.AsyncConnection.connect(url, options=options) as other,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as watch,
    ):
        await other.execute("SET lock_timeout = '10s'")
        await other.execute(where, (sched.namespace, "a"))  # the other transaction's lock on "a"
        answering = asyncio.create_task(sched.answer_and_take(held, None, LONG))
        deadline = time.monotonic() + 10
        while True:  # until the answer is waiting for that lock
            assert time.monotonic() < deadline, "answer_and_take never waited for the lock on 'a'"
            row = await (
                await watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                    ("%answered%",),
                )
            ).fetchone()
            if row and row[0]:
                break
            await asyncio.sleep(0.01)
        await other.execute(where, (sched.namespace, "x"))  # must not wait on answer_and_take
        await other.commit()
    taken = await asyncio.wait_for(answering, 10)
    assert taken is not None and taken.workflow == "x", f"expected 'x' taken after the wait, got {taken!r}"
    assert set(await queued(sched)) == {"x"}, "the answer must have removed 'a'"


async def test_a_transaction_the_server_rolled_back_is_not_called_unreachable(wd_store: Store) -> None:
    from psycopg import errors as pg_errors

    from without_durability.errors import StoreUnavailable
    from without_durability_postgres._boundary import wrap

    for exc in (pg_errors.DeadlockDetected("deadlock detected"), pg_errors.SerializationFailure("x")):
        error = wrap(exc, wd_store.extra["pool"], "answering")
        assert not isinstance(error, StoreUnavailable), f"{type(exc).__name__} became {error!r}"
        assert type(exc).__name__ in str(error)


class Counting(PostgresScheduler):
    """Counts the calls a Worker makes, to see which path it takes."""

    calls: dict[str, int]

    async def take(self, visibility: timedelta) -> Delivery | None:
        self.calls["take"] += 1
        return await super().take(visibility)

    async def wake_at(self, delivery: Delivery, at: Any) -> None:
        self.calls["wake_at"] += 1
        await super().wake_at(delivery, at)

    async def answer_and_take(self, delivery: Delivery, at: Any, visibility: timedelta) -> Delivery | None:
        self.calls["answer_and_take"] += 1
        return await super().answer_and_take(delivery, at, visibility)


async def test_the_worker_sends_each_answer_with_the_next_take(wd_store: Store) -> None:
    pool = wd_store.extra["pool"]
    sched = Counting(pool, namespace=f"aat-worker-{next(_ids)}")
    sched.calls = {"take": 0, "wake_at": 0, "answer_and_take": 0}
    durable = PostgresDurable(PostgresCheckpointer(pool=pool), sched)
    names = [f"job-{i}" for i in range(8)]
    for n in names:
        await durable.arrive(n, "go", 1)
    finished: list[str] = []

    async def body(run: Run[Any]) -> object:
        finished.append(run.workflow)
        return None

    worker = Worker(
        durable, body, alive=LONG, budget=LONG, visibility=LONG, poll_interval=timedelta(seconds=5)
    )
    await worker.run(max_passes=len(names))
    assert sorted(finished) == names
    # The first pass takes with its claim (the durable's take_and_claim, no scheduler take); each
    # later take carries the previous answer; the last answer goes out on its own when run returns.
    assert sched.calls == {"take": 0, "answer_and_take": len(names) - 1, "wake_at": 1}, sched.calls
    assert await queued(sched) == {}, "every delivery must have been answered by the time run returns"
