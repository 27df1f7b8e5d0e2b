"""PostgresDurable: the transitions across the two stores, each as one commit sent in one round trip."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import psycopg

from without_durability._values import Delivery, Pass, Recorded
from without_durability.errors import Contended, InvalidInput, StoreError, StoreUnavailable
from without_durability.protocols import Durable, TakesAndClaims
from without_durability.rules import INBOX_PREFIX, check_lease, check_visibility

from ._boundary import Flight, Pool, one_flight
from .checkpointer import PostgresCheckpointer, PostgresEffect
from .failover import owned_claim
from .scheduler import TAKE_SETS, PostgresScheduler, _Receipt

Connection = psycopg.AsyncConnection[Any]
Cursor = psycopg.AsyncCursor[Any]

# take_and_claim's transaction: READ COMMITTED whatever the pool's default, so that its second
# statement, the load, reads a snapshot of its own, taken after the claim got its row.
_READ_COMMITTED = "BEGIN ISOLATION LEVEL READ COMMITTED"

# TAKE, then CLAIM of the workflow taken, in one statement. The claim never waits for
# a lock: the take holds its queue row to the commit, and a discard locks the claim row and then
# the queue row, so waiting here could deadlock. A claim row that a transaction in flight holds (a
# discard, a renewal, a record, a sweep) is left unclaimed (token NULL) and the take stands; the
# column busy says that this is why (no claim was tried, so it says nothing of a live pass),
# where a NULL token without it is a refusal: a live pass holds the claim. The last column is the
# take's number, the receipt's other half (scheduler.TAKE). Always one row
# (all NULL when nothing was due), setting for TAKE_CLAIMED_LOAD, for the rest of the
# transaction, the workflow claimed or '' (no workflow has that id).
TAKE_AND_CLAIM = f"""
WITH next AS (
    SELECT workflow FROM workflow_queue
     WHERE namespace = %(namespace)s AND visibility <= now()
     ORDER BY visibility, workflow
     LIMIT 1
     FOR UPDATE SKIP LOCKED
), taken AS (
    UPDATE workflow_queue AS q
       SET {TAKE_SETS}
      FROM next
     WHERE q.namespace = %(namespace)s AND q.workflow = next.workflow
    RETURNING q.workflow, q.visibility, q.took
), free AS (
    SELECT c.workflow FROM workflow_claim c JOIN taken ON c.workflow = taken.workflow
       FOR UPDATE OF c SKIP LOCKED
), claimed AS (
    INSERT INTO workflow_claim AS held (workflow, token, held_until, alive_until, alive_for)
    SELECT taken.workflow, nextval('workflow_token_seq'),
           now() + %(budget)s, LEAST(now() + %(alive)s, now() + %(budget)s), %(alive)s
      FROM taken
     WHERE EXISTS (SELECT 1 FROM free)
        OR NOT EXISTS (SELECT 1 FROM workflow_claim c WHERE c.workflow = taken.workflow)
    ON CONFLICT (workflow) DO UPDATE
        SET token = GREATEST(held.token + 1, EXCLUDED.token),
            held_until = now() + %(budget)s,
            alive_until = LEAST(now() + %(alive)s, now() + %(budget)s),
            alive_for = %(alive)s,
            owner = NULL
        WHERE held.alive_until <= now()
    RETURNING held.workflow, held.token
)
SELECT taken.workflow, taken.visibility, claimed.token,
       set_config('without_durability.claimed', COALESCE(claimed.workflow, ''), true),
       claimed.token IS NULL AND NOT EXISTS (SELECT 1 FROM free)
           AND EXISTS (SELECT 1 FROM workflow_claim c WHERE c.workflow = taken.workflow) AS busy,
       taken.took
  FROM (VALUES (1)) AS one (row) LEFT JOIN taken ON true LEFT JOIN claimed ON true
"""

# TAKE_AND_CLAIM with fast failover's claim (see failover.py and CLAIM_OWNED).
TAKE_AND_CLAIM_OWNED = owned_claim(TAKE_AND_CLAIM)

# LOAD of the workflow TAKE_AND_CLAIM claimed in this transaction (none: no rows). A statement of
# its own, so its snapshot is taken after the claim got its row: a pass whose claim had expired may
# have committed a record after TAKE_AND_CLAIM's snapshot was taken, and this load sees it.
TAKE_CLAIMED_LOAD = """
SELECT key, value::text, written_at FROM workflow_checkpoint
 WHERE workflow = current_setting('without_durability.claimed', true)
 ORDER BY seq
"""

# The joined statements are these three's semantics written out; a store whose halves run other
# statements (a subclass, a variant) gets the three calls instead.
# (A tuple, not module names: `wd-chaos mutate` finds each statement under the module defining it.)
_JOINED = (PostgresScheduler.TAKE, PostgresCheckpointer.CLAIM, PostgresCheckpointer.LOAD)


class PostgresDurable:
    """``Durable[PostgresEffect]`` whose ``arrive``, ``deliver`` and ``discard`` each write both
    tables in one transaction, so no crash leaves a recorded-but-unqueued workflow, and a
    ``deliver`` that failed appended nothing (asking again cannot leave two messages). Each
    transaction goes out in pipeline mode, BEGIN to COMMIT in one network round trip; with
    ``notify=True`` the wakeup NOTIFY rides inside the same transaction, so listeners hear it
    the moment it commits.

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

        async def queue(conn: Connection) -> Cursor:
            supplied = await conn.execute(cp.SUPPLY, supply)
            await self._scheduler._schedule_on(conn, workflow)  # queues; reads nothing back
            return supplied

        supplied = await self._making_due(where, workflow, key, queue)
        row = await supplied.fetchone()  # read after the commit: the pipeline sent it all at once
        assert row is not None  # an upsert with DO UPDATE always returns its row
        return cp._recorded(row)

    async def deliver(self, workflow: str, message: object) -> str:
        """See ``Durable.deliver``: append and schedule now, one commit, one round trip."""
        cp = self._checkpointer
        cp._workflow(workflow)
        encoded = cp._encode(workflow, INBOX_PREFIX, message)
        where = f"delivering to {workflow!r}"

        async def queue(conn: Connection) -> Cursor:
            appended = await conn.execute(cp.APPEND, {"workflow": workflow, "value": encoded})
            await self._scheduler._schedule_on(conn, workflow)
            return appended

        appended = await self._making_due(where, workflow, INBOX_PREFIX, queue)
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
        """See ``TakesAndClaims``: one READ COMMITTED transaction, so one commit (one WAL flush
        where the calls make two): the take and the claim as one statement, the load as a second,
        with a snapshot taken after the claim got its row; sent in one round trip (pipeline mode),
        whether or not anything was due.

        One difference from the three calls: where the workflow's claim row is held by a
        transaction in flight (a renewal, a record, a discard, a release, a sweep), the pass is
        None at once, as for ``Contended``, instead of waiting for it: the take holds its queue
        row until the commit, and a discard locks the two rows the other way round. The Worker
        then answers the delivery for ``retry_contended`` later, as for any contended claim.
        ``take_and_claim_busy`` says which of the two a None pass was."""
        taken = await self.take_and_claim_busy(visibility, alive=alive, budget=budget)
        return None if taken is None else taken[:3]

    async def take_and_claim_busy(
        self, visibility: timedelta, *, alive: timedelta, budget: timedelta
    ) -> tuple[Delivery, Pass | None, dict[str, object], bool] | None:
        """``take_and_claim``, its result followed by ``busy``: True exactly when the pass is None
        because the claim row was held by a transaction in flight, so no claim was tried and the
        None says nothing of a live pass; False for a pass, and for a refusal (where ``claim``
        would raise ``Contended``: a live pass holds the claim). For an observer such as wd-chaos,
        which judges a refusal as evidence that a pass was alive; the Worker treats both alike."""
        check_visibility(visibility)
        check_lease("", alive, budget)
        sched, cp = self._scheduler, self._checkpointer
        if (sched.TAKE, cp.CLAIM, cp.LOAD) != _JOINED:
            return await self._take_then_claim(visibility, alive=alive, budget=budget)
        where = f"taking from namespace {sched.namespace!r} and claiming"
        params: dict[str, Any] = {
            "namespace": sched.namespace, "visibility": visibility, "alive": alive, "budget": budget
        }
        query = TAKE_AND_CLAIM
        if cp.failover is not None:
            query, params["owner"] = TAKE_AND_CLAIM_OWNED, cp.failover.owner
        async with one_flight(self.pool, where, begin=_READ_COMMITTED) as flight:
            if sched.reap_dead:  # its own statement first, so the take's snapshot sees what it freed
                await flight.conn.execute(sched.REAP, {"namespace": sched.namespace})
            taking = await flight.conn.execute(query, params)  # queued: read after the flight
            loading = await flight.conn.execute(TAKE_CLAIMED_LOAD)
        taken = await taking.fetchone()
        if taken is None or taken[0] is None:
            return None
        delivery = Delivery(str(taken[0]), _Receipt(sched.namespace, taken[1], int(taken[5])))
        if taken[2] is None:  # refused, or its claim row busy: the take stands
            return delivery, None, {}, bool(taken[4])
        records = {str(k): cp.codec.decode(v) for k, v, _ in await loading.fetchall()}
        return delivery, Pass(delivery.workflow, int(taken[2])), records, False

    async def _take_then_claim(
        self, visibility: timedelta, *, alive: timedelta, budget: timedelta
    ) -> tuple[Delivery, Pass | None, dict[str, object], bool] | None:
        """``take_and_claim_busy`` as the three calls, for halves whose statements are not the
        ones joined (the claim waits for a busy row, so busy is always False)."""
        delivery = await self._scheduler.take(visibility)
        if delivery is None:
            return None
        try:
            pass_ = await self._checkpointer.claim(delivery.workflow, alive=alive, budget=budget)
        except Contended:
            return delivery, None, {}, False
        return delivery, pass_, await self._checkpointer.load(delivery.workflow), False

    async def _making_due(
        self, where: str, workflow: str, key: str, queue: Callable[[Connection], Awaitable[Cursor]]
    ) -> Cursor:
        """``one_flight`` for a transaction that makes ``workflow`` due now: ``queue`` queues its
        statements (it may be called twice) and the cursor it returns is read after the flight.

        With ``notify=True`` the NOTIFY is the transaction's last statement, unless one is in
        flight already; then one is sent after the commit from the background. Inside the
        transaction it costs no commit of its own, and listeners hear it as the transaction
        commits. The NOTIFY is claimed only once the connection is held and the statements queued,
        so a caller waiting for a pooled connection holds up nobody else's notification; and since
        at most one claimed NOTIFY is in flight, at most one of these transactions at a time takes
        the database-wide lock a notifying commit takes. A transaction the server refused while
        it carried the NOTIFY (which may be the NOTIFY's own failure: a full notification queue)
        is sent once more without it, so a broken wakeup path never fails a write."""
        notifier = self._scheduler.notifier
        if notifier is None:
            async with one_flight(self.pool, where, workflow, key) as flight:
                cursor = await queue(flight.conn)
            return cursor

        def claim() -> tuple[str, dict[str, str]] | None:  # with the connection held, statements queued
            return notifier.statement() if notifier.claim() else None

        for notifying in (True, False):
            started: Flight | None = None
            refused = False  # the server refused the transaction: certainly nothing committed
            try:
                async with one_flight(
                    self.pool, where, workflow, key, last=claim if notifying else None
                ) as started:
                    cursor = await queue(started.conn)
                return cursor
            except (StoreError, InvalidInput) as exc:
                refused = not isinstance(exc, StoreUnavailable)  # unavailable: it may have committed
                if not (refused and started is not None and started.last_queued):
                    raise
            finally:
                claimed = started is not None and started.last_queued
                notified = claimed and started is not None and started.committed
                committed = started is not None and started.committed
                notifier.settle(claimed, notified=notified, owed=not notified and (committed or not refused))
        raise AssertionError("unreachable: the second attempt carries no NOTIFY")  # pragma: no cover


def _typecheck(d: PostgresDurable) -> None:  # pragma: no cover - mypy proves it meets the protocol
    x: Durable[PostgresEffect] = d
    y: TakesAndClaims = d
    del x, y
