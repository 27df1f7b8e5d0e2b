"""PostgresDurable's transitions travel in one network flight (pipeline mode) and lose nothing for it:
a failure anywhere still rolls the whole transaction back and surfaces as before, and the wakeup
NOTIFY goes out on the committing connection, as the transaction's last statement, still coalesced,
and a NOTIFY that fails never fails the write.

The round trips are counted from libpq's own protocol trace of the one pooled connection: every
switch from the client sending to the server answering is one wait for the network.

Run with ``--wd-store postgres``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import pq
from psycopg_pool import AsyncConnectionPool

from without_durability.errors import InvalidValue, StoreError
from without_durability.testing.harness import StoreUnderTest
from without_durability_postgres import PostgresCheckpointer, PostgresDurable, PostgresScheduler
from without_durability_postgres.kit import fresh_schema, server_waits

pytestmark = [pytest.mark.asyncio, pytest.mark.wd_store("postgres")]

Store = StoreUnderTest[Any]
Pool = AsyncConnectionPool[Any]


@asynccontextmanager
async def one_connection(wd_store: Store) -> AsyncIterator[tuple[Pool, str]]:
    """A fresh schema behind a pool of exactly one connection, so every call uses the one traced."""
    async with fresh_schema(wd_store.extra["url"], min_size=1, max_size=1) as (pool, schema):
        yield pool, schema


class Trace:
    """libpq's protocol trace of the pool's only connection, read back between operations."""

    def __init__(self, pool: Pool, folder: Path) -> None:
        self.pool = pool
        self.folder = folder
        self.n = 0
        self.texts: list[str] = []
        """Each traced operation's protocol trace, in order."""

    async def flights(self, operation: Callable[[], Awaitable[object]]) -> int:
        """How many times the client waited for the server while ``operation`` ran."""
        self.n += 1
        path = self.folder / f"trace-{self.n}.txt"
        with path.open("w") as out:
            async with self.pool.connection() as conn:
                conn.pgconn.trace(out.fileno())
                conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            try:
                await operation()
            finally:
                async with self.pool.connection() as conn:
                    conn.pgconn.untrace()  # flushes what libpq buffered
        self.texts.append(path.read_text())
        return server_waits(self.texts[-1])


def durable_on(pool: Pool, schema: str, *, notify: bool = False, scheduler: type[PostgresScheduler] =
               PostgresScheduler) -> PostgresDurable:
    return PostgresDurable(PostgresCheckpointer(pool=pool), scheduler(pool, namespace=schema, notify=notify))


async def test_arrive_deliver_and_discard_each_wait_for_one_round_trip(wd_store: Store, tmp_path: Path) -> None:
    async with one_connection(wd_store) as (pool, schema):
        durable = durable_on(pool, schema)
        trace = Trace(pool, tmp_path)
        await durable.arrive("warm-up", "go", 0)  # the first use of each statement prepares nothing,
        for i in range(6):  # but the sixth is prepared by psycopg: both shapes are counted below
            assert await trace.flights(lambda i=i: durable.arrive(f"wf-{i % 2}", "go", i)) == 1
            assert await trace.flights(lambda i=i: durable.deliver(f"wf-{i % 2}", {"n": i})) == 1
        assert await trace.flights(lambda: durable.discard("wf-0")) == 1
        # and the results are the ones the statements returned
        assert (await durable.arrive("wf-1", "go", "other")).won is False
        assert await durable.checkpointer.load("wf-0") == {}
        loaded = await durable.checkpointer.load("wf-1")
        assert loaded["go"] == 1 and [v for k, v in loaded.items() if k != "go"] == [{"n": 1}, {"n": 3}, {"n": 5}]


async def test_with_notify_the_notify_rides_inside_the_transaction_in_the_same_flight(
    wd_store: Store, tmp_path: Path
) -> None:
    async with one_connection(wd_store) as (pool, schema):
        durable = durable_on(pool, schema, notify=True)
        notifier = durable.scheduler.notifier
        assert notifier is not None
        trace = Trace(pool, tmp_path)
        assert await trace.flights(lambda: durable.arrive("wf", "go", 1)) == 1
        assert notifier.sent == 1, "arrive returned before its NOTIFY was sent"
        assert await trace.flights(lambda: durable.deliver("wf", "hello")) == 1
        assert notifier.sent == 2
        assert notifier._task is None, "a background task sent what the committing flight should have"
        for text in trace.texts:
            lines = text.splitlines()
            sent_commit = next(i for i, x in enumerate(lines) if x.startswith("F") and '"COMMIT"' in x)
            sent_notify = next(i for i, x in enumerate(lines) if x.startswith("F") and "pg_notify" in x)
            done_commit = next(i for i, x in enumerate(lines) if x.startswith("B") and '"COMMIT"' in x)
            notified = next(i for i, x in enumerate(lines) if x.startswith("B") and '"pg_notify"' in x)
            assert sent_notify < sent_commit and notified < done_commit, "the NOTIFY was not inside the transaction"


async def test_a_notify_that_fails_does_not_fail_the_arrive_which_is_sent_again_without_it(
    wd_store: Store, tmp_path: Path
) -> None:
    async with one_connection(wd_store) as (pool, schema):
        # pg_notify refuses a payload of 8000 bytes or more: the namespace is the payload
        durable = durable_on(pool, schema, notify=True)
        notifier = durable.scheduler.notifier
        assert notifier is not None
        notifier.namespace = "n" * 9000
        trace = Trace(pool, tmp_path)
        won: list[bool] = []

        async def arrive() -> None:
            won.append((await durable.arrive("wf", "go", 1)).won)

        # the refused flight, the ROLLBACK that closes it, the flight sent again
        assert await trace.flights(arrive) == 3, "the refused flight was not sent once more without its NOTIFY"
        assert won == [True]
        sent = [x for x in trace.texts[0].splitlines() if x.startswith("F") and "pg_notify" in x]
        assert len(sent) == 1, f"the second flight carried the NOTIFY again: {sent}"
        assert await durable.checkpointer.load("wf") == {"go": 1}
        assert await durable.scheduler.take(timedelta(seconds=60)) is not None
        assert notifier.sent == 0 and notifier._task is not None  # handed to the background
        await notifier.flush()  # which fails the same way, quietly
        assert notifier.sent == 0 and not notifier._busy


class FailingSchedule(PostgresScheduler):
    """SCHEDULE replaced by a statement that fails at the server, after SUPPLY/APPEND succeeded."""

    SCHEDULE = "SELECT 1 / 0 FROM (SELECT %(namespace)s::text, %(workflow)s::text, %(at)s::timestamptz) AS p"


class NotJsonForInts:
    """A codec the construction checks accept (it round-trips) but whose encodings of 7 and 8
    the server refuses as jsonb."""

    renders_json = True

    def encode(self, value: object) -> str:
        return f"{{not json {value}" if value in (7, 8) and type(value) is int else json.dumps(value)

    def decode(self, encoded: str) -> object:
        if encoded.startswith("{not json "):
            return int(encoded.removeprefix("{not json "))
        return json.loads(encoded)


async def backend_pid(pool: Pool) -> int:
    async with pool.connection() as conn:
        return conn.info.backend_pid


def no_driver_warnings(caplog: pytest.LogCaptureFixture) -> None:
    noisy = [r for r in caplog.records if r.name.startswith("psycopg") and r.levelno >= logging.WARNING]
    assert not noisy, f"the driver warned about a connection left dirty: {[r.getMessage() for r in noisy]}"


async def test_a_statement_failing_after_the_first_rolls_back_the_whole_transaction(
    wd_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with one_connection(wd_store) as (pool, schema):
        broken = durable_on(pool, schema, notify=True, scheduler=FailingSchedule)
        good = durable_on(pool, schema)
        backend = await backend_pid(pool)
        for attempt in (lambda: broken.arrive("wf", "go", 1), lambda: broken.deliver("wf", "hello")):
            with pytest.raises(StoreError) as caught:
                await attempt()
            assert isinstance(caught.value.__cause__, psycopg.errors.DivisionByZero), caught.value.__cause__
            assert await good.checkpointer.load("wf") == {}, "the supply/append committed without its schedule"
            assert await good.scheduler.take(timedelta(seconds=60)) is None
        assert broken.scheduler.notifier is not None and broken.scheduler.notifier.sent == 0
        # the one connection was rolled back and kept (not dropped), and the next transition commits
        assert await backend_pid(pool) == backend
        assert (await good.arrive("wf", "go", 2)).won is True
        assert await good.checkpointer.load("wf") == {"go": 2}
    no_driver_warnings(caplog)


async def test_a_value_the_server_refuses_is_invalid_value_and_nothing_is_queued(
    wd_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with one_connection(wd_store) as (pool, schema):
        scheduler = PostgresScheduler(pool, namespace=schema)
        odd = PostgresDurable(PostgresCheckpointer(pool=pool, codec=NotJsonForInts()), scheduler)
        with pytest.raises(InvalidValue) as caught:
            await odd.arrive("wf", "go", 7)
        assert "'wf'" in str(caught.value) and "'go'" in str(caught.value)
        assert isinstance(caught.value.__cause__, psycopg.errors.InvalidTextRepresentation)
        with pytest.raises(InvalidValue):
            await odd.deliver("wf", 8)
        assert await scheduler.take(timedelta(seconds=60)) is None, "a refused arrive still queued its workflow"
        assert await odd.checkpointer.load("wf") == {}
        assert (await odd.arrive("wf", "go", "fine")).won is True  # and the connection still works
    no_driver_warnings(caplog)


async def test_a_commit_while_a_notify_is_in_flight_is_owed_one_after_it(wd_store: Store) -> None:
    async with one_connection(wd_store) as (pool, schema):
        notifier = PostgresScheduler(pool, namespace=schema, notify=True).notifier
        assert notifier is not None
        assert notifier.claim() is True  # A's flight carries the NOTIFY
        assert notifier.claim() is False  # B's flight, meanwhile, does not
        notifier.settle(False, notified=False, owed=True)  # B committed: one is owed after A's
        assert notifier._task is None, "B's NOTIFY went out while A's was in flight"
        notifier.settle(True, notified=True, owed=False)  # A's flight is back
        assert notifier.sent == 1
        await notifier.flush()
        assert notifier.sent == 2, "B's commit was never followed by a NOTIFY"


async def test_concurrent_arrives_coalesce_their_notifies_and_leave_none_owed(wd_store: Store) -> None:
    async with fresh_schema(wd_store.extra["url"], min_size=2, max_size=2) as (pool, schema):
        durable = durable_on(pool, schema, notify=True)
        notifier = durable.scheduler.notifier
        assert notifier is not None
        await asyncio.gather(*(durable.arrive(f"wf-{i}", "go", i) for i in range(6)))
        await notifier.flush()
        assert 1 <= notifier.sent <= 6 and not notifier._busy and not notifier._pending


async def test_a_refused_arrive_owes_no_notify(wd_store: Store, tmp_path: Path) -> None:
    async with one_connection(wd_store) as (pool, schema):
        broken = durable_on(pool, schema, notify=True, scheduler=FailingSchedule)
        notifier = broken.scheduler.notifier
        assert notifier is not None
        trace = Trace(pool, tmp_path)

        async def refused() -> None:
            with pytest.raises(StoreError) as caught:
                await broken.arrive("wf", "go", 1)
            assert isinstance(caught.value.__cause__, psycopg.errors.DivisionByZero)

        # carrying the NOTIFY, the refusal could be the NOTIFY's: sent once more without it, and
        # refused again for its own reason
        assert await trace.flights(refused) == 4  # each refused flight is closed by a ROLLBACK
        assert notifier.sent == 0 and notifier._task is None and not notifier._busy
        # with a NOTIFY in flight elsewhere this one carried none: one flight, no second attempt
        assert notifier.claim() is True
        assert await trace.flights(refused) == 2
        notifier.settle(True, notified=True, owed=False)
        assert notifier._task is None and not notifier._busy


async def test_the_flight_begins_as_the_pool_is_configured_and_hands_the_connection_back_as_it_came(
    wd_store: Store, tmp_path: Path
) -> None:
    async def serializable(conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.set_isolation_level(psycopg.IsolationLevel.SERIALIZABLE)

    async with one_connection(wd_store) as (_, schema):
        pool: Pool = AsyncConnectionPool(
            wd_store.extra["url"], min_size=1, max_size=1, open=False, configure=serializable,
            kwargs={"options": f"-c search_path={schema}", "autocommit": True},
        )
        await pool.open(wait=True, timeout=10)
        async with pool:
            durable = durable_on(pool, schema)
            trace = Trace(pool, tmp_path)
            assert await trace.flights(lambda: durable.arrive("wf", "go", 1)) == 1
            assert '"BEGIN ISOLATION LEVEL SERIALIZABLE"' in trace.texts[0]
            async with pool.connection() as conn:
                assert conn.autocommit is True and conn.info.transaction_status == pq.TransactionStatus.IDLE
            assert await durable.checkpointer.load("wf") == {"go": 1}
