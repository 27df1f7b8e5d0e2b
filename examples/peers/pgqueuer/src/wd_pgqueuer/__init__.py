"""``PgqScheduler``: the PgQueuer job queue (https://pgqueuer.readthedocs.io) as without-durability's
``Scheduler``, through PgQueuer's own ``Queries`` and its query builder on the pool the kit opened,
so that wd-chaos judges PgQueuer's semantics, not a queue of ours.

A workflow is a PgQueuer job of entrypoint ``namespace`` whose payload is the workflow id, with
``dedupe_key`` ``namespace:workflow``: PgQueuer's unique index on ``dedupe_key`` over ``queued`` and
``picked`` rows allows one live job per workflow. ``take`` is ``Queries.dequeue`` with the take's
visibility as the entrypoint's ``retry_after`` (PgQueuer's stalled-job reclaim: a ``picked`` job
whose heartbeat is older than that is handed out again), so a reclaim is PgQueuer's own SQL. The
README lists where PgQueuer's semantics differ from the protocol and how each is mapped; the
kit's own SQL on PgQueuer's table is marked ``MAPPING:`` below.
"""

from __future__ import annotations

import importlib.metadata
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from pgqueuer import db, errors, qb
from pgqueuer.queries import EntrypointExecutionParameter, Queries
from psycopg_pool import AsyncConnectionPool

from without_durability import Delivery, InvalidInput, InvalidWorkflowId
from without_durability.rules import check_time, check_visibility, check_workflow
from without_durability_postgres.errors import boundary

PGQUEUER_VERSION = importlib.metadata.version("pgqueuer")
"""The PgQueuer release imported (the slow lane runs the kit on two: the README says which)."""

WAKEUPS = "wd_pgqueuer_wakeup"
"""The kit's one table (MAPPING): a wakeup that arrived while a job was ``picked``, by job id, its
time and when it arrived. PgQueuer has no place for it: a second live job of one ``dedupe_key`` is
refused, and a ``picked`` row's ``headers`` cannot carry it (PgQueuer's ``Job`` model parses
``headers`` from JSON text, which psycopg hands over already parsed)."""


@dataclass(frozen=True)
class PgqReceipt:
    """What a take handed out: the job's id and the time its ``dequeue`` picked it (PgQueuer sets
    ``updated`` to the picking transaction's ``NOW()``, so a reclaim gives another receipt). The
    answers use the id only, as PgQueuer's ``log_jobs`` does."""

    entrypoint: str
    job: int
    picked: datetime


class PgqScheduler:
    """``Scheduler`` over PgQueuer's ``pgqueuer`` table, one entrypoint (``namespace``) per queue.

    ``concurrency_limit`` is the entrypoint's limit PgQueuer applies per queue manager (0: none);
    each scheduler is one queue manager (a fresh ``queue_manager_id``, as each PgQueuer process
    has), so a restarted worker is a new queue manager."""

    def __init__(
        self, pool: AsyncConnectionPool[Any], *, entrypoint: str, concurrency_limit: int = 0
    ) -> None:
        self.pool = pool
        self.entrypoint = entrypoint
        self.namespace = entrypoint
        self.concurrency_limit = concurrency_limit
        self.queue_manager_id = uuid.uuid4()
        self.qbq = qb.QueryQueueBuilder()
        self.table = self.qbq.settings.queue_table

    # -- connections ---------------------------------------------------------------------------

    @asynccontextmanager
    async def _queries(
        self, what: str, workflow: str = ""
    ) -> AsyncIterator[tuple[Queries, psycopg.AsyncConnection[Any]]]:
        """PgQueuer's ``Queries`` on a pooled connection, in autocommit as ``PsycopgDriver``
        requires (set back before the connection returns to the pool the checkpointer shares).
        Driver errors leave as ``without_durability_postgres.errors.classify`` says."""
        with boundary(what, pool=self.pool, workflow=workflow):
            async with self.pool.connection() as conn:
                await conn.set_autocommit(True)
                try:
                    yield Queries(db.PsycopgDriver(conn)), conn
                finally:
                    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                        await conn.set_autocommit(False)

    def _key(self, workflow: str) -> str:
        return f"{self.entrypoint}:{workflow}"

    @staticmethod
    def _check(workflow: str) -> None:
        check_workflow(workflow)
        if "\x00" in workflow:  # Postgres text cannot hold NUL: refused here, before the server
            raise InvalidWorkflowId(
                f"workflow id {workflow!r} contains a NUL character; use an id without it"
            )

    # -- the protocol --------------------------------------------------------------------------

    async def now(self) -> datetime:
        """The server's clock (PgQueuer compares ``execute_after`` and ``heartbeat`` with ``NOW()``)."""
        async with self._queries("read the server clock") as (_, conn):
            row = await (await conn.execute("SELECT clock_timestamp()")).fetchone()
        assert row is not None
        at: datetime = row[0]
        return at.astimezone(UTC)

    async def schedule(self, workflow: str, at: datetime | None = None) -> None:
        """``Queries.enqueue`` with the workflow's ``dedupe_key`` (``execute_after`` is relative in
        PgQueuer: ``at`` minus the server's clock). PgQueuer refuses a second live job of one key
        (``DuplicateJobError``). MAPPING: a ``queued`` job due later is moved to ``at``; a
        ``picked`` one (a wakeup while held) gets ``at`` in the kit's table ``WAKEUPS``, which
        the holder's answer reads; PgQueuer has no call for either."""
        self._check(workflow)
        check_time("schedule at", at)
        for _ in range(5):
            async with self._queries(f"enqueue {workflow!r}", workflow) as (queries, conn):
                delay = None if at is None else max(at - await self._clock(conn), timedelta(0))
                try:
                    await queries.enqueue(
                        self.entrypoint, workflow.encode(), execute_after=delay,
                        dedupe_key=self._key(workflow)
                    )  # fmt: skip
                    return
                except errors.DuplicateJobError:
                    pass
                moved = await conn.execute(
                    f"""UPDATE {self.table} SET execute_after = LEAST(execute_after, COALESCE(%(at)s, NOW()))
                         WHERE dedupe_key = %(key)s AND status = 'queued'""",
                    {"at": at, "key": self._key(workflow)},
                )
                if moved.rowcount:
                    return
                marked = await conn.execute(
                    f"""INSERT INTO {WAKEUPS} (job, at, since)
                        SELECT id, COALESCE(%(at)s, clock_timestamp()), clock_timestamp() FROM {self.table}
                         WHERE dedupe_key = %(key)s AND status = 'picked' FOR SHARE
                        ON CONFLICT (job) DO UPDATE
                           SET at = LEAST({WAKEUPS}.at, EXCLUDED.at), since = EXCLUDED.since""",
                    {"at": at, "key": self._key(workflow)},
                )
                if marked.rowcount:
                    return
            # answered or cancelled since the refusal: enqueue again
        # five refusals in a row: other callers keep scheduling the same workflow; one of theirs stands

    @staticmethod
    async def _clock(conn: psycopg.AsyncConnection[Any]) -> datetime:
        row = await (await conn.execute("SELECT clock_timestamp()")).fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]

    async def take(self, visibility: timedelta) -> Delivery | None:
        """``Queries.dequeue`` of one job, this process's ``queue_manager_id``, the take's
        visibility as ``retry_after``: a ``queued`` job that is due, or a ``picked`` one whose
        heartbeat is older than the visibility (the kit sends no heartbeats, so the time since
        its pick), under the entrypoint's ``concurrency_limit``. All of it is PgQueuer's SQL."""
        check_visibility(visibility)
        params = EntrypointExecutionParameter(
            retry_after=visibility, serialized=False, concurrency_limit=self.concurrency_limit
        )
        async with self._queries(f"dequeue from {self.entrypoint!r}") as (queries, conn):
            jobs = await queries.dequeue(
                batch_size=1,
                entrypoints={self.entrypoint: params},
                queue_manager_id=self.queue_manager_id,
                global_concurrency_limit=None,
            )
            if not jobs:
                return None
            job, *extra = jobs
            for other in extra:
                # MAPPING: PgQueuer's dequeue limits its queued and its stalled branch to
                # ``batch_size`` each, so one call may pick two jobs; a take hands out one, and the
                # other goes back to ``queued`` as it was picked (only while this pick still holds it)
                await conn.execute(
                    f"""UPDATE {self.table} SET status = 'queued', queue_manager_id = NULL
                         WHERE id = %s AND status = 'picked' AND updated = %s AND queue_manager_id = %s""",
                    (int(other.id), other.updated, self.queue_manager_id),
                )
        assert job.payload is not None, job
        return Delivery(job.payload.decode(), PgqReceipt(self.entrypoint, int(job.id), job.updated))

    async def wake_at(self, delivery: Delivery, at: datetime | None) -> None:
        """In one transaction: lock the job's row; PgQueuer's ``log_jobs`` query moves it to the
        log (deleted, ``successful``), **by id only**, as PgQueuer's worker does when a job ends;
        then, for "again at ``at``" or a wakeup that arrived since this delivery's take (the
        kit's ``WAKEUPS``), ``enqueue`` the workflow at the earlier of the two. A job already gone
        (answered, cancelled) is left gone. PgQueuer has no "retry later" for a picked job: its
        retries run inside the worker (``RetryWithBackoffEntrypointExecutor``)."""
        receipt = delivery.receipt
        if not isinstance(receipt, PgqReceipt) or receipt.entrypoint != self.entrypoint:
            raise InvalidInput(f"{delivery!r} was not taken from PgQueuer entrypoint {self.entrypoint!r}")
        check_time("wake at", at)
        workflow = delivery.workflow
        async with self._queries(f"log job {receipt.job}", workflow) as (queries, conn), conn.transaction():
            row = await (
                await conn.execute(f"SELECT id FROM {self.table} WHERE id = %s FOR UPDATE", (receipt.job,))
            ).fetchone()
            if row is None:
                return  # answered, reclaimed and answered, or cancelled since: nothing to act on
            await queries.driver.execute(
                self.qbq.build_log_job_query(), [receipt.job], ["successful"], [None]
            )
            mark = await (
                await conn.execute(
                    f"DELETE FROM {WAKEUPS} WHERE job = %s RETURNING at, since", (receipt.job,)
                )
            ).fetchone()
            wakeup = None if mark is None or mark[1] <= receipt.picked else mark[0]
            again = at if wakeup is None else (wakeup if at is None else min(at, wakeup))
            if again is None:
                return
            delay = max(again - await self._clock(conn), timedelta(0))
            await queries.enqueue(
                self.entrypoint, workflow.encode(), execute_after=delay,
                dedupe_key=self._key(workflow)
            )  # fmt: skip

    async def cancel(self, workflow: str) -> None:
        """``Queries.mark_job_as_cancelled`` on the workflow's live job: PgQueuer moves it to the
        log as ``canceled`` (deleted), whether it waits or runs, and notifies the holder."""
        self._check(workflow)
        async with self._queries(f"cancel {workflow!r}", workflow) as (queries, conn):
            cur = await conn.execute(
                f"SELECT id FROM {self.table} WHERE dedupe_key = %s AND status IN ('queued', 'picked')",
                (self._key(workflow),),
            )
            ids = [int(r[0]) for r in await cur.fetchall()]
            if ids:
                await queries.mark_job_as_cancelled(ids)


async def install(pool: AsyncConnectionPool[Any]) -> None:
    """PgQueuer's schema (``Queries.install``) in the pool's schema (its ``search_path``), and the
    kit's ``WAKEUPS``."""
    with boundary("install PgQueuer's schema", pool=pool):
        async with pool.connection() as conn:
            await conn.set_autocommit(True)
            try:
                await Queries(db.PsycopgDriver(conn)).install()
                await conn.execute(
                    f"CREATE TABLE {WAKEUPS} (job BIGINT PRIMARY KEY, at TIMESTAMPTZ NOT NULL, since TIMESTAMPTZ NOT NULL)"
                )
            finally:
                await conn.set_autocommit(False)
