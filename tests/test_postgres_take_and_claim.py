"""PostgresDurable.take_and_claim: the Worker's take after idling, its claim and its load, committed
together, with every guarantee of the three calls made apart.

Run with ``--wd-store postgres``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from without_durability import Run, TakesAndClaims, Worker
from without_durability.errors import Contended
from without_durability.testing.harness import StoreUnderTest
from without_durability_postgres import PostgresCheckpointer, PostgresDurable, PostgresScheduler
from without_durability_postgres.kit import fresh_schema

pytestmark = [pytest.mark.asyncio, pytest.mark.wd_store("postgres")]

LONG = timedelta(hours=1)


@asynccontextmanager
async def durable_in_schema(wd_store: StoreUnderTest[Any]) -> AsyncIterator[tuple[PostgresDurable, str]]:
    async with fresh_schema(wd_store.extra["url"], min_size=2, max_size=4) as (pool, schema):
        yield PostgresDurable(PostgresCheckpointer(pool=pool), PostgresScheduler(pool)), schema


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


async def test_a_contended_claim_leaves_the_take_standing(wd_store: StoreUnderTest[Any]) -> None:
    async with durable_in_schema(wd_store) as (durable, _):
        held = await durable.checkpointer.claim("w", alive=LONG, budget=LONG)
        await durable.arrive("w", "k", 1)
        taken = await durable.take_and_claim(LONG, alive=LONG, budget=LONG)
        assert taken is not None
        delivery, pass_, records = taken
        assert delivery.workflow == "w" and pass_ is None and records == {}
        assert await durable.scheduler.take(LONG) is None, "the take was rolled back with the claim"
        await durable.checkpointer.renew(held)  # the holder keeps its claim: token unchanged


async def test_load_sees_a_record_committed_while_the_claim_waited(wd_store: StoreUnderTest[Any]) -> None:
    """A pass past its budget writes a record (holding its claim row) just as a new claim arrives:
    the claim waits for that row, then wins; the load must see the record committed meanwhile."""
    async with durable_in_schema(wd_store) as (durable, schema):
        await durable.checkpointer.claim("w", alive=LONG, budget=LONG)
        await durable.arrive("w", "k", 1)
        old = await psycopg.AsyncConnection.connect(
            wd_store.extra["url"], options=f"-c search_path={schema}"
        )
        try:
            # the old pass: its fence lapses and its record is written, not yet committed
            await old.execute("UPDATE workflow_claim SET held_until = now(), alive_until = now()")
            await old.execute("""INSERT INTO workflow_checkpoint (workflow, key, value) VALUES ('w', 'late', '2')""")
            task = asyncio.create_task(durable.take_and_claim(LONG, alive=LONG, budget=LONG))
            for _ in range(500):  # until the claim waits on the old pass's row lock
                async with durable.pool.connection() as conn:
                    row = await (
                        await conn.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                            "AND query LIKE '%%workflow_claim%%'"
                        )
                    ).fetchone()
                if row is not None and row[0] > 0:
                    break
                await asyncio.sleep(0.01)
            else:
                pytest.fail("the claim never waited on the old pass's row")
            await old.commit()
            taken = await task
        finally:
            await old.close()
        assert taken is not None
        _, pass_, records = taken
        assert pass_ is not None and pass_.token == 2
        assert records == {"k": 1, "late": 2}, "the load missed a record committed before the claim won"


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
