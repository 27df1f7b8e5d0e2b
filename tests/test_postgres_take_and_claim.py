"""PostgresDurable.take_and_claim: the Worker's take after idling, its claim and its load, committed
together, with every guarantee of the three calls made apart.

Run with ``--wd-store postgres``.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import pq

from without_durability import Run, TakesAndClaims, Worker
from without_durability.errors import Contended, Fenced
from without_durability.testing.harness import StoreUnderTest
from without_durability_postgres import (
    PostgresCheckpointer,
    PostgresDurable,
    PostgresScheduler,
    PostgresWakeup,
)
from without_durability_postgres.durable import TAKE_AND_CLAIM, TAKE_CLAIMED_LOAD
from without_durability_postgres.kit import fresh_schema, server_waits, suite_durable

pytestmark = [pytest.mark.asyncio, pytest.mark.wd_store("postgres")]

LONG = timedelta(hours=1)


@asynccontextmanager
async def durable_in_schema(wd_store: StoreUnderTest[Any]) -> AsyncIterator[tuple[PostgresDurable, str]]:
    """A durable on a fresh schema, as the suite's own (owned takes in the fast-failover leg)."""
    async with (
        fresh_schema(wd_store.extra["url"], min_size=2, max_size=4) as (pool, schema),
        suite_durable(pool) as durable,
    ):
        yield durable, schema


async def test_nothing_due_is_none_and_leaves_no_transaction(wd_store: StoreUnderTest[Any]) -> None:
    async with durable_in_schema(wd_store) as (durable, _):
        assert isinstance(durable, TakesAndClaims)
        assert await durable.take_and_claim(LONG, alive=LONG, budget=LONG) is None
        async with durable.pool.connection() as conn:
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


async def test_takes_claims_and_loads_in_one_commit(wd_store: StoreUnderTest[Any]) -> None:
    async with durable_in_schema(wd_store) as (durable, _):
        await durable.arrive("w", "k", {"v": 1})
        taken = await durable.take_and_claim(LONG, alive=LONG, budget=LONG)
        assert taken is not None
        delivery, pass_, records = taken
        assert delivery.workflow == "w" and pass_ is not None and pass_.token == 1
        assert records == {"k": {"v": 1}}
        assert await durable.scheduler.take(LONG) is None, "the take did not hide the delivery"
        with pytest.raises(Contended):  # the claim committed: a second claim is refused
            await durable.checkpointer.claim("w", alive=LONG, budget=LONG)
        await durable.scheduler.wake_at(delivery, None)  # the receipt the take set is the real one
        assert await durable.scheduler.take(timedelta(seconds=1)) is None


@asynccontextmanager
async def claiming(
    wd_store: StoreUnderTest[Any], claims: str, *namespaces: str
) -> AsyncIterator[tuple[list[PostgresDurable], str]]:
    """One durable per namespace on one fresh schema and pool; ``owned``: opened with fast
    failover (a presence of their own, so take_and_claim runs TAKE_AND_CLAIM_OWNED whatever the
    leg), ``plain``: without it (TAKE_AND_CLAIM)."""
    async with fresh_schema(wd_store.extra["url"], min_size=2, max_size=4) as (pool, schema):
        if claims == "plain":
            yield [PostgresDurable(PostgresCheckpointer(pool=pool), PostgresScheduler(pool, namespace=ns))
                   for ns in namespaces], schema  # fmt: skip
            return
        async with PostgresWakeup(pool, presence=True) as presence:
            assert presence.owner is not None, "the presence lock was not taken: claims would be plain"
            yield (
                [
                    PostgresDurable(
                        PostgresCheckpointer(pool=pool, failover=presence),
                        PostgresScheduler(pool, namespace=ns, reap_dead=True),
                    )
                    for ns in namespaces
                ],
                schema,
            )


BOTH = pytest.mark.parametrize("claims", ["plain", "owned"])


@BOTH
async def test_a_take_hands_out_its_own_namespaces_rows_only(
    wd_store: StoreUnderTest[Any], claims: str
) -> None:
    """Namespaces share the queue table: a take must choose among its own namespace's rows (not
    pick another's first and then find nothing to take) and hide only its own row."""
    async with claiming(wd_store, claims, "left", "right") as ((left, right), _):
        await right.scheduler.schedule("a-right")  # due first, and first by name
        await left.scheduler.schedule("b-left")
        taken = await left.take_and_claim(LONG, alive=LONG, budget=LONG)
        assert taken is not None, "left's due row was not handed out: its take chose among right's rows"
        assert taken[0].workflow == "b-left" and taken[1] is not None, f"left took {taken[0].workflow!r}"
        assert await left.take_and_claim(LONG, alive=LONG, budget=LONG) is None, "right's row went to left"
        both = "in-both"  # one workflow id queued in both namespaces
        await left.scheduler.schedule(both)
        await right.scheduler.schedule(both)
        taken = await left.take_and_claim(LONG, alive=LONG, budget=LONG)
        assert taken is not None and taken[0].workflow == both
        first = await right.scheduler.take(LONG)
        assert first is not None and first.workflow == "a-right", "right's own row was not handed to right"
        got = await right.scheduler.take(LONG)
        assert got is not None and got.workflow == both, "left's take hid right's row of the same workflow"


@BOTH
async def test_a_take_hands_out_and_claims_one_workflow(wd_store: StoreUnderTest[Any], claims: str) -> None:
    """Each take hides and claims the one workflow it hands out; the next due one stays due and
    unclaimed for the next take."""
    async with claiming(wd_store, claims, "default") as ((durable,), _):
        await durable.scheduler.schedule("a")
        await durable.scheduler.schedule("b")
        first = await durable.take_and_claim(LONG, alive=LONG, budget=LONG)
        assert first is not None and first[0].workflow == "a" and first[1] is not None
        async with durable.pool.connection() as conn:
            claimed = [
                w for (w,) in await (await conn.execute("SELECT workflow FROM workflow_claim")).fetchall()
            ]
        assert claimed == ["a"], f"one take claimed {claimed}"
        second = await durable.take_and_claim(LONG, alive=LONG, budget=LONG)
        assert second is not None, "the second due workflow was hidden by the first take"
        assert second[0].workflow == "b" and second[1] is not None


@BOTH
async def test_a_queue_row_another_transaction_holds_is_skipped_not_waited_for(
    wd_store: StoreUnderTest[Any], claims: str
) -> None:
    """Concurrent takes never wait on each other: a row another take (or a discard) holds is
    skipped, and the next due row handed out at once; none is handed out twice."""
    async with claiming(wd_store, claims, "default") as ((durable,), schema):
        await durable.scheduler.schedule("a")
        await durable.scheduler.schedule("b")
        holder = await psycopg.AsyncConnection.connect(
            wd_store.extra["url"], options=f"-c search_path={schema}"
        )
        try:
            await holder.execute("SELECT 1 FROM workflow_queue WHERE workflow = 'a' FOR UPDATE")
            async with asyncio.timeout(5):  # a take waiting on the held row fails here
                taken = await durable.take_and_claim(LONG, alive=LONG, budget=LONG)
            assert taken is not None and taken[0].workflow == "b", "the take did not skip the held row"
            await holder.rollback()  # a is free again, before the next take looks
        finally:
            await holder.close()
        again = await durable.take_and_claim(LONG, alive=LONG, budget=LONG)
        assert again is not None and again[0].workflow == "a"


@BOTH
async def test_a_take_and_claims_liveness_is_cut_at_its_budget(wd_store: StoreUnderTest[Any], claims: str) -> None:
    """The claim a take makes lives no longer than its budget, however long its alive asks, on a
    first claim (the insert) and on a takeover (the update): once the budget is spent the
    workflow's next take claims it, even while the first holder's presence is alive."""
    short = timedelta(milliseconds=200)
    async with claiming(wd_store, claims, "default") as ((durable,), _):
        await durable.scheduler.schedule("w")
        first = await durable.take_and_claim(short, alive=LONG, budget=short)
        assert first is not None and first[1] is not None
        await asyncio.sleep(0.4)  # the visibility and the budget are spent; alive is an hour
        second = await durable.take_and_claim(short, alive=LONG, budget=short)
        assert second is not None, "the redelivered workflow was not handed out"
        assert second[1] is not None, "a first claim outlived its budget: alive, not budget, bounded it"
        assert second[1].token > first[1].token
        await asyncio.sleep(0.4)
        third = await durable.take_and_claim(LONG, alive=LONG, budget=LONG)
        assert third is not None and third[1] is not None, "a takeover's claim outlived its budget"


def _words(statement: str) -> str:
    return " ".join(statement.split())


async def test_its_halves_are_take_claim_and_load_as_written(wd_store: StoreUnderTest[Any]) -> None:
    """TAKE, CLAIM and LOAD are what the conformance suite judges; the joined statements must be
    them, word for word, apart from the glue joining them (which the tests below judge)."""
    joined = _words(TAKE_AND_CLAIM)
    take = _words(PostgresScheduler.TAKE).replace(") UPDATE", "), taken AS ( UPDATE", 1)
    assert joined.startswith(take + " ), free AS ("), "the take half drifted from TAKE"
    claim = _words(PostgresCheckpointer.CLAIM)
    head, rest = claim.split(" VALUES ( %(workflow)s, nextval('workflow_token_seq'), ", 1)
    values, conflict = rest.split(" ) ON CONFLICT ", 1)
    conflict = "ON CONFLICT " + conflict.replace("RETURNING token", "RETURNING held.workflow, held.token")
    insert = f"claimed AS ( {head} SELECT taken.workflow, nextval('workflow_token_seq'), {values} FROM taken "
    assert insert in joined, "CLAIM's insert drifted"
    assert f" {conflict} )" in joined, "CLAIM's takeover drifted"
    load = _words(PostgresCheckpointer.LOAD)
    assert load.replace("%(workflow)s", "current_setting('without_durability.claimed', true)") == _words(
        TAKE_CLAIMED_LOAD
    ), "the load drifted from LOAD"


async def test_a_lapsed_claim_is_taken_over_with_a_higher_token(wd_store: StoreUnderTest[Any]) -> None:
    async with durable_in_schema(wd_store) as (durable, _):
        old = await durable.checkpointer.claim("w", alive=timedelta(milliseconds=1), budget=LONG)
        await durable.arrive("w", "k", 1)
        await asyncio.sleep(0.05)  # the old pass has lapsed
        taken = await durable.take_and_claim(LONG, alive=LONG, budget=LONG)
        assert taken is not None
        delivery, pass_, records = taken
        assert delivery.workflow == "w" and pass_ is not None, "a lapsed claim must be taken over"
        assert pass_.token > old.token and records == {"k": 1}
        with pytest.raises(Fenced):
            await durable.checkpointer.record(old, "late", 1)


async def test_a_contended_claim_leaves_the_take_standing(wd_store: StoreUnderTest[Any]) -> None:
    async with durable_in_schema(wd_store) as (durable, _):
        held = await durable.checkpointer.claim("w", alive=LONG, budget=LONG)
        await durable.arrive("w", "k", 1)
        taken = await durable.take_and_claim_busy(LONG, alive=LONG, budget=LONG)
        assert taken is not None
        delivery, pass_, records, busy = taken
        assert delivery.workflow == "w" and pass_ is None and records == {}
        assert busy is False, "a live pass refused the claim: a refusal, not a busy row"
        assert await durable.scheduler.take(LONG) is None, "the take was rolled back with the claim"
        await durable.checkpointer.renew(held)  # the holder keeps its claim: token unchanged


async def test_a_busy_claim_row_is_contended_at_once_and_a_discard_does_not_deadlock(
    wd_store: StoreUnderTest[Any],
) -> None:
    """A discard locks the claim row, then deletes the queue row; a take that held the queue row
    while waiting for the claim row would deadlock with it. The claim row busy: no pass at once,
    and said to be for a busy row, since the lapsed claim would not have refused it."""
    async with durable_in_schema(wd_store) as (durable, schema):
        await durable.checkpointer.claim("w", alive=timedelta(milliseconds=1), budget=LONG)
        await asyncio.sleep(0.01)  # that claim has lapsed: a claim that waited would win
        await durable.arrive("w", "k", 1)
        discard = await psycopg.AsyncConnection.connect(
            wd_store.extra["url"], options=f"-c search_path={schema}"
        )
        try:
            await discard.execute("UPDATE workflow_claim SET token = token + 1")  # the fence, held
            async with asyncio.timeout(5):
                taken = await durable.take_and_claim_busy(LONG, alive=LONG, budget=LONG)
            assert taken is not None
            delivery, pass_, records, busy = taken
            assert delivery.workflow == "w" and pass_ is None and records == {}
            assert busy is True, "no claim was tried (the row was held, its pass lapsed): not a refusal"
            async with asyncio.timeout(5):  # the take committed: nothing holds the queue row now
                await discard.execute("DELETE FROM workflow_queue WHERE workflow = 'w'")
            await discard.commit()
        finally:
            await discard.close()


async def test_the_claimed_workflow_is_loaded_not_another(wd_store: StoreUnderTest[Any]) -> None:
    async with durable_in_schema(wd_store) as (durable, _):
        await durable.arrive("a", "k", "a's")
        await durable.checkpointer.supply("b", "k", "b's")  # recorded, not queued
        first = await durable.take_and_claim(LONG, alive=LONG, budget=LONG)
        assert first is not None and first[2] == {"k": "a's"}
        assert await durable.take_and_claim(LONG, alive=LONG, budget=LONG) is None
        await durable.scheduler.schedule("b")
        second = await durable.take_and_claim(LONG, alive=LONG, budget=LONG)
        assert second is not None and second[0].workflow == "b" and second[2] == {"k": "b's"}


async def test_a_variant_scheduler_gets_the_three_calls(wd_store: StoreUnderTest[Any]) -> None:
    """Halves running other statements than the ones joined are not bypassed."""

    class Never(PostgresScheduler):
        TAKE = PostgresScheduler.TAKE.replace("visibility <= now()", "false")

    async with fresh_schema(wd_store.extra["url"], min_size=1, max_size=2) as (pool, _):
        durable = PostgresDurable(PostgresCheckpointer(pool=pool), Never(pool))
        await durable.arrive("w", "k", 1)
        assert await durable.take_and_claim(LONG, alive=LONG, budget=LONG) is None


async def test_one_round_trip_whether_or_not_anything_is_due(wd_store: StoreUnderTest[Any]) -> None:
    async with fresh_schema(wd_store.extra["url"], min_size=1, max_size=1) as (pool, _):
        durable = PostgresDurable(PostgresCheckpointer(pool=pool), PostgresScheduler(pool))
        for i in range(7):  # psycopg prepares a statement on its sixth use: both shapes counted
            assert await round_trips(pool, lambda: durable.take_and_claim(LONG, alive=LONG, budget=LONG)) == 1
            await durable.arrive(f"w{i}", "k", i)
            assert await round_trips(pool, lambda: durable.take_and_claim(LONG, alive=LONG, budget=LONG)) == 1


async def round_trips(pool: Any, operation: Callable[[], Awaitable[object]]) -> int:
    """How many times the pool's only connection waited for the server while ``operation`` ran
    (libpq's protocol trace: each switch from the client sending to the server answering)."""
    with tempfile.TemporaryFile("w+") as out:
        async with pool.connection() as conn:
            conn.pgconn.trace(out.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            await operation()
        finally:
            async with pool.connection() as conn:
                conn.pgconn.untrace()
        out.seek(0)
        return server_waits(out.read())


async def test_worker_answers_a_contended_delivery_later(wd_store: StoreUnderTest[Any]) -> None:
    async with durable_in_schema(wd_store) as (durable, _):
        ran: list[str] = []

        async def body(run: Run[Any]) -> object:
            ran.append(run.workflow)
            return None

        await durable.checkpointer.claim("w", alive=LONG, budget=LONG)
        await durable.arrive("w", "k", 1)
        worker = Worker(durable, body, alive=LONG, budget=LONG, visibility=LONG,
                        poll_interval=timedelta(milliseconds=10), retry_contended=LONG)
        assert await worker.run_once() is True
        assert ran == [] and worker.passes == 1
        async with durable.pool.connection() as conn:
            row = await (await conn.execute("SELECT visibility > now() + interval '50 minutes' FROM workflow_queue")).fetchone()
        assert row == (True,), "the contended delivery was not answered for retry_contended later"
