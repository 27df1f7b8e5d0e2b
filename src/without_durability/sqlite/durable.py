"""The SQLite ``Durable``: each transition one commit on the connection both halves share."""

from __future__ import annotations

import os
import sqlite3
from datetime import timedelta
from types import TracebackType
from typing import Any

from .._values import Recorded
from ..clock import Clock, LeaseClock, system_clock
from ..codec import CheckpointCodec
from ..errors import (
    InvalidInput,
)
from ..protocols import Checkpointer, Durable, Scheduler
from ..rules import (
    MAX_VALUE_BYTES,
    check_workflow,
)
from .checkpointer import SqliteCheckpointer, SqliteEffect
from .connection import DEFAULT_BUSY_TIMEOUT, SqliteConnection, sqlite_connect
from .scheduler import SqliteScheduler
from .statements import CANCEL, DISCARD_FENCE, DISCARD_RECORDS


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
