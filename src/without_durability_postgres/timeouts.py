"""A read timeout for pooled connections: ``timed_connections(seconds)`` is a connection class for
``psycopg_pool.AsyncConnectionPool(connection_class=...)`` under which no wait for the server lasts
longer than ``seconds``.

libpq has no read timeout, and TCP keepalives or ``tcp_user_timeout`` do not help when something
between client and server (a proxy, a NAT, a load balancer) keeps acknowledging while nothing gets
through: the connection is half-open, and a query sent on it waits for ever, holding its caller and
its pooled connection. ``statement_timeout`` is the server's and never hears of the query. So the
client must give up: on a wait past ``seconds`` the connection is closed at once (no cancel request,
which would need the same broken path, and no waiting for it) and the call fails with
``psycopg.OperationalError``, which the store reports as ``StoreUnavailable`` (outcome unknown for a
write); the pool discards the closed connection and opens another. Waits that psycopg bounds itself
(cancellation, ``notifies(timeout=...)``) keep their own bound.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import errors
from psycopg.connection_async import _WAIT_INTERVAL


class TimedConnection(psycopg.AsyncConnection[Any]):
    """A pooled connection whose unbounded waits for the server last ``read_timeout`` s at most."""

    read_timeout: float | None = 30.0
    """Seconds (None: no bound, psycopg's own behaviour)."""

    async def wait(self, gen: Any, interval: float = _WAIT_INTERVAL, timeout: float | None = None) -> Any:  # noqa: ASYNC109 - psycopg's signature
        """psycopg's ``wait``, given ``read_timeout`` when the caller set no timeout of its own;
        past it the connection is closed and ``OperationalError`` raised."""
        if timeout is not None or self.read_timeout is None:
            return await super().wait(gen, interval, timeout)
        try:
            return await super().wait(gen, interval, self.read_timeout)
        except errors._WaitTimeout as exc:
            self.pgconn.finish()  # half-open or hung: never reuse it, and wait for nothing more
            raise psycopg.OperationalError(
                f"no reply from the server within {self.read_timeout:g}s (read timeout); connection closed"
            ) from exc


def timed_connections(seconds: float) -> type[psycopg.AsyncConnection[Any]]:
    """A ``TimedConnection`` class whose read timeout is ``seconds`` (> 0), for a pool's
    ``connection_class``: choose it above the longest a statement may legitimately wait (a lock
    held by another transaction included)."""
    if not seconds > 0:
        raise ValueError(f"a read timeout must be a number of seconds > 0, got {seconds!r}")
    return type("TimedConnection", (TimedConnection,), {"read_timeout": float(seconds)})
