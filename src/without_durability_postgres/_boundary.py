"""The store boundary: what goes in (no NUL, JSON text) and what comes out when the driver fails.

Every public method enters the database through ``connect``, so a driver error reaches the caller as
a ``StoreError`` (or ``StoreUnavailable`` when the server cannot be reached, naming the DSN with its
password masked) with the driver's own exception kept as ``__cause__``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.abc import Query
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from without_durability.codec import CheckpointCodec
from without_durability.errors import (
    InvalidInput,
    InvalidKey,
    InvalidValue,
    InvalidWorkflowId,
    StoreError,
    StoreUnavailable,
)

Pool = AsyncConnectionPool[Any]

log = logging.getLogger("without_durability_postgres")

# jsonb cannot hold the escape for NUL; an even run of backslashes before it means it is not one.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

# A cheap first look for a number written with an exponent (only then is a full parse needed).
_EXPONENT = re.compile(r"[0-9][eE][+-]?[0-9]")


def masked_dsn(pool: Pool) -> str:
    """Where ``pool`` connects, with any password replaced by ``***``."""
    conninfo = pool.conninfo
    if not isinstance(conninfo, str):
        return "<conninfo supplied by a callable>"
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.Error:
        return "<unparseable conninfo>"
    if "password" in params:
        params["password"] = "***"
    kwargs = pool.kwargs if isinstance(pool.kwargs, dict) else {}
    params.update({k: v for k, v in kwargs.items() if k in ("host", "port", "dbname", "user")})
    return make_conninfo("", **params) or "<libpq defaults>"


# The server rolled the transaction back (a deadlock, a serialization failure): psycopg files
# these under OperationalError, but the server was reached and nothing was committed.
_ROLLED_BACK = (
    pg_errors.TransactionRollback
    | pg_errors.DeadlockDetected
    | pg_errors.SerializationFailure
    | pg_errors.TransactionIntegrityConstraintViolation
)


def wrap(exc: psycopg.Error, pool: Pool | None, what: str) -> StoreError:
    """The ``StoreError`` a caller sees for a driver error raised while doing ``what`` (the
    message names ``pool``'s server, password masked, when there is one)."""
    where = "Postgres" if pool is None else f"Postgres at {masked_dsn(pool)}"
    if isinstance(exc, PoolClosed):
        pooled = "" if pool is None else f" for {masked_dsn(pool)}"
        return StoreError(f"the connection pool{pooled} is closed ({what})")
    if isinstance(exc, psycopg.OperationalError) and not isinstance(
        exc, pg_errors.QueryCanceled | pg_errors.LockNotAvailable | _ROLLED_BACK
    ):
        return StoreUnavailable(
            f"{where} could not be reached, or the connection was lost, "
            f"while {what}: {exc}; check that the server is running and the DSN is right (a "
            "write interrupted this way may or may not have committed)"
        )
    return StoreError(f"Postgres failed while {what}: {type(exc).__name__}: {exc}")


@asynccontextmanager
async def connect(
    pool: Pool, what: str, workflow: str = "", key: str = ""
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A pooled connection inside one transaction, committed on success and rolled back on any
    exception; driver errors leave as ``StoreError`` (``InvalidValue`` when the server refused a
    value as jsonb), the driver's error kept as ``__cause__``. When no pooled connection comes
    free in time, one direct attempt tells a server that is down (``StoreUnavailable``) from a
    pool too small for the load (``StoreError``). Public as
    ``without_durability_postgres.errors.connect``."""
    try:
        async with pool.connection() as conn, conn.transaction():
            yield conn
    except PoolTimeout as exc:
        raise (await _timed_out(exc, pool, what)) from exc
    except psycopg.Error as exc:
        raise (refused_value(exc, workflow, key) or wrap(exc, pool, what)) from exc


def statement(pool: Pool, what: str, workflow: str = "", key: str = "") -> _Statement:
    """A pooled connection for exactly one statement, run in autocommit: the statement is its own
    transaction, as atomic as inside BEGIN/COMMIT but one round trip instead of three (the take
    path runs nothing else). The connection goes back to the pool as it came (one that cannot be
    put back so is closed, and the pool replaces it); errors are wrapped as in ``connect``."""
    return _Statement(pool, what, workflow, key)


class _Statement:
    """``statement``'s context manager. It wraps every append and take, so it is a class around
    ``getconn``/``putconn`` rather than generators around ``pool.connection()``: that costs half
    as much, and what ``connection()`` adds does nothing here (its commit on exit finds no
    transaction in autocommit; ``putconn`` rolls back, closes or discards a connection not left
    idle, and a broken one is never reused), except the pool's ``usage_ms`` statistic."""

    __slots__ = ("conn", "key", "pool", "switched", "what", "workflow")

    conn: psycopg.AsyncConnection[Any]
    switched: bool

    def __init__(self, pool: Pool, what: str, workflow: str, key: str) -> None:
        self.pool = pool
        self.what = what
        self.workflow = workflow
        self.key = key

    async def __aenter__(self) -> psycopg.AsyncConnection[Any]:
        pool = self.pool
        try:
            conn: psycopg.AsyncConnection[Any] = await pool.getconn()
        except PoolTimeout as exc:
            raise (await _timed_out(exc, pool, self.what)) from exc
        except psycopg.Error as exc:
            raise wrap(exc, pool, self.what) from exc
        # A pool configured with autocommit=True spares this switch (client-side, no round trip).
        self.switched = not conn.autocommit
        if self.switched:
            try:
                await conn.set_autocommit(True)
            except BaseException as exc:
                await pool.putconn(conn)
                if isinstance(exc, psycopg.Error):
                    raise self._wrapped(exc) from exc
                raise
        self.conn = conn
        return conn

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        conn = self.conn
        try:
            try:
                if self.switched and not conn.closed:
                    try:
                        await conn.set_autocommit(False)
                    except psycopg.Error:  # not idle (a query cut short): never hand it back switched
                        await conn.close()
            finally:
                await self.pool.putconn(conn)
        except psycopg.Error as failed:  # handing it back failed: wrapped too, the block's error first
            if exc is None:
                raise self._wrapped(failed) from failed
            log.debug("handing a connection back failed while %s", self.what, exc_info=failed)
        if isinstance(exc, psycopg.Error):
            raise self._wrapped(exc) from exc

    def _wrapped(self, exc: psycopg.Error) -> StoreError | InvalidInput:
        return refused_value(exc, self.workflow, self.key) or wrap(exc, self.pool, self.what)


Last = Callable[[], "tuple[Query, Mapping[str, Any]] | None"]


class Flight:
    """What ``one_flight`` yields: ``conn``, to queue the transaction's statements on; once the
    block has been left, ``committed`` (the server acknowledged the COMMIT) and ``last_queued``
    (``last`` gave a statement, which was queued as the transaction's last, so it committed
    exactly when the rest did)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self.committed = False
        self.last_queued = False


@asynccontextmanager
async def one_flight(
    pool: Pool,
    what: str,
    workflow: str = "",
    key: str = "",
    *,
    last: Last | None = None,
    begin: str | None = None,
) -> AsyncIterator[Flight]:
    """``connect``'s transaction, sent in pipeline mode: BEGIN, the statements the block executes
    on ``flight.conn`` and COMMIT leave together, behind one Sync, and their results come back
    together: one round trip however many statements. The block must only queue (``await
    conn.execute(...)``, keeping the cursors) and read the cursors after it; fetching inside
    forces a round trip of its own.

    The guarantees are ``connect``'s: all or nothing (an explicit BEGIN/COMMIT block, begun with
    the connection's configured isolation level), and a failure of any statement or of the commit
    rolls the whole transaction back and leaves as the ``StoreError`` / ``InvalidValue``
    ``connect`` raises, with the driver's first error (not the "pipeline aborted" that follows
    it) as ``__cause__``.

    ``last`` is called once the block's statements are queued, on a connection already held; the
    statement it returns (with its parameters), if any, is queued after them and before the
    COMMIT, as part of the same transaction: it commits, or fails and rolls back, with the rest.
    ``last_queued`` says whether it was.

    ``begin``, if given, replaces the BEGIN (for a transaction that needs its own isolation level).
    """
    # psycopg syncs the pipeline (a round trip apiece) for conn.transaction(), conn.commit() and
    # the BEGIN it sends by itself outside autocommit; so the connection is put in autocommit (no
    # round trip) and BEGIN and COMMIT are queued as plain statements: the pipeline's closing
    # Sync is the only wait. COMMIT's own result says whether it committed: after an error the
    # server skips everything up to the Sync, so an acknowledged COMMIT means every statement
    # before it succeeded.
    try:
        async with pool.connection() as conn:
            flight = Flight(conn)
            was_autocommit = conn.autocommit
            if not was_autocommit:
                await conn.set_autocommit(True)  # client-side only: no round trip
            failed: psycopg.Error | None = None
            commit: psycopg.AsyncCursor[Any] | None = None
            try:
                async with conn.pipeline():
                    try:
                        await conn.execute(begin or begin_statement(conn))
                        yield flight
                        closing = last() if last is not None else None
                        if closing is not None:
                            flight.last_queued = True
                            await conn.execute(*closing)
                        commit = await conn.execute("COMMIT")
                    except psycopg.Error as exc:  # seen while queuing: what follows it is skipped
                        failed = exc
            except psycopg.Error as exc:  # seen at the Sync; after an earlier error, only its echo
                failed = failed or exc
            finally:
                flight.committed = commit is not None and commit.pgresult is not None
                try:
                    if not conn.closed and conn.info.transaction_status != pq.TransactionStatus.IDLE:
                        await conn.rollback()  # a failed block stays open (aborted) past the Sync
                    if not was_autocommit and not conn.closed:
                        await conn.set_autocommit(False)
                except psycopg.Error:  # keep the block's own error; the pool replaces a closed one
                    await conn.close()
            if failed is not None and not flight.committed:
                raise failed
            if failed is not None:  # the server acknowledged the COMMIT: what failed came after it
                log.debug("an error after the commit while %s", what, exc_info=failed)
    except PoolTimeout as exc:
        raise (await _timed_out(exc, pool, what)) from exc
    except psycopg.Error as exc:
        raise (refused_value(exc, workflow, key) or wrap(exc, pool, what)) from exc


def begin_statement(conn: psycopg.AsyncConnection[Any]) -> str:
    """The BEGIN that opens a transaction with ``conn``'s configured isolation level, read-only and
    deferrable settings (those psycopg would apply to a transaction it opened itself)."""
    parts = ["BEGIN"]
    if conn.isolation_level is not None:
        parts.append("ISOLATION LEVEL " + psycopg.IsolationLevel(conn.isolation_level).name.replace("_", " "))
    if conn.read_only is not None:
        parts.append("READ ONLY" if conn.read_only else "READ WRITE")
    if conn.deferrable is not None:
        parts.append("DEFERRABLE" if conn.deferrable else "NOT DEFERRABLE")
    return " ".join(parts)


async def _timed_out(exc: PoolTimeout, pool: Pool, what: str) -> StoreError:
    """The pool only says it waited in vain; one direct attempt tells an unreachable server (and
    why) from a pool whose connections were all busy."""
    conninfo = pool.conninfo
    kwargs = pool.kwargs if isinstance(pool.kwargs, dict) else {}
    if isinstance(conninfo, str):
        try:
            probe = await psycopg.AsyncConnection.connect(conninfo, **{**kwargs, "connect_timeout": 5})
        except psycopg.Error as reason:
            first = str(reason).strip().splitlines()[0] if str(reason).strip() else repr(reason)
            return StoreUnavailable(
                f"Postgres at {masked_dsn(pool)} could not be reached while {what}: {first}; "
                "check that the server is running and the DSN is right"
            )
        await probe.close()
        return StoreError(
            f"no pooled connection to {masked_dsn(pool)} came free within {pool.timeout:g}s "
            f"while {what} (max_size {pool.max_size}); the server answers, so the pool is too "
            "small for the load or connections are held too long"
        )
    return wrap(exc, pool, what)


def check_text(workflow: str, key: str | None = None) -> None:
    """Refuse ids and keys Postgres text cannot hold (a NUL character)."""
    if "\x00" in workflow:
        raise InvalidWorkflowId(
            f"workflow id {workflow!r} contains a NUL character, which Postgres text cannot "
            "hold; use an id without '\\x00'"
        )
    if key is not None and "\x00" in key:
        raise InvalidKey(
            f"workflow {workflow!r}: key {key!r} contains a NUL character, which Postgres text "
            "cannot hold; use a key without '\\x00'"
        )


def check_encoded(workflow: str, key: str, encoded: object) -> str:
    """Refuse an encoding a jsonb column cannot take: not text, or carrying a NUL."""
    if not isinstance(encoded, str):
        raise InvalidValue(
            f"workflow {workflow!r}, key {key!r}: the codec produced {type(encoded).__name__}, "
            "but the Postgres store keeps values as jsonb and needs a codec that renders JSON text"
        )
    if "\x00" in encoded or ("\\u0000" in encoded and _JSON_NUL.search(encoded)):
        raise InvalidValue(
            f"workflow {workflow!r}, key {key!r}: the value contains a NUL character (\\u0000), "
            "which Postgres jsonb cannot hold; strip or replace it before recording"
        )
    if _EXPONENT.search(encoded):
        _check_numbers(workflow, key, encoded)
    return encoded


def _check_numbers(workflow: str, key: str, encoded: str) -> None:
    """Refuse a float jsonb would hand back as an integer.

    jsonb keeps numbers as numeric, whose text has as many decimals as the input had after its
    exponent was applied: ``1e+16`` comes back ``10000000000000000``, which JSON reads as an int
    (and ``1.5e+300`` as an int that no longer equals the float). Smaller exponents keep a decimal
    point (``1e-07`` comes back ``0.0000001``) and survive.
    """

    def check(token: str) -> float:
        mantissa, _, exponent = token.lower().partition("e")
        if exponent and int(exponent) >= len(mantissa.partition(".")[2]):
            raise InvalidValue(
                f"workflow {workflow!r}, key {key!r}: the number {token} would come back from "
                "Postgres jsonb as an integer (jsonb stores numbers as numeric, without the "
                "exponent); record floats of magnitude 1e16 or more as strings"
            )
        return float(token)

    try:
        json.loads(encoded, parse_float=check)
    except InvalidValue:
        raise
    except ValueError:
        pass  # not JSON at all: the server refuses it and says so


def check_codec(codec: CheckpointCodec[Any]) -> None:
    """Refuse, at construction, a codec that does not render JSON text (jsonb would reject it)."""
    if getattr(codec, "renders_json", True) is False:
        raise InvalidInput(
            f"{type(codec).__name__} says it does not render JSON text; the Postgres store keeps "
            "values as jsonb, so its codec must produce JSON text"
        )
    probe: object = {"probe": [1, "two", None]}
    try:
        encoded = codec.encode(probe)
    except (TypeError, ValueError):
        return  # a codec for its own value types only: the first write tells instead
    try:
        if not isinstance(encoded, str):
            raise TypeError(f"encode returned {type(encoded).__name__}, not str")
        json.loads(encoded)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(
            f"{type(codec).__name__} does not render JSON text ({exc}); the Postgres store keeps "
            "values as jsonb, so its codec must produce JSON text (JsonCodec does)"
        ) from exc


# An index entry (the primary keys on workflow and on (workflow, key)) may be at most about a
# third of a page; Postgres refuses a longer one with SQLSTATE 54000 after compressing it.
_INDEX_ROW = "index row"


def refused_value(exc: psycopg.Error, workflow: str, key: str) -> InvalidInput | None:
    """The refusal a caller sees for input the server refused, or None for other errors.

    ``InvalidValue`` for a value jsonb cannot hold; for a program limit (SQLSTATE class 54: an id
    or key too long for the primary-key index, a value nested deeper than the server's stack
    allows), ``InvalidWorkflowId``, ``InvalidKey`` or ``InvalidValue`` naming what was too large.
    psycopg files class 54 under ``OperationalError``, but the server was reached and refused
    the statement, so this is never ``StoreUnavailable``: nothing was committed, and sending the
    same input again fails the same way."""
    if isinstance(exc, pg_errors.UntranslatableCharacter | pg_errors.InvalidTextRepresentation):
        return InvalidValue(
            f"workflow {workflow!r}, key {key!r}: Postgres refused the encoded value as jsonb "
            f"({exc}); the codec must render JSON text jsonb can hold"
        )
    sqlstate = getattr(exc, "sqlstate", None) or ""
    if not sqlstate.startswith("54"):
        return None
    said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if _INDEX_ROW in said:
        id_bytes, key_bytes = len(workflow.encode("utf-8", "replace")), len(key.encode("utf-8", "replace"))
        if key_bytes > id_bytes:
            return InvalidKey(
                f"workflow {_short(workflow)}: key {_short(key)} ({key_bytes} bytes) is too long "
                f"for Postgres' index ({said}); use keys of at most a few hundred bytes"
            )
        return InvalidWorkflowId(
            f"workflow id {_short(workflow)} ({id_bytes} bytes) is too long for Postgres' index "
            f"({said}); use ids of at most a few hundred bytes"
        )
    return InvalidValue(
        f"workflow {_short(workflow)}, key {_short(key)}: Postgres refused the value as beyond "
        f"its limits (SQLSTATE {sqlstate}: {said}); record a smaller or less deeply nested value"
    )


def _short(text: str, most: int = 60) -> str:
    """``text`` quoted, cut to ``most`` characters with its length said (an oversize id in an
    error message would bury the message)."""
    if len(text) <= most:
        return repr(text)
    return f"{text[:most]!r}... ({len(text)} characters)"
