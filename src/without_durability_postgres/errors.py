"""How a psycopg error becomes one of this library's errors: the rules the Postgres store itself
follows, public so that a scheduler, checkpointer or kit written beside it (your own queue over
the same database) reports failures the way the store does.

Three outcomes, and what a caller may rely on for each:

- ``StoreUnavailable`` (a ``StoreError``): the server could not be reached, or the connection was
  lost mid-call (psycopg's ``OperationalError`` and its subclasses, except the four below). A
  write cut off so **may or may not have committed**: read it back, or repeat it only if it is
  idempotent. The message names the server, its password masked.
- an ``InvalidInput`` (``InvalidValue``, ``InvalidKey`` or ``InvalidWorkflowId``): the server was
  reached and refused the *input*: a value jsonb cannot hold, an id or key too long for the
  primary-key index, a value nested beyond the server's limits (SQLSTATE class 54). Nothing was
  committed, and sending the same input again fails the same way: do not retry it.
- ``StoreError``: anything else the driver raised. The server answered and the statement failed,
  or the transaction was rolled back (a deadlock, a serialization failure, a cancelled statement,
  a lock not available, all filed by psycopg under ``OperationalError`` but never
  ``StoreUnavailable`` here: nothing was committed, and trying again may succeed); or the pool is
  closed.

Every outcome is raised ``from`` the driver's error, which stays as ``__cause__``. ``Fenced``,
``Contended`` and ``Suspended`` are never produced here: they are decisions of the store, not
failures of the driver.

    from without_durability_postgres.errors import boundary

    with boundary("take from my_queue", pool=pool):
        async with pool.connection() as conn:
            await conn.execute(TAKE)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from without_durability.errors import InvalidInput, StoreError

from ._boundary import Pool, connect, masked_dsn, refused_value, wrap

__all__ = ["boundary", "classify", "connect", "masked_dsn"]


def classify(
    exc: psycopg.Error, what: str, *, pool: Pool | None = None, workflow: str = "", key: str = ""
) -> StoreError | InvalidInput:
    """The error a caller should see for the psycopg error ``exc``, raised while doing ``what``
    (a phrase such as ``"take from my_queue"``, put in the message): ``StoreUnavailable``, an
    ``InvalidInput`` naming ``workflow`` and ``key``, or ``StoreError``, by the rules in this
    module's docstring. ``pool``, when given, names the server in the message (password masked).
    Raise the result ``from exc``. A ``psycopg_pool.PoolTimeout`` (no connection within the
    pool's timeout) is ``StoreUnavailable`` here; ``connect`` tells a busy pool from a server
    that is down by trying one connection of its own."""
    if not isinstance(exc, psycopg.Error):
        raise TypeError(f"classify takes a psycopg.Error, not {type(exc).__name__}: {exc!r}")
    return refused_value(exc, workflow, key) or wrap(exc, pool, what)


@contextmanager
def boundary(what: str, *, pool: Pool | None = None, workflow: str = "", key: str = "") -> Iterator[None]:
    """Raise any psycopg error leaving the block as ``classify`` says, from the driver's error.
    Other exceptions (your own, ``asyncio.CancelledError``) pass through untouched. Usable around
    ``await``: it is an ordinary ``with`` block."""
    try:
        yield
    except psycopg.Error as exc:
        raise classify(exc, what, pool=pool, workflow=workflow, key=key) from exc
