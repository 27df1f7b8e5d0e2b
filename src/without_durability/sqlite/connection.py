"""One connection to one SQLite file, on a thread of its own (see the package docstring)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from ..errors import (
    InvalidInput,
    SchemaMismatch,
    StoreError,
    StoreUnavailable,
)
from .schema import _SCHEMA, _TABLES, _UPGRADABLE, _UPGRADE, APPLICATION_ID, SCHEMA_VERSION

T = TypeVar("T")

DEFAULT_BUSY_TIMEOUT = timedelta(seconds=30)
"""How long a statement waits for another process's write lock before failing."""



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
        self._executor = self._new_executor()
        opened = self._executor.submit(self._open)

        def shut_down_if_failed(done: concurrent.futures.Future[None]) -> None:
            if done.exception() is not None:
                self._closed = True
                self._executor.shutdown(wait=False)

        opened.add_done_callback(shut_down_if_failed)
        return opened

    def _new_executor(self) -> concurrent.futures.Executor:
        """Where this connection's statements run: one thread of its own (a subclass may run them
        elsewhere, as ``SteppedSqliteConnection`` does on the event loop)."""
        return concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"wd-sqlite:{self.path.name}"
        )

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
                    for row in db.execute(
                        f"SELECT name FROM sqlite_schema WHERE name IN ({', '.join('?' * len(_TABLES))})", _TABLES
                    )
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
                # Versions 1 and 2 have the same tables (what the claim deadlines are measured on
                # changed, and the claim statement already reads the old ones as lapsed); version 3
                # adds the take numbers (see SCHEMA_VERSION)
                if "take_count" not in {row[0] for row in db.execute("SELECT name FROM sqlite_schema")}:
                    for statement in _UPGRADE:
                        db.execute(statement)
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
