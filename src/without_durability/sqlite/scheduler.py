"""The SQLite ``Scheduler``: one queue row per (namespace, workflow)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta

from .._values import Delivery
from ..clock import Clock, system_clock
from ..errors import (
    InvalidInput,
)
from ..rules import (
    check_time,
    check_visibility,
    check_workflow,
)
from .connection import SqliteConnection
from .schema import _micros, _span
from .statements import ANSWER_AGAIN, ANSWER_DONE, CANCEL, HIDE, NEXT_DUE, NEXT_TAKE, SCHEDULE


@dataclass(frozen=True, slots=True)
class _Receipt:
    namespace: str
    visible_at: int
    took: int


class SqliteScheduler:
    """``Scheduler`` over a ``SqliteConnection``: one row per (namespace, workflow), scored by the
    moment it becomes visible. The receipt of a delivery is the visibility its take set and the
    take's number (every take draws a new one), so ``wake_at`` can tell its own delivery from a
    wakeup, a cancel or a later take that came since, even one that hid it until the same instant."""

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
            took = int(cur.execute(NEXT_TAKE).fetchone()[0])
            params = {"namespace": self.namespace, "workflow": row[0], "hidden": hidden, "took": took}
            cur.execute(HIDE, params)
            return Delivery(str(row[0]), _Receipt(self.namespace, hidden, took))

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
            "took": receipt.took,
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
