"""An optional wakeup path for PostgresScheduler: LISTEN/NOTIFY, with polling kept as the safety net.

Two halves. The writer side is ``PostgresScheduler(pool, notify=True)``: for a commit that makes a
workflow due now (``schedule``, ``PostgresDurable.arrive`` and ``deliver``), it sends one
``pg_notify``, coalesced so that at most one is in flight per scheduler and any number of commits
meanwhile cost one more. ``arrive`` and ``deliver`` make it the last statement of their own
transaction, in the same round trip on the same connection: listeners hear it as that
transaction commits, with no second transaction to run first. ``schedule`` sends it from a
background task. Only the transaction that claimed the one NOTIFY in flight carries it, so only that one
takes the database-wide lock a notifying commit takes: arrives are not serialized behind each
other. If the server refuses a transaction that carried the NOTIFY (a full notification queue
refuses it), the transaction is sent again without it and the NOTIFY follows from the
background, so a broken wakeup path costs latency, never a write.

The reader side is ``PostgresWakeup``: one dedicated connection (not borrowed from the pool) that
LISTENs and wakes whoever waits in ``wait(at_most)``. A notification can be lost (the listener was
reconnecting, the notifier's connection failed, the server restarted): that costs only latency,
because a waiter never waits longer than ``at_most`` (the worker's poll interval) and then takes
again, exactly as without the wakeup.

A listening connection can also die silently: a proxy, a NAT or a load balancer drops it (or a
failover moves the server) while it idles, and nothing arrives, not even an error, so a listener
that only waits for notifications waits for ever and every waiter falls back to its poll interval.
So the listener checks its own connection: after every ``health_every`` (default 5 s) it sends
``SELECT 1`` on it, which must be answered within ``health_timeout`` (default 2 s; every wait on the
listening connection is bounded by it, and a connection that overruns it is closed at once, with no
cancel request, which would need the same broken path). A connection that failed the check, or
failed in any other way, is closed; the listener connects again ``reconnect_after`` (default 1 s)
later (a connection attempt gives up after ``max(2 s, health_timeout)``), LISTENs again and wakes
every waiter once. The bound, ``PostgresWakeup.resubscribe_bound``: a listener whose connection died
silently is listening again on a new one within ``health_every + health_timeout + reconnect_after +
max(2 s, health_timeout)`` (10 s with the defaults) of its death, once the server can be reached;
until then waiters poll. ``resubscribed`` counts the LISTENs after the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from datetime import timedelta
from types import TracebackType
from typing import Any

import psycopg
from psycopg import sql

from without_durability.errors import InvalidInput, StoreUnavailable

from ._boundary import Pool, masked_dsn, statement
from .failover import PRESENCE_TIMEOUTS, TAKE_PRESENCE
from .timeouts import timed_connections

CHANNEL = "without_durability_queue"
"""The channel both halves use; the payload is the namespace."""

NOTIFY = "SELECT pg_notify(%(channel)s, %(namespace)s)"

log = logging.getLogger("without_durability_postgres.wakeup")


class Notifier:
    """The writer half. After a commit that made work due now, ``poke``: a background task sends
    the NOTIFY on a pooled connection. Or, before the commit, ``claim``: the committer queues the
    NOTIFY as its transaction's last statement, before its COMMIT, in the same network flight (it
    is delivered only if the transaction commits), then ``settle``. Either way sends coalesce: at most one NOTIFY is in
    flight, and any number of commits while it is cost one more after it. Failures are logged,
    not raised: a lost notification costs a waiter at most its poll interval.
    """

    def __init__(self, pool: Pool, namespace: str, channel: str = CHANNEL) -> None:
        self.pool = pool
        self.namespace = namespace
        self.channel = channel
        self.sent = 0
        """NOTIFYs sent so far (pokes coalesce, so usually fewer than commits)."""
        self._pending = False  # a commit since the NOTIFY in flight was sent: one more is owed
        self._busy = False  # a NOTIFY is in flight (the background task's, or a claimed one)
        self._task: asyncio.Task[None] | None = None

    def poke(self) -> None:
        """Ask for a NOTIFY soon; returns at once (call it after the commit, never inside)."""
        self._pending = True
        if not self._busy:
            self._busy = True
            self._task = asyncio.get_running_loop().create_task(self._send())

    def claim(self) -> bool:
        """Before sending a commit that will make work due now: True if this caller is to send the
        NOTIFY itself, inside its transaction (nothing is in flight, so it is now); False if one
        is in flight already. Every claim is answered by one ``settle``."""
        if self._busy:
            return False
        self._busy = True
        self._pending = False  # the NOTIFY claimed goes out after every commit that poked so far
        return True

    def statement(self) -> tuple[str, dict[str, str]]:
        """The NOTIFY, with its parameters, for a caller that claimed it."""
        return NOTIFY, {"channel": self.channel, "namespace": self.namespace}

    def settle(self, claimed: bool, *, notified: bool, owed: bool) -> None:
        """After the flight that followed ``claim``: ``notified``, whether the caller's NOTIFY
        committed with its transaction; ``owed``, whether a commit may have happened that no
        NOTIFY followed (then one is sent, after any in flight, as after a ``poke``). Never
        raises."""
        if claimed:
            self._busy = False
            if notified:
                self.sent += 1
        if owed or (claimed and self._pending):
            self.poke()

    async def _send(self) -> None:
        try:
            while self._pending:
                self._pending = False
                try:
                    async with statement(self.pool, "notifying") as conn:  # autocommit: one round trip
                        await conn.execute(NOTIFY, {"channel": self.channel, "namespace": self.namespace})
                    self.sent += 1
                except Exception:  # the pool is closed or the server is gone: pollers still find it
                    log.debug(
                        "notify for namespace %r failed; waiters fall back to polling",
                        self.namespace,
                        exc_info=True,
                    )
                    return
        finally:
            self._busy = False

    async def flush(self) -> None:
        """Wait until any NOTIFY asked for has been sent (or has failed)."""
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task


class PostgresWakeup:
    """The reader half: LISTEN on one dedicated connection for work due in ``namespace``.

    ``wait(at_most)`` returns as soon as a notification for the namespace has arrived since the
    previous ``wait`` returned, or after ``at_most``, whichever is first; so it satisfies the
    Worker's ``Wakeup``: ``Worker(..., wakeup=PostgresWakeup(pool))``. Several workers in one
    process share one listener through ``subscribe()`` (each subscription remembers its own
    notifications). The connection is opened with the pool's conninfo and kwargs on ``start`` (or
    the first ``wait``); if it drops, it is reopened every ``reconnect_after`` while waiters keep
    polling, and every waiter is woken once it is back, in case it missed something.

    ``conninfo`` (optional) is where to LISTEN instead of the pool's conninfo (the pool's kwargs
    still apply): another route to the same server. ``health_every`` and ``health_timeout`` are
    the connection's health check, and ``resubscribe_bound`` the longest a silently dead
    connection goes unnoticed and unreplaced (see the module docstring).

    ``presence=True`` (fast failover, opt-in; see ``failover``): the listening session also holds
    this worker's presence lock (``owner``), and the server is told to drop the session within
    about ``presence_timeout`` of the connection going silent (TCP keepalives and user timeout).
    Start the listener before the worker claims anything: claims made without a presence fall back
    to their leases.
    """

    def __init__(
        self,
        pool: Pool,
        *,
        namespace: str = "default",
        channel: str = CHANNEL,
        reconnect_after: timedelta = timedelta(seconds=1),
        presence: bool = False,
        presence_timeout: timedelta = timedelta(seconds=10),
        conninfo: str | None = None,
        health_every: timedelta = timedelta(seconds=5),
        health_timeout: timedelta = timedelta(seconds=2),
    ) -> None:
        if not isinstance(namespace, str) or not namespace:
            raise InvalidInput(f"namespace must be a non-empty string, got {namespace!r}")
        if not isinstance(presence_timeout, timedelta) or not (
            timedelta(seconds=2) <= presence_timeout <= timedelta(days=1)
        ):
            # the server takes tcp_user_timeout in milliseconds as a 32-bit int: past about 24 days
            # it refuses the setting; a day is already far past any failure detection worth having
            raise InvalidInput(
                f"presence_timeout must be a timedelta from 2 s to 1 day, got {presence_timeout!r}"
            )
        for name, value in (("health_every", health_every), ("health_timeout", health_timeout)):
            if not isinstance(value, timedelta) or not (
                timedelta(milliseconds=100) <= value <= timedelta(hours=1)
            ):
                raise InvalidInput(f"{name} must be a timedelta from 0.1 s to 1 hour, got {value!r}")
        self.health_every = health_every
        self.health_timeout = health_timeout
        self.conninfo = conninfo
        self.resubscribed = 0
        """LISTENs after the first: how many times the listener replaced a lost connection."""
        self._listened = False
        self.presence = presence
        self.presence_timeout = presence_timeout
        self._owner: int | None = None
        self._owner_id = secrets.randbelow(2**31 - 1) + 1
        self.pool = pool
        self.namespace = namespace
        self.channel = channel
        self.reconnect_after = reconnect_after
        self.received = 0
        """Notifications for this namespace received so far."""
        self._subscriptions: list[_Subscription] = []
        self._default = self.subscribe()
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closed = False

    def subscribe(self) -> _Subscription:
        """A waiter of its own for one more worker sharing this listener."""
        sub = _Subscription(self)
        self._subscriptions.append(sub)
        return sub

    @property
    def owner(self) -> int | None:
        """With ``presence=True``: this listener's presence id while its session holds the
        presence lock (see ``failover``), else None. Pass the listener to
        ``PostgresCheckpointer(failover=...)`` so claims record it."""
        if self._owner is None or self._conn is None or self._conn.closed:
            return None
        return self._owner

    @property
    def resubscribe_bound(self) -> timedelta:
        """The longest a connection that died silently goes unnoticed and unreplaced, once the
        server can be reached: ``health_every + health_timeout + reconnect_after`` plus one
        connection attempt (``max(2 s, health_timeout)``)."""
        connect = max(timedelta(seconds=2), self.health_timeout)
        return self.health_every + self.health_timeout + self.reconnect_after + connect

    @property
    def backend_pid(self) -> int | None:
        """The listening connection's server process id (None while disconnected)."""
        return None if self._conn is None or self._conn.closed else self._conn.info.backend_pid

    async def start(self) -> None:
        """Connect and LISTEN (raising ``StoreUnavailable`` if that fails), then keep listening in
        the background. Idempotent."""
        if self._reader is not None:
            return
        if self._closed:
            raise InvalidInput("this PostgresWakeup is closed")
        await self._listen()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _listen(self) -> None:
        kwargs = self.pool.kwargs if isinstance(self.pool.kwargs, dict) else {}
        conninfo = self.pool.conninfo if isinstance(self.pool.conninfo, str) else ""
        if self.conninfo is not None:
            conninfo = self.conninfo
        timeout = self.health_timeout.total_seconds()
        connect = max(2, math.ceil(timeout))  # libpq's connect_timeout: whole seconds, at least 2
        try:
            # every wait on it is bounded by the health timeout (notifies passes its own)
            conn = await timed_connections(timeout).connect(
                conninfo, **{**kwargs, "autocommit": True, "connect_timeout": connect}
            )
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"Postgres at {masked_dsn(self.pool)}: could not connect to LISTEN on {self.channel!r}: {exc}"
            ) from exc
        try:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
            owner = await self._take_presence(conn) if self.presence else None
        except BaseException as exc:
            # a connection that never became the listener is closed here, not left to the server
            # (a failed LISTEN, a refused presence setting, or a cancel while either was in flight)
            with contextlib.suppress(Exception):
                await conn.close()
            if isinstance(exc, psycopg.Error):
                raise StoreUnavailable(
                    f"Postgres at {masked_dsn(self.pool)}: could not LISTEN on {self.channel!r}: {exc}"
                ) from exc
            raise
        self._conn = conn
        self._owner = owner
        if self._listened:
            self.resubscribed += 1
        self._listened = True

    async def _take_presence(self, conn: psycopg.AsyncConnection[Any]) -> int | None:
        """Hold this session's presence lock: the id it had if free, else a new one (another
        session holds the old one: a claimer's takeover committing, or a collision)."""
        seconds = max(1, int(self.presence_timeout.total_seconds()) // 2)
        await conn.execute(
            PRESENCE_TIMEOUTS,
            {"idle": str(seconds), "interval": str(max(1, seconds // 3)),
             "user_ms": str(int(self.presence_timeout.total_seconds() * 1000))},
        )
        for _ in range(8):
            row = await (await conn.execute(TAKE_PRESENCE, {"owner": self._owner_id})).fetchone()
            if row is not None and row[0]:
                return self._owner_id
            self._owner_id = secrets.randbelow(2**31 - 1) + 1
        log.warning("wakeup: no free presence id after 8 tries; claims fall back to their leases")
        return None

    async def _read(self) -> None:
        while not self._closed:
            conn = self._conn
            try:
                if conn is None or conn.closed:
                    await self._listen()
                    self._wake_all()  # anything may have been missed while disconnected
                    conn = self._conn
                assert conn is not None
                async for note in conn.notifies(timeout=self.health_every.total_seconds()):
                    if note.payload == self.namespace:
                        self.received += 1
                        self._wake_all()
                # a connection that died silently hears nothing and says nothing: ask it (the
                # timed connection closes it and raises past health_timeout)
                await conn.execute("SELECT 1")
            except (psycopg.Error, StoreUnavailable) as exc:
                await self._lost(conn, exc)

    async def _lost(self, conn: psycopg.AsyncConnection[Any] | None, exc: Exception) -> None:
        """The listening connection failed (or never came): close it, and connect again after
        ``reconnect_after`` (the reader's loop does, on its next turn)."""
        log.warning("wakeup listener lost (%s); polling until it reconnects", exc)
        self._owner = None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
        self._conn = None
        await asyncio.sleep(self.reconnect_after.total_seconds())

    def _wake_all(self) -> None:
        for sub in self._subscriptions:
            sub.event.set()

    async def wait(self, at_most: timedelta) -> None:
        """See the class: return on a notification since the last return, or after ``at_most``."""
        await self._default.wait(at_most)

    async def close(self) -> None:
        """Stop listening and close the connection."""
        self._closed = True
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._conn is not None:
            await self._conn.close()
        self._wake_all()

    async def __aenter__(self) -> PostgresWakeup:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class _Subscription:
    """One waiter on a ``PostgresWakeup``: a Worker's ``Wakeup``."""

    def __init__(self, owner: PostgresWakeup) -> None:
        self.owner = owner
        self.event = asyncio.Event()

    async def wait(self, at_most: timedelta) -> None:
        """Return on a notification since this subscription's last return, or after ``at_most``."""
        if not self.owner._closed:
            await self.owner.start()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(at_most.total_seconds()):  # no task of its own, as wait_for makes
                await self.event.wait()
        self.event.clear()
