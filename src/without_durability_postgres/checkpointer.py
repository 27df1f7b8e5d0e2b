"""PostgresCheckpointer: every guarantee of ``Checkpointer`` as one statement or one transaction.

The atomic unit comes with the database: a claim is one upsert, a fenced record is one statement, a
transact is one transaction with the caller's own SQL in the middle. Every time is the server's.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, Self

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.abc import Params, Query

from without_durability._values import Entry, Pass, Recorded
from without_durability.codec import CheckpointCodec, JsonCodec, verify_codec
from without_durability.errors import Contended, Fenced, SchemaMismatch, StoreError
from without_durability.protocols import Checkpointer
from without_durability.rules import (
    INBOX_DIGITS,
    INBOX_PREFIX,
    MAX_VALUE_BYTES,
    check_key,
    check_lease,
    check_pass,
    check_workflow,
    encode_value,
)

from ._appends import AppendBatcher, _NotWanted
from ._boundary import Pool, check_codec, check_encoded, check_text, connect, statement
from .failover import Presence, owned_claim

PostgresEffect = Callable[[psycopg.AsyncCursor[Any]], Awaitable[object]]
"""A Postgres transact effect: given a cursor inside the open transaction, do the application's
write and return the value to record. It commits with the record or not at all."""

# -- claims ---------------------------------------------------------------------------------

# The WHERE on DO UPDATE is the "is it free" test: a live row fails it and RETURNING comes back
# empty, which is how a lost race shows. Two first claims serialize on the primary key, and the
# loser takes the DO UPDATE arm. LEAST keeps liveness at or under the budget. The token is drawn
# from workflow_token_seq (schema.CREATE_TOKEN_SEQ), so no token is ever handed out twice for
# one workflow, even after its claim row was deleted; GREATEST keeps a row's tokens rising.
# owner = NULL: a claim without fast failover takes the row over from whoever held it last, and
# must not keep that holder's presence id, or a fast-failover claim would take this live pass over
# once that other worker's presence ended (a mixed fleet, issue #45).
CLAIM = """
INSERT INTO workflow_claim AS held (workflow, token, held_until, alive_until, alive_for)
VALUES (
    %(workflow)s, nextval('workflow_token_seq'),
    now() + %(budget)s, LEAST(now() + %(alive)s, now() + %(budget)s), %(alive)s
)
ON CONFLICT (workflow) DO UPDATE
    SET token = GREATEST(held.token + 1, EXCLUDED.token),
        held_until = now() + %(budget)s,
        alive_until = LEAST(now() + %(alive)s, now() + %(budget)s),
        alive_for = %(alive)s,
        owner = NULL
    WHERE held.alive_until <= now()
RETURNING token
"""

# CLAIM with fast failover (see failover.py): records the claimer's presence id as the row's
# owner, and takes a live claim over when its owner's presence lock is free.
CLAIM_OWNED = owned_claim(CLAIM)

# A renewal can never carry liveness past the budget, nor revive a claim a release ended.
RENEW = """
UPDATE workflow_claim
   SET alive_until = LEAST(now() + alive_for, held_until)
 WHERE workflow = %(workflow)s AND token = %(token)s
RETURNING token
"""

# Lowering both deadlines to now (never raising them) frees the workflow at once for good.
RELEASE = """
UPDATE workflow_claim
   SET held_until = LEAST(held_until, now()),
       alive_until = LEAST(alive_until, now())
 WHERE workflow = %(workflow)s AND token = %(token)s
"""

# discard's first half: a new token fences every pass in flight, and lapsing the claim lets the
# id be claimed at once. It runs first so its row lock orders it after any record in flight.
RAISE_FENCE = """
UPDATE workflow_claim
   SET token = GREATEST(token + 1, nextval('workflow_token_seq')),
       held_until = LEAST(held_until, now()),
       alive_until = LEAST(alive_until, now())
 WHERE workflow = %(workflow)s
"""

# discard's second half, a new statement and so a new snapshot: it sees every record that was
# committed by a pass that held the claim row before the fence went up.
FORGET = "DELETE FROM workflow_checkpoint WHERE workflow = %(workflow)s"

# -- records --------------------------------------------------------------------------------

ORDER_LOCK = 0x77645F6F
"""The class id of the per-workflow advisory lock every statement that inserts a record takes
("wd_o" in ASCII; the second key is ``hashtext(workflow)``). Two-key advisory locks live apart
from one-key ones such as ``schema.MIGRATE_LOCK``."""

# A record's seq is drawn at insert and its row becomes visible at commit, so two writers of one
# workflow can commit in the opposite order to their seqs, and a load between the two commits
# shows the higher one without the lower one: a record appears *before* records an earlier load
# returned, and a cursor walking the inbox skips it for good. Taking this transaction-scoped lock
# before the seq is drawn, and holding it to commit, makes a workflow's writers draw and commit
# one at a time, so commit order is seq order and every load is a prefix of every later load.
# Every statement that inserts a record takes it last, after any claim row lock it takes (lock
# order: claim row, then this), and waits for nothing afterwards but its own row (or the queue row
# PostgresDurable schedules in the same transaction), so it adds no deadlock cycle. A hash collision
# only makes two workflows take turns. The cost: writers of one workflow serialize through their
# commits (see the append figures in docs/results/benchmarks.md); writers of different workflows do not.
TAKE_TURN = f"pg_advisory_xact_lock({ORDER_LOCK}, hashtext(%(workflow)s))"

# The fence is an UPDATE, not a read: it takes the claim row's lock, so a claim committing while
# this runs is waited for and the row re-read, and the token compared is the newest. The token in
# its WHERE means a refused write renews nobody; an accepted one renews its own window. The no-op
# DO UPDATE hands back the stored row even when a concurrent writer committed it after this
# statement began, and seq/written_at keep their insert-time defaults. won compares the two
# values' jsonb text: normalized, so key order and whitespace do not matter, but, unlike jsonb's
# `=`, 1 and 1.0 differ (numeric keeps its scale), as the caller would get back a different value.
# The turn (see TAKE_TURN) reads the fence's row: taken only by an accepted write, after the claim
# row's lock, and before the seq default of the row it passes on.
RECORD = f"""
WITH fence AS (
    UPDATE workflow_claim
       SET alive_until = LEAST(now() + alive_for, held_until)
     WHERE workflow = %(workflow)s AND token = %(token)s
    RETURNING workflow
), turn AS (
    SELECT fence.workflow, {TAKE_TURN} FROM fence
)
INSERT INTO workflow_checkpoint AS cp (workflow, key, value)
SELECT turn.workflow, %(key)s, %(value)s::jsonb FROM turn
ON CONFLICT (workflow, key) DO UPDATE SET value = cp.value
RETURNING cp.value::text, cp.value::text = %(value)s::jsonb::text
"""

# RECORD without the fence: from outside a pass, first writer wins. The turn is a CTE the INSERT
# reads its row from, so the lock is taken before the seq default is evaluated for that row.
SUPPLY = f"""
WITH turn AS (SELECT {TAKE_TURN})
INSERT INTO workflow_checkpoint AS cp (workflow, key, value)
SELECT %(workflow)s, %(key)s, %(value)s::jsonb FROM turn
ON CONFLICT (workflow, key) DO UPDATE SET value = cp.value
RETURNING cp.value::text, cp.value::text = %(value)s::jsonb::text
"""

# Concurrent writers make "count, then insert" a race both can win, so the number comes from the
# sequence. It is drawn once and spent twice, as the key and as seq, so key order and load order
# are one order. Gaps are fine: keys only need to sort within a workflow. The number is drawn
# from the turn's row, so only once this transaction holds the workflow's turn (see TAKE_TURN).
APPEND = f"""
WITH turn AS (SELECT {TAKE_TURN}),
     drawn AS (SELECT nextval('workflow_seq') AS seq FROM turn)
INSERT INTO workflow_checkpoint (workflow, key, value, seq)
SELECT %(workflow)s, '{INBOX_PREFIX}' || lpad(drawn.seq::text, {INBOX_DIGITS}, '0'),
       %(value)s::jsonb, drawn.seq
  FROM drawn
RETURNING key
"""

# seq, not the heap, is the record order: a no-op conflict update rewrites and moves a tuple.
LOAD = """
SELECT key, value::text, written_at FROM workflow_checkpoint
 WHERE workflow = %(workflow)s
 ORDER BY seq
"""

# -- transact -------------------------------------------------------------------------------

# Already recorded: hand it back and perform nothing.
LOOKUP = """
SELECT value::text FROM workflow_checkpoint WHERE workflow = %(workflow)s AND key = %(key)s
"""

# The first fence read takes no lock: it only stops a superseded pass before its effect, and
# leaves the claim row free for the worker's own renewals while the effect runs.
PEEK_FENCE = "SELECT token FROM workflow_claim WHERE workflow = %(workflow)s"

# The second read locks, after the effect: a pass superseded meanwhile is refused here and its
# effect rolls back. clock_timestamp(), since now() is when the (possibly long) transaction began.
LOCK_FENCE = """
UPDATE workflow_claim
   SET alive_until = LEAST(clock_timestamp() + alive_for, held_until)
 WHERE workflow = %(workflow)s AND token = %(token)s
RETURNING token
"""

# DO NOTHING: if a racing transact of this key committed first, no row comes back and this one
# rolls its effect back (exactly once). The turn (see TAKE_TURN) comes after LOCK_FENCE's claim
# row lock and is held only for the insert and the commit, not across the effect.
TRANSACT_PUT = f"""
WITH turn AS (SELECT {TAKE_TURN})
INSERT INTO workflow_checkpoint (workflow, key, value)
SELECT %(workflow)s, %(key)s, %(value)s::jsonb FROM turn
ON CONFLICT (workflow, key) DO NOTHING
RETURNING value::text
"""


# Opened before the effect and closed with the record: while the row lives, any COMMIT fails at
# its deferred trigger (see schema.py), so an effect cannot commit its writes without the record.
GUARD_OPEN = "INSERT INTO workflow_transact_guard (nonce) VALUES (%(nonce)s)"

# Finding the row again is the proof the effect's transaction is still this one: a ROLLBACK (or a
# failed COMMIT) took it away, and a transaction begun after that does not see it.
GUARD_CLOSE = "DELETE FROM workflow_transact_guard WHERE nonce = %(nonce)s RETURNING nonce"


class _LostRace(Exception):
    """Internal: a concurrent transact recorded the key first; roll this one back."""


class _EffectRaised(Exception):
    """Internal: carries a driver error the caller's effect raised past the store boundary, so the
    caller sees its own error rather than a ``StoreError``."""

    def __init__(self, original: psycopg.Error) -> None:
        super().__init__(str(original))
        self.original = original


class PostgresCheckpointer:
    """``Checkpointer[PostgresEffect]`` over the tables ``migrate`` creates, through ``pool``.

    ``codec`` must render JSON text (values are jsonb; a codec that does not is refused here).
    ``won`` compares the two values as jsonb, so encodings that differ only in key order or
    whitespace agree (numbers keep their written scale: ``1`` and ``1.0`` do not). Ids, keys and
    values may hold any text but NUL; a float jsonb would hand back as an integer (magnitude 1e16
    or more) is refused. Every time is the server's.
    """

    # The statements, as class attributes so a variant (a mutant in the harness's catalogue, or a
    # dialect tweak) is a one-line subclass; each is the module constant of the same name.
    CLAIM = CLAIM
    CLAIM_OWNED = CLAIM_OWNED
    RENEW = RENEW
    RELEASE = RELEASE
    RAISE_FENCE = RAISE_FENCE
    FORGET = FORGET
    RECORD = RECORD
    SUPPLY = SUPPLY
    APPEND = APPEND
    LOAD = LOAD
    LOOKUP = LOOKUP
    PEEK_FENCE = PEEK_FENCE
    LOCK_FENCE = LOCK_FENCE
    TRANSACT_PUT = TRANSACT_PUT
    GUARD_OPEN = GUARD_OPEN
    GUARD_CLOSE = GUARD_CLOSE

    def __init__(
        self,
        pool: Pool,
        *,
        codec: CheckpointCodec[Any] | None = None,
        max_value_bytes: int = MAX_VALUE_BYTES,
        batch_appends: bool = True,
        failover: Presence | None = None,
    ) -> None:
        self.pool = pool
        self.failover = failover
        """Fast failover (opt-in; see ``failover``): the presence whose id each claim records,
        and with it, claims take over live claims whose owner's presence is gone. None: leases
        only."""
        self.codec: CheckpointCodec[Any] = codec if codec is not None else JsonCodec()
        check_codec(self.codec)
        verify_codec(self.codec)
        self.max_value_bytes = max_value_bytes
        self.batch_appends = batch_appends
        """Whether ``append`` calls made concurrently share one transaction (see ``append``)."""
        self._appends = AppendBatcher(self)

    # -- input ------------------------------------------------------------------------------

    def _workflow(self, workflow: str) -> str:
        check_workflow(workflow)
        check_text(workflow)
        return workflow

    def _key(self, workflow: str, key: str) -> str:
        check_key(workflow, key)
        check_text(workflow, key)
        return key

    def _encode(self, workflow: str, key: str, value: object) -> str:
        encoded = encode_value(self.codec, workflow, key, value, self.max_value_bytes)
        return check_encoded(workflow, key, encoded)

    def _recorded(self, row: tuple[Any, ...]) -> Recorded:
        return Recorded(self.codec.decode(row[0]), bool(row[1]))

    # -- the claim ----------------------------------------------------------------------------

    async def claim(self, workflow: str, *, alive: timedelta, budget: timedelta) -> Pass:
        """See ``Checkpointer.claim``."""
        self._workflow(workflow)
        check_lease(workflow, alive, budget)
        params: dict[str, Any] = {"workflow": workflow, "alive": alive, "budget": budget}
        query = self.CLAIM
        if self.failover is not None:
            query, params["owner"] = self.CLAIM_OWNED, self.failover.owner
        async with statement(
            self.pool, f"claiming {workflow!r}", workflow
        ) as conn:  # one statement: autocommit
            row = await (await conn.execute(query, params)).fetchone()
        if row is None:
            raise Contended(workflow)
        return Pass(workflow, int(row[0]))

    async def renew(self, pass_: Pass) -> None:
        """See ``Checkpointer.renew``."""
        check_pass(pass_)
        self._workflow(pass_.workflow)
        params = {"workflow": pass_.workflow, "token": pass_.token}
        async with connect(self.pool, f"renewing {pass_.workflow!r}", pass_.workflow) as conn:
            row = await (await conn.execute(self.RENEW, params)).fetchone()
        if row is None:
            raise Fenced(pass_.workflow, pass_.token)

    async def release(self, pass_: Pass) -> None:
        """See ``Checkpointer.release``: a superseded pass releases nothing, silently."""
        check_pass(pass_)
        self._workflow(pass_.workflow)
        params = {"workflow": pass_.workflow, "token": pass_.token}
        async with connect(self.pool, f"releasing {pass_.workflow!r}", pass_.workflow) as conn:
            await conn.execute(self.RELEASE, params)

    async def discard(self, workflow: str) -> None:
        """See ``Checkpointer.discard``: one transaction that raises the token (keeping the claim
        row, the fence a pass in flight is measured against), lapses the claim, and deletes every
        record."""
        self._workflow(workflow)
        async with connect(self.pool, f"discarding {workflow!r}", workflow) as conn:
            await self._discard_on(conn, workflow)

    async def _discard_on(self, conn: psycopg.AsyncConnection[Any], workflow: str) -> None:
        await conn.execute(self.RAISE_FENCE, {"workflow": workflow})
        await conn.execute(self.FORGET, {"workflow": workflow})

    # -- records ------------------------------------------------------------------------------

    async def record(self, pass_: Pass, key: str, value: object) -> Recorded:
        """See ``Checkpointer.record``: one statement, the fence and the write together."""
        check_pass(pass_)
        workflow = self._workflow(pass_.workflow)
        self._key(workflow, key)
        encoded = self._encode(workflow, key, value)
        params = {"workflow": workflow, "token": pass_.token, "key": key, "value": encoded}
        async with connect(self.pool, f"recording {workflow!r}/{key!r}", workflow, key) as conn:
            row = await (await conn.execute(self.RECORD, params)).fetchone()
        if row is None:
            raise Fenced(workflow, pass_.token)
        return self._recorded(row)

    async def supply(self, workflow: str, key: str, value: object) -> Recorded:
        """See ``Checkpointer.supply``."""
        self._workflow(workflow)
        self._key(workflow, key)
        encoded = self._encode(workflow, key, value)
        async with connect(self.pool, f"supplying {workflow!r}/{key!r}", workflow, key) as conn:
            return await self._supply_on(conn, workflow, key, encoded)

    async def _supply_on(
        self, conn: psycopg.AsyncConnection[Any], workflow: str, key: str, encoded: str
    ) -> Recorded:
        params = {"workflow": workflow, "key": key, "value": encoded}
        row = await (await conn.execute(self.SUPPLY, params)).fetchone()
        assert row is not None  # an upsert with DO UPDATE always returns its row
        return self._recorded(row)

    async def append(self, workflow: str, value: object) -> str:
        """See ``Checkpointer.append``: keys come from the shared ``workflow_seq`` sequence, so
        they have gaps and sort within a workflow, and each key's number is its load position.

        An append alone is one autocommit statement. With ``batch_appends`` (the default), appends
        made while others are waiting or in flight are sent together as one transaction, one
        commit and one round trip for all of them (group commit; at most two such batches in
        flight per checkpointer). Each caller still gets its own key or error: a batch the server
        refused is sent again one append at a time, so a value the server cannot take fails only
        its own call; a batch cut off (the connection failed) leaves each of its callers not
        knowing, as for an append alone; a caller cancelled before its batch went out appended
        nothing."""
        self._workflow(workflow)
        encoded = self._encode(workflow, INBOX_PREFIX, value)
        if self.batch_appends:
            return await self._appends.append(workflow, encoded)
        return await self._append_alone(workflow, encoded)

    async def _append_alone(
        self, workflow: str, encoded: str, *, wanted: Callable[[], bool] | None = None
    ) -> str:
        # One statement: autocommit makes it its own transaction in one round trip. ``wanted``
        # (the batcher's) is asked once the connection is held: a caller that gave up while this
        # waited for it is never sent.
        async with statement(self.pool, f"appending to {workflow!r}", workflow, INBOX_PREFIX) as conn:
            if wanted is not None and not wanted():
                raise _NotWanted()
            return await self._append_on(conn, workflow, encoded)

    async def _append_on(self, conn: psycopg.AsyncConnection[Any], workflow: str, encoded: str) -> str:
        params = {"workflow": workflow, "value": encoded}
        row = await (await conn.execute(self.APPEND, params)).fetchone()
        assert row is not None  # an INSERT ... SELECT of one drawn row returns it
        return str(row[0])

    async def _rows(self, workflow: str) -> list[tuple[str, object, datetime]]:
        self._workflow(workflow)
        async with statement(
            self.pool, f"loading {workflow!r}", workflow
        ) as conn:  # one statement: autocommit
            rows = await (await conn.execute(self.LOAD, {"workflow": workflow})).fetchall()
        # The session's TimeZone decides the tzinfo psycopg attaches; callers get UTC either way.
        return [(str(k), self.codec.decode(v), at.astimezone(UTC)) for k, v, at in rows]

    async def load(self, workflow: str) -> dict[str, object]:
        """See ``Checkpointer.load``: in ``seq`` order, the order each key was first recorded."""
        return {key: value for key, value, _ in await self._rows(workflow)}

    async def history(self, workflow: str) -> list[Entry]:
        """See ``Checkpointer.history``: ``written_at`` is the server's clock_timestamp() at the
        winning insert, or the workflow's latest record's if that is later (a server clock stepped
        back), so it never goes backward along the history."""
        return [Entry(key, value, at) for key, value, at in await self._rows(workflow)]

    # -- transact -----------------------------------------------------------------------------

    async def transact(self, pass_: Pass, key: str, effect: PostgresEffect) -> Recorded:
        """See ``Checkpointer.transact``: one transaction. A plain fence read, ``effect`` with
        this transaction's cursor, a locked fence re-read that renews, then the insert. If a racing
        transact of the same key committed first, this one rolls its effect back and returns the
        stored value with ``won=False``.

        The effect must not end the transaction. While it runs a guard row is open (see
        ``schema.py``), and the server refuses any COMMIT (``END``, ``COMMIT AND CHAIN``,
        ``PREPARE TRANSACTION``, a commit inside a multi-statement string or a procedure) until
        the record closes it, so what the effect wrote can only commit with its record. After the
        effect the guard must still be there; if the effect committed, rolled back or began anew,
        the whole transaction is rolled back and ``StoreError`` names the workflow and key. The
        cursor it is handed refuses to run anything once the transaction has ended. What is not
        stopped: an effect that rolls back (discarding its own writes and the guard) and then
        commits new writes in one multi-statement string, or on ``cursor.connection`` or another
        connection; those writes are its own and unrecorded.
        ``SET CONSTRAINTS ALL IMMEDIATE`` inside an effect fires the guard early, so it is
        refused too: name the constraints instead."""
        check_pass(pass_)
        workflow = self._workflow(pass_.workflow)
        self._key(workflow, key)
        where = f"transacting {workflow!r}/{key!r}"
        params: dict[str, Any] = {
            "workflow": workflow,
            "key": key,
            "token": pass_.token,
            "nonce": uuid.uuid4().hex,
        }
        try:
            async with connect(self.pool, where, workflow, key) as conn:
                row = await (await conn.execute(self.LOOKUP, params)).fetchone()
                if row is not None:
                    return Recorded(self.codec.decode(row[0]), False)
                row = await (await conn.execute(self.PEEK_FENCE, params)).fetchone()
                if row is None or int(row[0]) != pass_.token:
                    raise Fenced(workflow, pass_.token)
                await self._open_guard(conn, params)
                async with _EffectCursor(conn, row_factory=conn.row_factory) as cursor:
                    try:
                        result = await effect(cursor)
                    except BaseException as exc:
                        if _ended(conn) or _guard_fired(exc):
                            raise _effect_ended(workflow, key) from exc
                        if isinstance(exc, psycopg.Error):
                            raise _EffectRaised(exc) from exc
                        raise
                if _ended(conn) or await (await conn.execute(self.GUARD_CLOSE, params)).fetchone() is None:
                    raise _effect_ended(workflow, key)
                params["value"] = self._encode(workflow, key, result)
                if await (await conn.execute(self.LOCK_FENCE, params)).fetchone() is None:
                    raise Fenced(workflow, pass_.token, "superseded while its effect ran")
                row = await (await conn.execute(self.TRANSACT_PUT, params)).fetchone()
                if row is None:
                    raise _LostRace
                return Recorded(self.codec.decode(row[0]), True)
        except _EffectRaised as raised:
            raise raised.original from None
        except _LostRace:
            pass
        async with connect(self.pool, where, workflow, key) as conn:
            row = await (await conn.execute(self.LOOKUP, params)).fetchone()
        if row is None:  # the winner's record is gone: only a discard does that, which fences
            raise Fenced(workflow, pass_.token, "the workflow was discarded")
        return Recorded(self.codec.decode(row[0]), False)

    async def _open_guard(self, conn: psycopg.AsyncConnection[Any], params: dict[str, Any]) -> None:
        try:
            await conn.execute(self.GUARD_OPEN, params)
        except pg_errors.UndefinedTable as exc:
            raise SchemaMismatch(
                f"workflow {params['workflow']!r}, key {params['key']!r}: transact needs the "
                "workflow_transact_guard table, which this database lacks; run "
                "without_durability_postgres.migrate(pool) once (it only adds what is missing)"
            ) from exc


class _EffectCursor(psycopg.AsyncCursor[Any]):
    """The cursor a transact effect gets: before and after each statement it checks, without a
    round trip, that the transaction is still open, so an effect that rolled back is stopped
    before it can write (and commit) anything more through this cursor, even if it swallows the
    error."""

    async def execute(  # Any: psycopg overloads query on Template; this passes either through
        self,
        query: Any,
        params: Any = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> Self:
        self._still_open()
        await super().execute(query, params, prepare=prepare, binary=binary)
        self._still_open()
        return self

    async def executemany(self, query: Query, params_seq: Iterable[Params], *, returning: bool = False) -> None:
        self._still_open()
        await super().executemany(query, params_seq, returning=returning)
        self._still_open()

    def _still_open(self) -> None:
        if _ended(self.connection):
            raise _TransactionEnded


class _TransactionEnded(Exception):
    """Internal: the effect's statement ended its transaction; transact reports it."""


def _ended(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether the connection is out of the transaction transact opened (no round trip)."""
    return conn.info.transaction_status == pq.TransactionStatus.IDLE


def _guard_fired(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is the guard refusing a commit."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, pg_errors.InvalidTransactionTermination):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _effect_ended(workflow: str, key: str) -> StoreError:
    return StoreError(
        f"workflow {workflow!r}, key {key!r}: the transact effect tried to end the transaction it "
        "shares with the record (COMMIT, ROLLBACK, END or BEGIN); an effect must not. The "
        "transaction was rolled back: nothing it wrote was kept and nothing was recorded"
    )


def _typecheck(pool: Pool) -> None:  # pragma: no cover - mypy proves it meets the protocol
    c: Checkpointer[PostgresEffect] = PostgresCheckpointer(pool)
    del c
