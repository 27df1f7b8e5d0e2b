"""``PgQueueScheduler``: a job queue of its own over Postgres, one table and one sequence, that
meets without-durability's ``Scheduler`` protocol and runs beside ``PostgresCheckpointer`` on the
same pool.

Every driver error leaves through ``without_durability_postgres.errors.boundary``, so a caller sees
``StoreUnavailable`` when the server is gone and ``StoreError`` when a statement failed, exactly as
from the built-in stores.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg_pool import AsyncConnectionPool

from without_durability import Delivery, InvalidInput, InvalidWorkflowId
from without_durability.rules import check_time, check_visibility, check_workflow
from without_durability_postgres.errors import boundary

# --8<-- [start:schema]
# One row per workflow and queue: a second schedule moves the row, it never adds one. ``version``
# is drawn from a sequence by every write, so it never repeats, even after a row is deleted and
# made again: it is the receipt that tells one take from every other.
CREATE_SEQUENCE = "CREATE SEQUENCE IF NOT EXISTS pgqueue_version"
CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS pgqueue_jobs (
    queue    text        NOT NULL,
    workflow text        NOT NULL,
    due      timestamptz NOT NULL,
    version  bigint      NOT NULL DEFAULT nextval('pgqueue_version'),
    PRIMARY KEY (queue, workflow)
)
"""
# --8<-- [end:schema]

NOW = "SELECT clock_timestamp()"

# --8<-- [start:statements]
# The earlier time wins; and a schedule always draws a new version, so a delivery taken before it
# can no longer answer: the wakeup that arrived while the workflow ran stands.
SCHEDULE = """
INSERT INTO pgqueue_jobs AS j (queue, workflow, due)
VALUES (%(queue)s, %(workflow)s, COALESCE(%(at)s::timestamptz, now()))
ON CONFLICT (queue, workflow) DO UPDATE
   SET due = LEAST(j.due, EXCLUDED.due), version = nextval('pgqueue_version')
"""

# SKIP LOCKED: a second taker steps over the row the first is taking, so two takes never hand out
# one delivery. Taking hides the row for the visibility and draws the version the receipt holds.
TAKE = """
UPDATE pgqueue_jobs AS j
   SET due = now() + %(visibility)s, version = nextval('pgqueue_version')
  FROM (SELECT workflow FROM pgqueue_jobs
         WHERE queue = %(queue)s AND due <= now()
         ORDER BY due, workflow
         LIMIT 1
           FOR UPDATE SKIP LOCKED) AS next
 WHERE j.queue = %(queue)s AND j.workflow = next.workflow
RETURNING j.workflow, j.version
"""

# An answer acts only while the row still holds this take's version: a wakeup, a cancel or a
# later take since then (all of which moved or removed it) win over the answer.
WAKE_AT = """
UPDATE pgqueue_jobs SET due = %(at)s, version = nextval('pgqueue_version')
 WHERE queue = %(queue)s AND workflow = %(workflow)s AND version = %(receipt)s
"""
FINISH = "DELETE FROM pgqueue_jobs WHERE queue = %(queue)s AND workflow = %(workflow)s AND version = %(receipt)s"
CANCEL = "DELETE FROM pgqueue_jobs WHERE queue = %(queue)s AND workflow = %(workflow)s"
# --8<-- [end:statements]


async def migrate_queue(pool: AsyncConnectionPool[Any]) -> None:
    """Create the queue's sequence and table in the pool's schema, if absent."""
    with boundary("create the pgqueue table", pool=pool):
        async with pool.connection() as conn:
            await conn.execute(CREATE_SEQUENCE)
            await conn.execute(CREATE_TABLE)


@dataclass(frozen=True)
class _Receipt:
    queue: str
    version: int


class PgQueueScheduler:
    """``Scheduler`` over ``pgqueue_jobs`` in one queue, through ``pool``; every time is the
    server's clock."""

    def __init__(self, pool: AsyncConnectionPool[Any], *, queue: str = "default") -> None:
        self.pool = pool
        self.queue = queue

    # --8<-- [start:boundary]
    async def _run(self, what: str, sql: str, params: dict[str, Any], workflow: str = "") -> Any:
        """Run one statement as its own transaction; its first row, or None. A driver error
        leaves as the store's own: ``StoreUnavailable`` or ``StoreError``, the driver's error
        kept as ``__cause__``."""
        with boundary(what, pool=self.pool, workflow=workflow):
            async with self.pool.connection() as conn:
                cursor = await conn.execute(sql, params)
                return await cursor.fetchone() if cursor.description else None

    # --8<-- [end:boundary]

    @staticmethod
    def _check(workflow: str) -> None:
        check_workflow(workflow)
        if "\x00" in workflow:  # Postgres text cannot hold NUL: refused here, before the server
            raise InvalidWorkflowId(f"workflow id {workflow!r} contains a NUL character; use an id without it")

    async def now(self) -> datetime:
        """The server's clock."""
        row = await self._run("read the server clock", NOW, {})
        at: datetime = row[0]
        return at.astimezone(UTC)

    async def schedule(self, workflow: str, at: datetime | None = None) -> None:
        """Make ``workflow`` due no later than ``at`` (default: now); the earlier time wins."""
        self._check(workflow)
        check_time("schedule at", at)
        params = {"queue": self.queue, "workflow": workflow, "at": at}
        await self._run(f"schedule {workflow!r}", SCHEDULE, params, workflow)

    async def take(self, visibility: timedelta) -> Delivery | None:
        """The earliest due workflow, hidden for ``visibility``; None when nothing is due."""
        check_visibility(visibility)
        params = {"queue": self.queue, "visibility": visibility}
        row = await self._run(f"take from queue {self.queue!r}", TAKE, params)
        if row is None:
            return None
        return Delivery(row[0], _Receipt(self.queue, int(row[1])))

    async def wake_at(self, delivery: Delivery, at: datetime | None) -> None:
        """Answer for ``delivery``: due again at ``at``, or removed when None; only while no
        wakeup, cancel or later take has touched the row since it was taken."""
        receipt = delivery.receipt
        if not isinstance(receipt, _Receipt) or receipt.queue != self.queue:
            raise InvalidInput(f"{delivery!r} was not taken from pgqueue queue {self.queue!r}")
        check_time("wake at", at)
        params = {"queue": self.queue, "workflow": delivery.workflow, "receipt": receipt.version, "at": at}
        sql = FINISH if at is None else WAKE_AT
        await self._run(f"answer for {delivery.workflow!r}", sql, params, delivery.workflow)

    async def cancel(self, workflow: str) -> None:
        """Remove ``workflow`` from the queue."""
        self._check(workflow)
        await self._run(f"cancel {workflow!r}", CANCEL, {"queue": self.queue, "workflow": workflow}, workflow)
