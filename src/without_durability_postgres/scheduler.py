"""PostgresScheduler: a queue table scored by visibility, taken with FOR UPDATE SKIP LOCKED."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from without_durability._values import Delivery
from without_durability.errors import InvalidInput
from without_durability.protocols import AnswersAndTakes, Scheduler
from without_durability.rules import check_time, check_visibility, check_workflow

from ._boundary import Pool, check_text, one_flight, statement
from .failover import REAP
from .wakeup import Notifier

NOW = "SELECT clock_timestamp()"

# The earlier of the queued time and the new one wins, so a wakeup is never pushed later. And the
# row always moves, at least a microsecond earlier: a pass whose take's receipt is already in the
# past (a pass slower than its visibility, or a server clock stepped forward) must find its receipt
# gone when it answers, or its answer would delete the wakeup this arrival asked for.
SCHEDULE = """
INSERT INTO workflow_queue AS q (namespace, workflow, visibility)
VALUES (%(namespace)s, %(workflow)s, COALESCE(%(at)s::timestamptz, now()))
ON CONFLICT (namespace, workflow) DO UPDATE
    SET visibility = LEAST(q.visibility - interval '1 microsecond', EXCLUDED.visibility)
"""

# SKIP LOCKED: a second taker steps over the row the first is hiding instead of queueing behind
# it, so two takes never hand out one delivery. The receipt is the visibility set here and the
# take's number: the time alone can repeat (a take for 3u, a wakeup at u, a take for 2u both hide
# the row until the same instant, and a server clock can be stepped back), and the number, drawn
# from one sequence for the whole table, cannot.
TAKE_SETS = "visibility = now() + %(visibility)s, took = nextval('workflow_take_seq')"
TAKE = f"""
WITH next AS (
    SELECT workflow FROM workflow_queue
     WHERE namespace = %(namespace)s AND visibility <= now()
     ORDER BY visibility, workflow
     LIMIT 1
     FOR UPDATE SKIP LOCKED
)
UPDATE workflow_queue AS q
   SET {TAKE_SETS}
  FROM next
 WHERE q.namespace = %(namespace)s AND q.workflow = next.workflow
RETURNING q.workflow, q.visibility, q.took
"""

# TAKE for up to %(limit)s rows at once: the same statement, so each row is still handed out once.
TAKE_MANY = TAKE.replace("LIMIT 1", "LIMIT %(limit)s")

# Each answer acts only if the row still holds this delivery's receipt: the visibility its take
# set and the take's number. A wakeup moved the visibility (that one stands), a cancel removed the
# row (not reinstated), a later take renumbered it (this answer is stale). The comparison and the
# write are one statement.
RECEIPT_HOLDS = " AND visibility = %(receipt)s AND took = %(took)s"
WAKE_AT = f"""
UPDATE workflow_queue SET visibility = %(at)s
 WHERE namespace = %(namespace)s AND workflow = %(workflow)s{RECEIPT_HOLDS}
"""
FINISH = f"""
DELETE FROM workflow_queue
 WHERE namespace = %(namespace)s AND workflow = %(workflow)s{RECEIPT_HOLDS}
"""

# FINISH for many deliveries in one statement: each row is compared with its own receipt, exactly as
# one FINISH per delivery would, so batching changes the number of commits and nothing else.
FINISH_MANY = """
DELETE FROM workflow_queue AS q
 USING unnest(%(workflows)s::text[], %(receipts)s::timestamptz[], %(tooks)s::bigint[])
       AS a(workflow, receipt, took)
 WHERE q.namespace = %(namespace)s AND q.workflow = a.workflow AND q.visibility = a.receipt
   AND q.took = a.took
"""

# An answer and the next take as one statement, so a worker's hot path costs one round trip and one
# commit per delivery instead of two of each. The answer is FINISH or WAKE_AT unchanged (it acts only
# on its own receipt); the take is TAKE unchanged but for two conditions:
# - it steps over the workflow being answered: both parts read one snapshot, in which the answered
#   row still holds its receipt, and one statement must never write a row twice (a due answer is
#   left for the next take);
# - it starts only once the answer has finished (the take's filter reads the answer's output, so
#   the answer runs first, as a one-time filter before the take's scan). The answer may wait for a
#   row lock: a concurrent take whose snapshot predates this delivery's take may have locked the
#   row before rechecking and skipping it. Were the take allowed to lock its row first, two such
#   statements could each hold the row the other's answer waits for: a deadlock. Answer first, and
#   a statement holds no lock while it waits.
_THEN_TAKE = f"""
), next AS (
    SELECT workflow FROM workflow_queue
     WHERE namespace = %(namespace)s AND visibility <= now() AND workflow <> %(workflow)s
       AND (SELECT count(*) FROM answered) >= 0
     ORDER BY visibility, workflow
     LIMIT 1
     FOR UPDATE SKIP LOCKED
)
UPDATE workflow_queue AS q
   SET {TAKE_SETS}
  FROM next
 WHERE q.namespace = %(namespace)s AND q.workflow = next.workflow
RETURNING q.workflow, q.visibility, q.took
"""
FINISH_AND_TAKE = (
    f"""
WITH answered AS (
    DELETE FROM workflow_queue
     WHERE namespace = %(namespace)s AND workflow = %(workflow)s{RECEIPT_HOLDS}
    RETURNING 1"""
    + _THEN_TAKE
)
WAKE_AT_AND_TAKE = (
    f"""
WITH answered AS (
    UPDATE workflow_queue SET visibility = %(at)s
     WHERE namespace = %(namespace)s AND workflow = %(workflow)s{RECEIPT_HOLDS}
    RETURNING 1"""
    + _THEN_TAKE
)

CANCEL = "DELETE FROM workflow_queue WHERE namespace = %(namespace)s AND workflow = %(workflow)s"


@dataclass(frozen=True, slots=True)
class _Receipt:
    namespace: str
    visible_at: datetime
    took: int


class PostgresScheduler:
    """``Scheduler`` over ``workflow_queue`` in one namespace, through ``pool``. ``take`` does not
    block: a worker polls, and may also wait on a ``PostgresWakeup``, which this scheduler feeds
    when built with ``notify=True`` (one coalesced NOTIFY after each commit that made a workflow due
    now; see ``wakeup``). ``now`` and every visibility are the server's clock."""

    # The statements, as class attributes so a variant is a one-line subclass.
    NOW = NOW
    SCHEDULE = SCHEDULE
    TAKE = TAKE
    TAKE_MANY = TAKE_MANY
    WAKE_AT = WAKE_AT
    FINISH = FINISH
    FINISH_MANY = FINISH_MANY
    FINISH_AND_TAKE = FINISH_AND_TAKE
    WAKE_AT_AND_TAKE = WAKE_AT_AND_TAKE
    CANCEL = CANCEL
    REAP = REAP

    def __init__(
        self, pool: Pool, *, namespace: str = "default", notify: bool = False, reap_dead: bool = False
    ) -> None:
        if not isinstance(namespace, str) or not namespace or "\x00" in namespace:
            raise InvalidInput(f"namespace must be a non-empty string without NUL, got {namespace!r}")
        self.pool = pool
        self.namespace = namespace
        self.notifier = Notifier(pool, namespace) if notify else None
        """Sends the wakeup NOTIFYs when ``notify`` was asked for, else None."""
        self.reap_dead = reap_dead
        """Fast failover (opt-in; see ``failover``): each ``take`` (and ``PostgresDurable``'s
        ``take_and_claim``) first makes visible the deliveries of live claims whose owner's
        presence is gone, in the same transaction and round trip."""

    def _due_now(self, at: datetime | None) -> None:
        """After a commit that queued a workflow: wake listeners if it may be due already."""
        if self.notifier is not None and (at is None or at <= datetime.now(UTC)):
            self.notifier.poke()

    async def now(self) -> datetime:
        """See ``Scheduler.now``: the server's clock_timestamp()."""
        async with statement(self.pool, "reading the server clock") as conn:
            row = await (await conn.execute(self.NOW)).fetchone()
        assert row is not None
        at: datetime = row[0]
        return at.astimezone(UTC)

    async def schedule(self, workflow: str, at: datetime | None = None) -> None:
        """See ``Scheduler.schedule``."""
        check_workflow(workflow)
        check_text(workflow)
        check_time("schedule at", at)
        async with statement(self.pool, f"scheduling {workflow!r}", workflow) as conn:
            await self._schedule_on(conn, workflow, at)
        self._due_now(at)

    async def _schedule_on(
        self, conn: psycopg.AsyncConnection[Any], workflow: str, at: datetime | None = None
    ) -> None:
        params = {"namespace": self.namespace, "workflow": workflow, "at": at}
        await conn.execute(self.SCHEDULE, params)

    async def take(self, visibility: timedelta) -> Delivery | None:
        """See ``Scheduler.take``: the earliest visible workflow of this namespace."""
        check_visibility(visibility)
        params = {"namespace": self.namespace, "visibility": visibility}
        where = f"taking from namespace {self.namespace!r}"
        if self.reap_dead:
            async with one_flight(self.pool, where) as flight:
                await flight.conn.execute(self.REAP, params)
                taking = await flight.conn.execute(self.TAKE, params)
            row = await taking.fetchone()
        else:
            async with statement(self.pool, where) as conn:
                row = await (await conn.execute(self.TAKE, params)).fetchone()
        if row is None:
            return None
        return Delivery(str(row[0]), _Receipt(self.namespace, row[1], int(row[2])))

    async def take_many(self, visibility: timedelta, limit: int) -> list[Delivery]:
        """Batching option: up to ``limit`` visible workflows in one statement, each hidden for
        ``visibility`` exactly as ``take`` hides one (same guarantees, one round trip). Keep
        ``limit`` to what will be answered well within ``visibility``."""
        check_visibility(visibility)
        if not isinstance(limit, int) or limit < 1:
            raise InvalidInput(f"take_many limit must be a positive int, got {limit!r}")
        params = {"namespace": self.namespace, "visibility": visibility, "limit": limit}
        async with statement(self.pool, f"taking from namespace {self.namespace!r}") as conn:
            rows = await (await conn.execute(self.TAKE_MANY, params)).fetchall()
        return [Delivery(str(w), _Receipt(self.namespace, at, int(took))) for w, at, took in rows]

    async def finish_many(self, deliveries: list[Delivery]) -> None:
        """Batching option: ``wake_at(d, None)`` for every delivery, in one statement; each is
        removed only if it is still the delivery that was taken (as ``wake_at`` decides)."""
        receipts = [self._receipt(d) for d in deliveries]
        if not deliveries:
            return
        params = {
            "namespace": self.namespace,
            "workflows": [d.workflow for d in deliveries],
            "receipts": [r.visible_at for r in receipts],
            "tooks": [r.took for r in receipts],
        }
        async with statement(self.pool, f"answering {len(deliveries)} deliveries") as conn:
            await conn.execute(self.FINISH_MANY, params)

    def _receipt(self, delivery: Delivery) -> _Receipt:
        receipt = delivery.receipt
        if not isinstance(receipt, _Receipt) or receipt.namespace != self.namespace:
            raise InvalidInput(
                f"{delivery!r} was not handed out by a PostgresScheduler of namespace {self.namespace!r}"
            )
        return receipt

    async def wake_at(self, delivery: Delivery, at: datetime | None) -> None:
        """See ``Scheduler.wake_at``."""
        check_time("wake_at at", at)
        receipt = self._receipt(delivery)
        params = {
            "namespace": self.namespace,
            "workflow": delivery.workflow,
            "receipt": receipt.visible_at,
            "took": receipt.took,
            "at": at,
        }
        async with statement(self.pool, f"answering for {delivery.workflow!r}") as conn:
            await conn.execute(self.FINISH if at is None else self.WAKE_AT, params)

    async def answer_and_take(
        self, delivery: Delivery, at: datetime | None, visibility: timedelta
    ) -> Delivery | None:
        """See ``AnswersAndTakes``: ``wake_at(delivery, at)`` and ``take(visibility)`` as one
        statement, one round trip and one commit (what ``Worker`` uses between passes)."""
        check_time("wake_at at", at)
        check_visibility(visibility)
        receipt = self._receipt(delivery)
        params = {
            "namespace": self.namespace,
            "workflow": delivery.workflow,
            "receipt": receipt.visible_at,
            "took": receipt.took,
            "at": at,
            "visibility": visibility,
        }
        query = self.FINISH_AND_TAKE if at is None else self.WAKE_AT_AND_TAKE
        async with statement(self.pool, f"answering for {delivery.workflow!r} and taking") as conn:
            row = await (await conn.execute(query, params)).fetchone()
        if row is None:
            return None
        return Delivery(str(row[0]), _Receipt(self.namespace, row[1], int(row[2])))

    async def cancel(self, workflow: str) -> None:
        """See ``Scheduler.cancel``."""
        check_workflow(workflow)
        check_text(workflow)
        async with statement(self.pool, f"cancelling {workflow!r}", workflow) as conn:
            await self._cancel_on(conn, workflow)

    async def _cancel_on(self, conn: psycopg.AsyncConnection[Any], workflow: str) -> None:
        await conn.execute(self.CANCEL, {"namespace": self.namespace, "workflow": workflow})


def _typecheck(pool: Pool) -> None:  # pragma: no cover - mypy proves it meets the protocols
    s: Scheduler = PostgresScheduler(pool)
    a: AnswersAndTakes = PostgresScheduler(pool)
    del s, a
