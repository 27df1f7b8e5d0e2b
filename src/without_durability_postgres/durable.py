"""PostgresDurable: the transitions across the two stores, each as one commit sent in one round trip."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import psycopg

from without_durability._values import Delivery, Pass, Recorded
from without_durability.errors import InvalidInput, StoreError, StoreUnavailable
from without_durability.protocols import Durable, TakesAndClaims
from without_durability.rules import INBOX_PREFIX, check_lease, check_visibility

from ._boundary import Flight, Pool, one_flight
from .checkpointer import PostgresCheckpointer, PostgresEffect
from .scheduler import PostgresScheduler, _Receipt

# The load must be a statement of its own with a snapshot taken after the claim got its row: a
# pass whose claim expired may commit a record while this claim waits on that row's lock.
_READ_COMMITTED = "BEGIN ISOLATION LEVEL READ COMMITTED"

Connection = psycopg.AsyncConnection[Any]


class PostgresDurable:
    """``Durable[PostgresEffect]`` whose ``arrive``, ``deliver`` and ``discard`` each write both
    tables in one transaction, so no crash leaves a recorded-but-unqueued workflow, and a
    ``deliver`` that failed appended nothing (asking again cannot leave two messages). Each
    transaction goes out in pipeline mode, BEGIN to COMMIT in one network round trip; with
    ``notify=True`` the wakeup NOTIFY rides in the same flight, right behind the COMMIT.

    Both halves must share one pool (checked here): that is what lets one commit cover both.
    """

    def __init__(self, checkpointer: PostgresCheckpointer, scheduler: PostgresScheduler) -> None:
        if not isinstance(checkpointer, PostgresCheckpointer) or not isinstance(scheduler, PostgresScheduler):
            raise InvalidInput("PostgresDurable takes a PostgresCheckpointer and a PostgresScheduler")
        if checkpointer.pool is not scheduler.pool:
            raise InvalidInput(
                "PostgresDurable needs its checkpointer and scheduler on one pool, so each "
                "transition commits once; build both with the same AsyncConnectionPool "
                "(or use SplitDurable for two databases)"
            )
        self._checkpointer = checkpointer
        self._scheduler = scheduler

    @property
    def pool(self) -> Pool:
        """The pool both halves share."""
        return self._checkpointer.pool

    @property
    def checkpointer(self) -> PostgresCheckpointer:
        """The checkpointer half."""
        return self._checkpointer

    @property
    def scheduler(self) -> PostgresScheduler:
        """The scheduler half."""
        return self._scheduler

    async def arrive(self, workflow: str, key: str, value: object) -> Recorded:
        """See ``Durable.arrive``: supply and schedule now, one commit, one round trip."""
        cp = self._checkpointer
        cp._workflow(workflow)
        cp._key(workflow, key)
        encoded = cp._encode(workflow, key, value)
        supply = {"workflow": workflow, "key": key, "value": encoded}
        where = f"arriving at {workflow!r}/{key!r}"
        async with self._making_due(where, workflow, key) as conn:
            supplied = await conn.execute(cp.SUPPLY, supply)
            await self._scheduler._schedule_on(conn, workflow)  # queues; reads nothing back
        row = await supplied.fetchone()  # read after the commit: the pipeline sent it all at once
        assert row is not None  # an upsert with DO UPDATE always returns its row
        return cp._recorded(row)

    async def deliver(self, workflow: str, message: object) -> str:
        """See ``Durable.deliver``: append and schedule now, one commit, one round trip."""
        cp = self._checkpointer
        cp._workflow(workflow)
        encoded = cp._encode(workflow, INBOX_PREFIX, message)
        where = f"delivering to {workflow!r}"
        async with self._making_due(where, workflow, INBOX_PREFIX) as conn:
            appended = await conn.execute(cp.APPEND, {"workflow": workflow, "value": encoded})
            await self._scheduler._schedule_on(conn, workflow)
        row = await appended.fetchone()
        assert row is not None  # an INSERT ... SELECT of one drawn row returns it
        return str(row[0])

    async def discard(self, workflow: str) -> None:
        """See ``Durable.discard``: raise the fence, forget the records, cancel; one commit, one
        round trip (still three statements, each with its own snapshot)."""
        self._checkpointer._workflow(workflow)
        async with one_flight(self.pool, f"discarding {workflow!r}", workflow) as flight:
            await self._checkpointer._discard_on(flight.conn, workflow)  # these only queue statements
            await self._scheduler._cancel_on(flight.conn, workflow)

    async def take_and_claim(
        self, visibility: timedelta, *, alive: timedelta, budget: timedelta
    ) -> tuple[Delivery, Pass | None, dict[str, object]] | None:
        """See ``TakesAndClaims``: the take, the claim and the load in one READ COMMITTED
        transaction, committed once (one WAL flush instead of two). Two round trips when something
        is due: BEGIN and the take, then the claim, the load and COMMIT together; the statements
        are the scheduler's ``TAKE`` and the checkpointer's ``CLAIM`` and ``LOAD``, each its own
        statement as when called apart. Nothing due: the (empty) transaction commits, the second
        round trip."""
        check_visibility(visibility)
        check_lease("", alive, budget)
        sched, cp = self._scheduler, self._checkpointer
        where = f"taking from namespace {sched.namespace!r} and claiming"
        taken: tuple[Any, ...] | None = None
        claimed: psycopg.AsyncCursor[Any] | None = None
        loaded: psycopg.AsyncCursor[Any] | None = None
        async with one_flight(self.pool, where, begin=_READ_COMMITTED) as flight:
            conn = flight.conn
            take = {"namespace": sched.namespace, "visibility": visibility}
            taken = await (await conn.execute(sched.TAKE, take)).fetchone()  # the first round trip
            if taken is not None:
                workflow = str(taken[0])
                claim = {"workflow": workflow, "alive": alive, "budget": budget}
                claimed = await conn.execute(cp.CLAIM, claim)
                loaded = await conn.execute(cp.LOAD, {"workflow": workflow})
        if taken is None or claimed is None or loaded is None:
            return None
        delivery = Delivery(str(taken[0]), _Receipt(sched.namespace, taken[1]))
        token = await claimed.fetchone()
        if token is None:  # Contended: the take stands, answered by the caller
            return delivery, None, {}
        records = {str(k): cp.codec.decode(v) for k, v, _ in await loaded.fetchall()}
        return delivery, Pass(delivery.workflow, int(token[0])), records

    @asynccontextmanager
    async def _making_due(self, where: str, workflow: str, key: str) -> AsyncIterator[Connection]:
        """``one_flight`` for a transaction that makes ``workflow`` due now. With ``notify=True``
        the NOTIFY rides in the same flight, right behind the COMMIT, unless one is in flight
        already; then (or if it failed) one is sent after the commit from the background. The
        NOTIFY is claimed only once the connection is held and the COMMIT queued, so a caller
        waiting for a pooled connection holds up nobody else's notification."""
        notifier = self._scheduler.notifier
        if notifier is None:
            async with one_flight(self.pool, where, workflow, key) as flight:
                yield flight.conn
            return
        started: Flight | None = None
        refused = False  # the server refused the transaction: certainly nothing committed

        def claim() -> tuple[str, dict[str, str]] | None:  # with the connection held, COMMIT queued
            return notifier.statement() if notifier.claim() else None

        try:
            async with one_flight(self.pool, where, workflow, key, after=claim) as started:
                yield started.conn
        except (StoreError, InvalidInput) as exc:
            refused = not isinstance(exc, StoreUnavailable)  # unavailable: it may have committed
            raise
        finally:
            claimed = started is not None and started.after_queued
            notified = started is not None and started.after_ran
            committed = started is not None and started.committed
            notifier.settle(claimed, notified=notified, owed=not notified and (committed or not refused))


def _typecheck(d: PostgresDurable) -> None:  # pragma: no cover - mypy proves it meets the protocol
    x: Durable[PostgresEffect] = d
    y: TakesAndClaims = d
    del x, y
