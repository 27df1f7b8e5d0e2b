"""The SQLite ``Checkpointer``: claims, records and the transact effect's guard."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .._values import Entry, Pass, Recorded
from ..clock import Clock, LeaseClock, lease_clock_for, system_clock
from ..codec import CheckpointCodec, JsonCodec, verify_codec
from ..errors import (
    Contended,
    Fenced,
    InvalidInput,
    StoreError,
)
from ..rules import (
    INBOX_PREFIX,
    MAX_VALUE_BYTES,
    check_key,
    check_lease,
    check_pass,
    check_workflow,
    encode_value,
)
from .connection import SqliteConnection, _EffectRaised
from .schema import _datetime, _micros, _span
from .statements import (
    APPEND,
    CLAIM,
    DISCARD_FENCE,
    DISCARD_RECORDS,
    FENCE_AND_RENEW,
    FENCE_HOLDS,
    LOAD,
    PUT,
    RELEASE,
    STORED,
)

SqliteEffect = Callable[[sqlite3.Cursor], object]
"""A SQLite transact effect: a plain function handed a cursor inside the open write transaction.
Whatever it writes commits with the record, or rolls back with it. It must not commit, roll back or
begin a transaction itself: SQLite refuses those statements while it runs, and ``transact`` then
raises ``StoreError`` with nothing kept (savepoints of its own are fine, under any name but
``wd_transact_effect``, which the guard reserves)."""


_EFFECT_SAVEPOINT = "wd_transact_effect"


def _guarded(cur: sqlite3.Cursor, effect: SqliteEffect, workflow: str, key: str) -> object:
    """Run a transact ``effect`` so that it cannot end the write transaction it shares with the
    record: while it runs, SQLite itself refuses to prepare BEGIN, COMMIT, END or ROLLBACK (and
    anything using the name of the savepoint set around it, which the guard reserves), through any
    cursor of the connection, ``executescript``'s implicit COMMIT and ``Connection.commit()``
    included. An effect that tried
    gets a ``StoreError`` naming the workflow and key, whatever it did with the refusal, and the
    whole transaction rolls back. The savepoint, released after the effect, is the second check:
    if the transaction ended anyway (the authorizer replaced), the release fails."""
    db = cur.connection
    refused: list[str] = []

    def authorize(action: int, arg1: str | None, arg2: str | None, *_: str | None) -> int:
        # The guard's savepoint name is reserved outright: an effect's savepoint of that name
        # would be what the guard's RELEASE releases, and a table or column so named is refused
        # too, so no reading of the name can be turned against the guard.
        if action == sqlite3.SQLITE_TRANSACTION or _EFFECT_SAVEPOINT in (arg1, arg2):
            refused.append(f"{arg1 or ''} {arg2 or ''}".strip())
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    def ended(what: str) -> StoreError:
        return StoreError(
            f"workflow {workflow!r}, key {key!r}: the transact effect tried to end the "
            f"transaction it shares with the record, or to use the name {_EFFECT_SAVEPOINT} the "
            f"guard reserves ({what}); an effect must not COMMIT, ROLLBACK, BEGIN or END, nor name "
            f"anything {_EFFECT_SAVEPOINT}. Nothing it wrote was kept and nothing was recorded"
        )

    cur.execute(f"SAVEPOINT {_EFFECT_SAVEPOINT}")
    # Setting an authorizer expires every prepared statement, so a cached COMMIT is re-checked too.
    db.set_authorizer(authorize)
    try:
        result = effect(cur)
    except BaseException as exc:
        if refused:
            raise ended(refused[0]) from exc
        raise _EffectRaised(exc) from exc
    finally:
        db.set_authorizer(None)
    if refused:
        raise ended(refused[0])
    try:
        cur.execute(f"RELEASE {_EFFECT_SAVEPOINT}")
    except sqlite3.OperationalError as exc:  # no such savepoint: the transaction was ended
        raise ended("its savepoint is gone") from exc
    if not db.in_transaction:
        raise ended("no transaction is open after it")
    return result


def _fenced_unless(row: Any, pass_: Pass) -> None:
    if row is None:
        raise Fenced(pass_.workflow, pass_.token)



class SqliteCheckpointer:
    """``Checkpointer[SqliteEffect]`` over a ``SqliteConnection``. See the module docstring.

    ``codec`` must encode to ``str`` (the column is TEXT); the default is ``JsonCodec``. ``clock``
    stamps records; ``lease_clock`` (default: see ``lease_clock_for``) measures claims.
    """

    CLAIM = CLAIM
    """The claim statement (a class attribute, so a mutant can be a subclass with one statement)."""

    def __init__(
        self,
        conn: SqliteConnection,
        *,
        codec: CheckpointCodec[Any] | None = None,
        clock: Clock = system_clock,
        max_value_bytes: int = MAX_VALUE_BYTES,
        lease_clock: LeaseClock | None = None,
    ) -> None:
        if not isinstance(conn, SqliteConnection):
            raise InvalidInput(f"SqliteCheckpointer takes a SqliteConnection, got {conn!r}")
        self.conn = conn
        self.codec: CheckpointCodec[Any] = codec if codec is not None else JsonCodec()
        verify_codec(self.codec)
        self.clock = clock
        self.max_value_bytes = max_value_bytes
        self.lease_clock: LeaseClock = lease_clock if lease_clock is not None else lease_clock_for(clock)
        """What claim deadlines are measured on (microseconds): by default the monotonic clock
        under the system clock, or ``clock`` itself when one is injected."""

    def _lease_now(self) -> int:
        """Now on the clock claim deadlines are measured by (see the module docstring)."""
        return self.lease_clock()

    def _stamp(self) -> int:
        """Now on the wall clock, for ``written_at``."""
        return _micros(self.clock())

    def _encode(self, workflow: str, key: str, value: object) -> str:
        encoded = encode_value(self.codec, workflow, key, value, self.max_value_bytes)
        if not isinstance(encoded, str):
            raise InvalidInput(
                f"workflow {workflow!r}, key {key!r}: the SQLite store holds text, but the codec "
                f"encoded {type(encoded).__name__}; use a codec that encodes to str"
            )
        return encoded

    # -- the claim ---------------------------------------------------------------------------

    async def claim(self, workflow: str, *, alive: timedelta, budget: timedelta) -> Pass:
        """See ``Checkpointer.claim``."""
        check_workflow(workflow)
        check_lease(workflow, alive, budget)

        def job(cur: sqlite3.Cursor) -> int | None:
            now = self._lease_now()
            row = cur.execute(
                self.CLAIM,
                {
                    "workflow": workflow,
                    "now": now,
                    "held_until": now + _span(budget),
                    "alive_until": now + min(_span(alive), _span(budget)),
                    "alive_for": _span(alive),
                },
            ).fetchone()
            return None if row is None else int(row[0])

        token = await self.conn.write(job)
        if token is None:
            raise Contended(workflow)
        return Pass(workflow, token)

    async def renew(self, pass_: Pass) -> None:
        """See ``Checkpointer.renew``."""
        check_pass(pass_)

        def job(cur: sqlite3.Cursor) -> None:
            params = {"workflow": pass_.workflow, "token": pass_.token, "now": self._lease_now()}
            _fenced_unless(cur.execute(FENCE_AND_RENEW, params).fetchone(), pass_)

        await self.conn.write(job)

    async def release(self, pass_: Pass) -> None:
        """See ``Checkpointer.release``: a superseded pass releases nothing, silently."""
        check_pass(pass_)

        def job(cur: sqlite3.Cursor) -> None:
            params = {"workflow": pass_.workflow, "token": pass_.token, "now": self._lease_now()}
            cur.execute(RELEASE, params)

        await self.conn.write(job)

    async def discard(self, workflow: str) -> None:
        """See ``Checkpointer.discard``."""
        check_workflow(workflow)

        def job(cur: sqlite3.Cursor) -> None:
            cur.execute(DISCARD_RECORDS, {"workflow": workflow})
            cur.execute(DISCARD_FENCE, {"workflow": workflow, "now": self._lease_now()})

        await self.conn.write(job)

    # -- records -------------------------------------------------------------------------------

    def _put(self, cur: sqlite3.Cursor, workflow: str, key: str, encoded: str, now: int) -> Recorded:
        params = {"workflow": workflow, "key": key, "value": encoded, "now": now}
        cur.execute(PUT, params)
        stored = cur.execute(STORED, params).fetchone()[0]
        return Recorded(self.codec.decode(stored), stored == encoded)

    async def record(self, pass_: Pass, key: str, value: object) -> Recorded:
        """See ``Checkpointer.record``."""
        check_pass(pass_)
        check_key(pass_.workflow, key)
        encoded = self._encode(pass_.workflow, key, value)

        def job(cur: sqlite3.Cursor) -> Recorded:
            params = {"workflow": pass_.workflow, "token": pass_.token, "now": self._lease_now()}
            _fenced_unless(cur.execute(FENCE_AND_RENEW, params).fetchone(), pass_)
            return self._put(cur, pass_.workflow, key, encoded, self._stamp())

        return await self.conn.write(job)

    def _supply_in(self, cur: sqlite3.Cursor, workflow: str, key: str, encoded: str) -> Recorded:
        return self._put(cur, workflow, key, encoded, self._stamp())

    def _prepare_supply(self, workflow: str, key: str, value: object) -> str:
        check_workflow(workflow)
        check_key(workflow, key)
        return self._encode(workflow, key, value)

    async def supply(self, workflow: str, key: str, value: object) -> Recorded:
        """See ``Checkpointer.supply``."""
        encoded = self._prepare_supply(workflow, key, value)
        return await self.conn.write(lambda cur: self._supply_in(cur, workflow, key, encoded))

    def _append_in(self, cur: sqlite3.Cursor, workflow: str, encoded: str) -> str:
        row = cur.execute(APPEND, {"workflow": workflow, "value": encoded, "now": self._stamp()})
        return str(row.fetchone()[0])

    def _prepare_append(self, workflow: str, value: object) -> str:
        check_workflow(workflow)
        return self._encode(workflow, INBOX_PREFIX, value)

    async def append(self, workflow: str, value: object) -> str:
        """See ``Checkpointer.append``: the key's number is the row's ``seq``, one more than the
        highest in the file when it was written."""
        encoded = self._prepare_append(workflow, value)
        return await self.conn.write(lambda cur: self._append_in(cur, workflow, encoded))

    async def _rows(self, workflow: str) -> list[tuple[str, str, int]]:
        check_workflow(workflow)

        def job(cur: sqlite3.Cursor) -> list[tuple[str, str, int]]:
            rows = cur.execute(LOAD, {"workflow": workflow})
            return [(str(k), str(v), int(t)) for k, v, t in rows]

        return await self.conn.read(job)

    async def load(self, workflow: str) -> dict[str, object]:
        """See ``Checkpointer.load``."""
        return {key: self.codec.decode(value) for key, value, _ in await self._rows(workflow)}

    async def history(self, workflow: str) -> list[Entry]:
        """See ``Checkpointer.history``."""
        return [
            Entry(key, self.codec.decode(value), _datetime(at))
            for key, value, at in await self._rows(workflow)
        ]

    def _perform(self, cur: sqlite3.Cursor, effect: SqliteEffect, workflow: str, key: str) -> object:
        """Run a transact effect so that it cannot end its transaction (see ``_guarded``); a
        method so a mutant can run it unguarded."""
        return _guarded(cur, effect, workflow, key)

    async def transact(self, pass_: Pass, key: str, effect: SqliteEffect) -> Recorded:
        """See ``Checkpointer.transact``. ``effect`` runs inside the write transaction, on the
        connection's thread; what it writes commits with the record or rolls back with it. The
        fence is checked before the effect and again after it, in the statement that renews, so an
        effect that superseded the pass (through the same cursor) is rolled back.

        The file's write lock is held while the effect runs, so every other writer (in any process)
        waits for it, up to its busy timeout: keep effects to a few statements."""
        check_pass(pass_)
        check_key(pass_.workflow, key)
        names = {"workflow": pass_.workflow, "key": key, "token": pass_.token}

        def job(cur: sqlite3.Cursor) -> Recorded:
            stored = cur.execute(STORED, names).fetchone()
            if stored is not None:
                return Recorded(self.codec.decode(stored[0]), False)
            _fenced_unless(cur.execute(FENCE_HOLDS, names).fetchone(), pass_)
            result = self._perform(cur, effect, pass_.workflow, key)
            encoded = self._encode(pass_.workflow, key, result)
            # after the effect: the renewal counts from, and the record is stamped, when it lands
            _fenced_unless(
                cur.execute(FENCE_AND_RENEW, {**names, "now": self._lease_now()}).fetchone(), pass_
            )
            return self._put(cur, pass_.workflow, key, encoded, self._stamp())

        return await self.conn.write(job)
