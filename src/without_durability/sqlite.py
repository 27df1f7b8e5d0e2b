"""The SQLite store: both interfaces over one file, safe for several worker processes at once.

Three tables and no mechanism of our own. SQLite admits one writer at a time, and every write
here is a transaction begun ``IMMEDIATE`` (the write lock is taken before the first read), so each
method's read-then-write runs alone and nothing can overtake it between the read and the write.
That single writer is also why ``append`` may name its key by counting: the highest ``seq`` plus
one, read in the statement that inserts, is a number no other writer can take meanwhile, and it is
both the key's number and the row's load position.

The file is opened in WAL mode (readers never wait on the writer) with a busy timeout, so a process
that finds the write lock held waits for it rather than failing. Statements run on one dedicated
thread per connection, so that wait never blocks the event loop (a worker's renewal tick shares it),
and the statements of one connection run one at a time in the order they were issued.

Times are read after the write lock is held, so the order of stamps is the order of commits, and
stored as integer microseconds, which compare exactly. Record and queue times are the process's wall
clock (microseconds since the Unix epoch), and a record is never stamped before the record loaded
ahead of it, so a wall clock stepped back cannot reverse a workflow's history. Claim deadlines are
on the machine's monotonic clock (``without_durability.clock``), so a step of the wall clock neither
lapses a live pass nor keeps a dead one holding; the monotonic clock restarts at boot, so a claim
row whose liveness lies further ahead than its own window could reach is from before a reboot and
counts as lapsed. An injected clock (tests) drives all of these.

What it asks of a deployment: every process on one machine (WAL needs shared memory, so no network
filesystems), which is also what makes the monotonic clock one clock for all of them. Two costs to
know. SQLite's busy wait is sleep-and-retry rather than a queue, so under a steady stream of writes
one process can wait its turn for a while (up to ``busy_timeout``, then ``StoreUnavailable``). And
a process stopped (SIGSTOP, a debugger) inside a write holds the lock, so every writer waits until
it resumes: that costs liveness, never the fence, since nobody can supersede a pass while its write
is open.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from ._values import Delivery, Entry, Pass, Recorded
from .clock import Clock, LeaseClock, epoch_micros, lease_clock_for, system_clock
from .codec import CheckpointCodec, JsonCodec, verify_codec
from .errors import (
    Contended,
    Fenced,
    InvalidInput,
    SchemaMismatch,
    StoreError,
    StoreUnavailable,
)
from .protocols import Checkpointer, Durable, Scheduler
from .rules import (
    INBOX_DIGITS,
    INBOX_PREFIX,
    MAX_VALUE_BYTES,
    check_key,
    check_lease,
    check_pass,
    check_time,
    check_visibility,
    check_workflow,
    encode_value,
)

T = TypeVar("T")

SqliteEffect = Callable[[sqlite3.Cursor], object]
"""A SQLite transact effect: a plain function handed a cursor inside the open write transaction.
Whatever it writes commits with the record, or rolls back with it. It must not commit, roll back or
begin a transaction itself: SQLite refuses those statements while it runs, and ``transact`` then
raises ``StoreError`` with nothing kept (savepoints of its own are fine)."""

SCHEMA_VERSION = 2
"""The schema this version reads and writes, kept in ``PRAGMA user_version``. Version 2 measures
claim deadlines on the monotonic clock; a version 1 file is upgraded in place when opened (its
tables are the same; its wall-clock deadlines read as from before a reboot, so its claims lapse and
their tokens, the fence, carry on)."""

_UPGRADABLE = (1,)

APPLICATION_ID = 0x57445331  # "WDS1": marks the file as this library's, in PRAGMA application_id

DEFAULT_BUSY_TIMEOUT = timedelta(seconds=30)
"""How long a statement waits for another process's write lock before failing."""

_TABLES = ("checkpoint", "claim", "queue")

# seq is named INTEGER PRIMARY KEY so it is the rowid itself: VACUUM keeps an explicitly declared
# one, and an insert that names no seq gets the highest plus one, like append's.
_SCHEMA = (
    """
    CREATE TABLE checkpoint (
        seq INTEGER PRIMARY KEY,
        workflow TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        written_at INTEGER NOT NULL,
        UNIQUE (workflow, key)
    )
    """,
    "CREATE INDEX checkpoint_order ON checkpoint (workflow, seq)",
    """
    CREATE TABLE claim (
        workflow TEXT PRIMARY KEY,
        token INTEGER NOT NULL,
        held_until INTEGER NOT NULL,
        alive_until INTEGER NOT NULL,
        alive_for INTEGER NOT NULL
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE queue (
        namespace TEXT NOT NULL,
        workflow TEXT NOT NULL,
        visibility INTEGER NOT NULL,
        PRIMARY KEY (namespace, workflow)
    ) WITHOUT ROWID
    """,
    "CREATE INDEX queue_due ON queue (namespace, visibility)",
)

# -- statements ---------------------------------------------------------------------------

# The WHERE on DO UPDATE is the "is it free" test: a live holder fails it, nothing changes, and
# RETURNING yields no row. Liveness equal to now counts as lapsed. No write sets liveness further
# ahead than its window from now, so a row beyond that was written before the monotonic clock
# restarted (a reboot, which ended every pass) and is free too.
CLAIM = """
INSERT INTO claim (workflow, token, held_until, alive_until, alive_for)
VALUES (:workflow, 1, :held_until, :alive_until, :alive_for)
ON CONFLICT (workflow) DO UPDATE
    SET token = claim.token + 1,
        held_until = excluded.held_until,
        alive_until = excluded.alive_until,
        alive_for = excluded.alive_for
    WHERE claim.alive_until <= :now OR claim.alive_until > :now + claim.alive_for
RETURNING token
"""

# The fence and the renewal in one statement: the token is in the WHERE, so a refused write renews
# nobody, and min() keeps liveness under the budget (and so under a release).
FENCE_AND_RENEW = """
UPDATE claim SET alive_until = min(:now + alive_for, held_until)
WHERE workflow = :workflow AND token = :token
RETURNING token
"""

RELEASE = """
UPDATE claim SET held_until = min(held_until, :now), alive_until = min(alive_until, :now)
WHERE workflow = :workflow AND token = :token
"""

FENCE_HOLDS = "SELECT 1 FROM claim WHERE workflow = :workflow AND token = :token"

DISCARD_RECORDS = "DELETE FROM checkpoint WHERE workflow = :workflow"

# Raise the token rather than delete the row: a deleted row would restart tokens at 1 and let a
# pass in flight outrank the next claim.
DISCARD_FENCE = """
UPDATE claim SET token = token + 1,
    held_until = min(held_until, :now), alive_until = min(alive_until, :now)
WHERE workflow = :workflow
"""

# Never before the workflow's latest record, so a wall clock stepped back cannot reverse history
# (the checkpoint_order index finds that record at once).
_STAMP = """max(:now, coalesce(
    (SELECT written_at FROM checkpoint WHERE workflow = :workflow ORDER BY seq DESC LIMIT 1), :now))"""

# First writer wins: a conflicting insert changes nothing, so seq and written_at stay the winner's.
PUT = f"""
INSERT INTO checkpoint (workflow, key, value, written_at)
VALUES (:workflow, :key, :value, {_STAMP})
ON CONFLICT (workflow, key) DO NOTHING
"""

STORED = "SELECT value FROM checkpoint WHERE workflow = :workflow AND key = :key"

# One number spent twice, as the key and as the load position, read in the statement that inserts
# (the IMMEDIATE transaction means no other writer can take the same number meanwhile).
APPEND = f"""
INSERT INTO checkpoint (seq, workflow, key, value, written_at)
SELECT next.seq, :workflow, '{INBOX_PREFIX}' || printf('%0{INBOX_DIGITS}d', next.seq), :value, {_STAMP}
FROM (SELECT coalesce(max(seq), 0) + 1 AS seq FROM checkpoint) AS next
RETURNING key
"""

LOAD = "SELECT key, value, written_at FROM checkpoint WHERE workflow = :workflow ORDER BY seq"

# The earlier of the queued and the asked-for time wins, and the row always moves, at least a
# microsecond earlier: a pass whose receipt is already in the past (slower than its visibility, or
# a wall clock stepped ahead) must find it gone, or its answer would delete this wakeup.
SCHEDULE = """
INSERT INTO queue (namespace, workflow, visibility) VALUES (:namespace, :workflow, :at)
ON CONFLICT (namespace, workflow) DO UPDATE
    SET visibility = min(queue.visibility - 1, excluded.visibility)
"""

NEXT_DUE = """
SELECT workflow FROM queue
WHERE namespace = :namespace AND visibility <= :now
ORDER BY visibility, workflow
LIMIT 1
"""

HIDE = "UPDATE queue SET visibility = :hidden WHERE namespace = :namespace AND workflow = :workflow"

# The receipt is the visibility the take set: if the row moved (a wakeup) or is gone (a cancel),
# these match nothing, so that wakeup stands and a cancelled workflow is not reinstated.
ANSWER_AGAIN = """
UPDATE queue SET visibility = :at
WHERE namespace = :namespace AND workflow = :workflow AND visibility = :taken
"""

ANSWER_DONE = """
DELETE FROM queue WHERE namespace = :namespace AND workflow = :workflow AND visibility = :taken
"""

CANCEL = "DELETE FROM queue WHERE namespace = :namespace AND workflow = :workflow"


# -- time -----------------------------------------------------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


_micros = epoch_micros


def _span(by: timedelta) -> int:
    return by // _MICRO


def _datetime(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


# -- the connection -------------------------------------------------------------------------


class _EffectRaised(BaseException):
    """Carries an exception out of a user's effect past the driver-error wrapping, unchanged."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(original)
        self.original = original


class SqliteConnection:
    """One connection to one SQLite file, shared by a checkpointer and a scheduler.

    Opening checks the file and creates the schema if the database is new: a missing folder, a file
    that is not an SQLite database, or a database holding another schema (or another application's
    ``user_version``) is refused with an error naming the file, and nothing in it is changed. The
    file is put in WAL mode with ``synchronous=FULL`` (a returned write survives a power cut).

    The constructor opens at once and blocks its caller while it does; in async code prefer
    ``await sqlite_connect(path)``, which does the same without blocking the event loop. Every
    statement runs on this connection's own thread, one at a time, in the order issued. Close with
    ``await conn.close()`` (or ``async with``).
    """

    path: Path
    busy_timeout: timedelta

    def __init__(
        self, path: str | os.PathLike[str], *, busy_timeout: timedelta = DEFAULT_BUSY_TIMEOUT
    ) -> None:
        self._start(path, busy_timeout).result()

    def _start(
        self, path: str | os.PathLike[str], busy_timeout: timedelta
    ) -> concurrent.futures.Future[None]:
        if not isinstance(busy_timeout, timedelta) or busy_timeout < timedelta(0):
            raise InvalidInput(f"busy_timeout must be a non-negative timedelta, got {busy_timeout!r}")
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self._db: sqlite3.Connection | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"wd-sqlite:{self.path.name}"
        )
        opened = self._executor.submit(self._open)

        def shut_down_if_failed(done: concurrent.futures.Future[None]) -> None:
            if done.exception() is not None:
                self._closed = True
                self._executor.shutdown(wait=False)

        opened.add_done_callback(shut_down_if_failed)
        return opened

    # Runs on the connection's thread, which owns the sqlite3 connection from here on.
    def _open(self) -> None:
        folder = self.path.parent
        if not folder.is_dir():
            raise InvalidInput(
                f"SQLite store {str(self.path)!r}: the folder {str(folder)!r} does not exist; "
                "create it first (the store creates the file, never folders)"
            )
        if self.path.is_dir():
            raise InvalidInput(f"SQLite store {str(self.path)!r} is a folder, not a database file")
        try:
            db = sqlite3.connect(self.path, timeout=self.busy_timeout.total_seconds(), isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite store {str(self.path)!r}: cannot open: {exc}") from exc
        try:
            self._prepare(db)
        except BaseException:
            db.close()
            raise
        self._db = db

    def _prepare(self, db: sqlite3.Connection) -> None:
        where = f"SQLite store {str(self.path)!r}"
        try:
            # Reading the header first: a file that is not a database fails here, before any write.
            version, app_id = self._identity(db)
        except sqlite3.OperationalError as exc:  # locked or unreadable: not a verdict on the file
            raise self._unavailable(exc, "read the database header") from exc
        except sqlite3.DatabaseError as exc:
            raise InvalidInput(
                f"{where} is not an SQLite database ({exc}); point the store at a new file or at "
                "one it created, it will not overwrite this one"
            ) from exc
        self._check_identity(version, app_id)
        try:
            if version != SCHEMA_VERSION:
                self._create_schema(db)
            # WAL lets readers run beside the one writer; the mode is kept in the file.
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{where}: could not switch to WAL mode (journal_mode is {mode})")
            db.execute("PRAGMA synchronous=FULL")
        except sqlite3.OperationalError as exc:
            raise self._unavailable(exc, "prepare the database") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"{where}: cannot prepare the database: {exc}") from exc

    @staticmethod
    def _identity(db: sqlite3.Connection) -> tuple[int, int]:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        app_id = int(db.execute("PRAGMA application_id").fetchone()[0])
        return version, app_id

    def _check_identity(self, version: int, app_id: int) -> None:
        where = f"SQLite store {str(self.path)!r}"
        if app_id not in (0, APPLICATION_ID) or (app_id == 0 and version != 0):
            raise SchemaMismatch(
                f"{where} belongs to another application (application_id {app_id}, "
                f"user_version {version}); use a separate file for without-durability"
            )
        if app_id == APPLICATION_ID and version != SCHEMA_VERSION and version not in _UPGRADABLE:
            raise SchemaMismatch(
                f"{where} holds schema version {version}; this version of without-durability "
                f"reads schema version {SCHEMA_VERSION}; nothing was changed (open it with the "
                "version that wrote it, or start a new file)"
            )

    def _create_schema(self, db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have created it while this one waited for the lock.
            version, app_id = self._identity(db)
            self._check_identity(version, app_id)
            if version == 0:
                names = {
                    row[0]
                    for row in db.execute("SELECT name FROM sqlite_schema WHERE name IN (?, ?, ?)", _TABLES)
                }
                if names:
                    raise SchemaMismatch(
                        f"SQLite store {str(self.path)!r} already has table(s) {sorted(names)} "
                        "but no without-durability schema version; nothing was changed "
                        "(use a new file, or rename those tables)"
                    )
                for statement in _SCHEMA:
                    db.execute(statement)
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            elif version in _UPGRADABLE:
                # Same tables; only what the claim deadlines are measured on changed (see
                # SCHEMA_VERSION), and the claim statement already reads the old ones as lapsed.
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def _unavailable(self, exc: sqlite3.Error, doing: str) -> StoreError:
        message = str(exc)
        if "locked" in message or "busy" in message:
            return StoreUnavailable(
                f"SQLite store {str(self.path)!r}: could not {doing}: another connection held the "
                f"write lock for longer than busy_timeout ({self.busy_timeout.total_seconds()}s)"
            )
        return StoreError(f"SQLite store {str(self.path)!r}: could not {doing}: {message}")

    def _require(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError(f"SQLite store {str(self.path)!r}: the connection is closed")
        return self._db

    # -- running statements ----------------------------------------------------------------

    def _write_now(self, job: Callable[[sqlite3.Cursor], T]) -> T:
        db = self._require()
        cursor = db.cursor()
        try:
            # IMMEDIATE takes the write lock before the first read, so the job's reads and writes
            # run with no other writer in between (a DEFERRED read could be overtaken).
            cursor.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise self._unavailable(exc, "begin a write transaction") from exc
        try:
            result = job(cursor)
            if not db.in_transaction:
                raise StoreError(
                    f"SQLite store {str(self.path)!r}: the transaction was ended inside a write "
                    "(a transact effect must not COMMIT, ROLLBACK or BEGIN)"
                )
            cursor.execute("COMMIT")
            return result
        except BaseException as exc:
            # a statement the job left unfinished would keep the next transaction from committing
            with contextlib.suppress(sqlite3.Error):
                cursor.close()
            if db.in_transaction:
                # If ROLLBACK itself fails, closing or the next BEGIN discards the transaction.
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            if isinstance(exc, _EffectRaised):
                raise exc.original from None
            if isinstance(exc, sqlite3.Error):
                raise self._unavailable(exc, "write") from exc
            raise

    def _read_now(self, job: Callable[[sqlite3.Cursor], T]) -> T:
        db = self._require()
        try:
            # A read transaction, so a job of several statements sees one snapshot.
            db.execute("BEGIN")
            try:
                return job(db.cursor())
            finally:
                if db.in_transaction:
                    db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._unavailable(exc, "read") from exc

    async def _submit(self, call: Callable[[], T]) -> T:
        with self._lock:
            if self._closed:
                raise StoreError(f"SQLite store {str(self.path)!r}: the connection is closed")
            future = self._executor.submit(call)
        return await asyncio.wrap_future(future)

    async def write(self, job: Callable[[sqlite3.Cursor], T]) -> T:
        """Run ``job`` inside one ``BEGIN IMMEDIATE`` transaction on this connection's thread and
        commit; any exception rolls everything back and is raised (a driver error as
        ``StoreError``/``StoreUnavailable``). No other process writes while ``job`` runs."""
        return await self._submit(lambda: self._write_now(job))

    async def read(self, job: Callable[[sqlite3.Cursor], T]) -> T:
        """Run ``job`` inside one read transaction (one snapshot) on this connection's thread."""
        return await self._submit(lambda: self._read_now(job))

    async def close(self) -> None:
        """Finish the statements already issued, then close the file. Closing twice is harmless."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            future = self._executor.submit(self._close_now)
        try:
            await asyncio.wrap_future(future)
        finally:
            self._executor.shutdown(wait=False)

    def _close_now(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    async def __aenter__(self) -> SqliteConnection:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"SqliteConnection({str(self.path)!r})"


async def sqlite_connect(
    path: str | os.PathLike[str], *, busy_timeout: timedelta = DEFAULT_BUSY_TIMEOUT
) -> SqliteConnection:
    """Open ``path`` as a ``SqliteConnection`` without blocking the event loop (see the class)."""
    conn = SqliteConnection.__new__(SqliteConnection)
    await asyncio.wrap_future(conn._start(path, busy_timeout))
    return conn


_EFFECT_SAVEPOINT = "wd_transact_effect"


def _guarded(cur: sqlite3.Cursor, effect: SqliteEffect, workflow: str, key: str) -> object:
    """Run a transact ``effect`` so that it cannot end the write transaction it shares with the
    record: while it runs, SQLite itself refuses to prepare BEGIN, COMMIT, END or ROLLBACK (and
    any release or rollback of the savepoint set around it), through any cursor of the connection,
    ``executescript``'s implicit COMMIT and ``Connection.commit()`` included. An effect that tried
    gets a ``StoreError`` naming the workflow and key, whatever it did with the refusal, and the
    whole transaction rolls back. The savepoint, released after the effect, is the second check:
    if the transaction ended anyway (the authorizer replaced), the release fails."""
    db = cur.connection
    refused: list[str] = []

    def authorize(action: int, arg1: str | None, arg2: str | None, *_: str | None) -> int:
        if action == sqlite3.SQLITE_TRANSACTION or (
            action == sqlite3.SQLITE_SAVEPOINT and arg1 != "BEGIN" and arg2 == _EFFECT_SAVEPOINT
        ):
            refused.append(f"{arg1 or ''} {arg2 or ''}".strip())
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    def ended(what: str) -> StoreError:
        return StoreError(
            f"workflow {workflow!r}, key {key!r}: the transact effect tried to end the "
            f"transaction it shares with the record ({what}); an effect must not COMMIT, ROLLBACK, "
            "BEGIN or END. Nothing it wrote was kept and nothing was recorded"
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


# -- the checkpointer -----------------------------------------------------------------------


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


# -- the scheduler --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Receipt:
    namespace: str
    visible_at: int


class SqliteScheduler:
    """``Scheduler`` over a ``SqliteConnection``: one row per (namespace, workflow), scored by the
    moment it becomes visible. The receipt of a delivery is the visibility its take set, so
    ``wake_at`` can tell its own delivery from a wakeup or a cancel that came since."""

    def __init__(
        self, conn: SqliteConnection, *, clock: Clock = system_clock, namespace: str = "default"
    ) -> None:
        if not isinstance(conn, SqliteConnection):
            raise InvalidInput(f"SqliteScheduler takes a SqliteConnection, got {conn!r}")
        if not isinstance(namespace, str) or not namespace:
            raise InvalidInput(f"scheduler namespace must be a non-empty string, got {namespace!r}")
        self.conn = conn
        self.clock = clock
        self.namespace = namespace

    async def now(self) -> datetime:
        """See ``Scheduler.now``: the process clock this scheduler was given."""
        return self.clock()

    def _schedule_in(self, cur: sqlite3.Cursor, workflow: str, at: datetime | None) -> None:
        when = _micros(at if at is not None else self.clock())
        cur.execute(SCHEDULE, {"namespace": self.namespace, "workflow": workflow, "at": when})

    async def schedule(self, workflow: str, at: datetime | None = None) -> None:
        """See ``Scheduler.schedule``."""
        check_workflow(workflow)
        check_time("schedule at", at)
        await self.conn.write(lambda cur: self._schedule_in(cur, workflow, at))

    async def take(self, visibility: timedelta) -> Delivery | None:
        """See ``Scheduler.take``: the earliest visible workflow of this namespace."""
        check_visibility(visibility)

        def job(cur: sqlite3.Cursor) -> Delivery | None:
            now = _micros(self.clock())
            row = cur.execute(NEXT_DUE, {"namespace": self.namespace, "now": now}).fetchone()
            if row is None:
                return None
            hidden = now + _span(visibility)
            params = {"namespace": self.namespace, "workflow": row[0], "hidden": hidden}
            cur.execute(HIDE, params)
            return Delivery(str(row[0]), _Receipt(self.namespace, hidden))

        return await self.conn.write(job)

    async def wake_at(self, delivery: Delivery, at: datetime | None) -> None:
        """See ``Scheduler.wake_at``."""
        check_time("wake_at at", at)
        receipt = delivery.receipt
        if not isinstance(receipt, _Receipt) or receipt.namespace != self.namespace:
            raise InvalidInput(
                f"{delivery!r} was not handed out by a SqliteScheduler of namespace {self.namespace!r}"
            )
        params = {
            "namespace": self.namespace,
            "workflow": delivery.workflow,
            "taken": receipt.visible_at,
            "at": None if at is None else _micros(at),
        }

        def job(cur: sqlite3.Cursor) -> None:
            cur.execute(ANSWER_DONE if at is None else ANSWER_AGAIN, params)

        await self.conn.write(job)

    async def cancel(self, workflow: str) -> None:
        """See ``Scheduler.cancel``."""
        check_workflow(workflow)
        params = {"namespace": self.namespace, "workflow": workflow}
        await self.conn.write(lambda cur: cur.execute(CANCEL, params))


# -- the durable ------------------------------------------------------------------------------


class SqliteDurable:
    """``Durable[SqliteEffect]`` whose transitions are each one commit: ``arrive`` records and
    queues, ``deliver`` appends and queues, ``discard`` forgets and cancels, in one transaction, so
    no process ever sees (or a crash ever leaves) one half without the other.

    Both stores must share one ``SqliteConnection``; anything else is refused at construction with
    ``InvalidInput``, since two connections cannot commit together.
    """

    def __init__(self, checkpointer: SqliteCheckpointer, scheduler: SqliteScheduler) -> None:
        if not isinstance(checkpointer, SqliteCheckpointer) or not isinstance(scheduler, SqliteScheduler):
            raise InvalidInput("SqliteDurable takes a SqliteCheckpointer and a SqliteScheduler")
        if checkpointer.conn is not scheduler.conn:
            raise InvalidInput(
                f"SqliteDurable needs its checkpointer and scheduler on one SqliteConnection, so "
                f"each transition is one commit; got {checkpointer.conn!r} and "
                f"{scheduler.conn!r} (build both from the same connection, or use SplitDurable)"
            )
        self._checkpointer = checkpointer
        self._scheduler = scheduler

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        clock: Clock = system_clock,
        codec: CheckpointCodec[Any] | None = None,
        namespace: str = "default",
        busy_timeout: timedelta = DEFAULT_BUSY_TIMEOUT,
        max_value_bytes: int = MAX_VALUE_BYTES,
        lease_clock: LeaseClock | None = None,
    ) -> SqliteDurable:
        """Open (creating if new) the store in ``path``: one connection, both halves on it.
        ``clock`` stamps records and times the queue; ``lease_clock`` measures claims (see
        ``SqliteCheckpointer``).

        An async classmethod: ``durable = await SqliteDurable.open(path)``, then
        ``await durable.close()`` (or ``async with``)."""
        conn = await sqlite_connect(path, busy_timeout=busy_timeout)
        try:
            return cls(
                SqliteCheckpointer(
                    conn, codec=codec, clock=clock, max_value_bytes=max_value_bytes, lease_clock=lease_clock
                ),
                SqliteScheduler(conn, clock=clock, namespace=namespace),
            )
        except BaseException:
            await conn.close()
            raise

    @property
    def conn(self) -> SqliteConnection:
        """The connection both halves share."""
        return self._checkpointer.conn

    @property
    def checkpointer(self) -> SqliteCheckpointer:
        """The checkpointer half."""
        return self._checkpointer

    @property
    def scheduler(self) -> SqliteScheduler:
        """The scheduler half."""
        return self._scheduler

    async def arrive(self, workflow: str, key: str, value: object) -> Recorded:
        """See ``Durable.arrive``: supply and schedule now, in one commit."""
        encoded = self._checkpointer._prepare_supply(workflow, key, value)

        def job(cur: sqlite3.Cursor) -> Recorded:
            recorded = self._checkpointer._supply_in(cur, workflow, key, encoded)
            self._scheduler._schedule_in(cur, workflow, None)
            return recorded

        return await self.conn.write(job)

    async def deliver(self, workflow: str, message: object) -> str:
        """See ``Durable.deliver``: append and schedule now, in one commit."""
        encoded = self._checkpointer._prepare_append(workflow, message)

        def job(cur: sqlite3.Cursor) -> str:
            key = self._checkpointer._append_in(cur, workflow, encoded)
            self._scheduler._schedule_in(cur, workflow, None)
            return key

        return await self.conn.write(job)

    async def discard(self, workflow: str) -> None:
        """See ``Durable.discard``: forget (raising the fence) and cancel, in one commit."""
        check_workflow(workflow)

        def job(cur: sqlite3.Cursor) -> None:
            cur.execute(DISCARD_RECORDS, {"workflow": workflow})
            cur.execute(DISCARD_FENCE, {"workflow": workflow, "now": self._checkpointer._lease_now()})
            cur.execute(CANCEL, {"namespace": self._scheduler.namespace, "workflow": workflow})

        await self.conn.write(job)

    async def close(self) -> None:
        """Close the shared connection."""
        await self.conn.close()

    async def __aenter__(self) -> SqliteDurable:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _typecheck() -> None:  # pragma: no cover - mypy proves the SQLite store meets the protocols
    conn = SqliteConnection(":memory:")
    c: Checkpointer[SqliteEffect] = SqliteCheckpointer(conn)
    s: Scheduler = SqliteScheduler(conn)
    d: Durable[SqliteEffect] = SqliteDurable(SqliteCheckpointer(conn), SqliteScheduler(conn))
    del c, s, d
