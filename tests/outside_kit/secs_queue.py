"""A store kit from outside the project (as ``byid_queue``): SQLite's records, and a queue that keeps
its visibility in whole seconds, as a queue over a column without fractions of a second does, and
whose receipt is that visibility alone. Two takes of one workflow within a second (a wakeup while
held, and another worker takes it at once) get one receipt, so the first holder's late answer acts
on the second's delivery. ``receipts-distinct`` must say no under a stock scenario
(``tests/test_outside_queue_kit.py``)."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from typing import Any

from without_durability import Delivery
from without_durability.kits.sqlite import SqliteKit
from without_durability.sqlite import SqliteScheduler
from without_durability.sqlite.scheduler import _Receipt
from without_durability.sqlite.schema import _micros, _span
from without_durability.sqlite.statements import HIDE, NEXT_DUE
from without_durability.testing.kit import Opened

SECOND = 1_000_000


class SecondsScheduler(SqliteScheduler):
    """``take`` hides a workflow until the next whole second past ``now + visibility``, and every
    receipt's take number is the same 0: an answer checks the visibility alone."""

    async def take(self, visibility: timedelta) -> Delivery | None:
        def job(cur: sqlite3.Cursor) -> Delivery | None:
            now = _micros(self.clock())
            row = cur.execute(NEXT_DUE, {"namespace": self.namespace, "now": now}).fetchone()
            if row is None:
                return None
            hidden = -(-(now + _span(visibility)) // SECOND) * SECOND  # rounded up to a second
            params: dict[str, Any] = {"namespace": self.namespace, "workflow": row[0], "hidden": hidden, "took": 0}
            cur.execute(HIDE, params)
            return Delivery(str(row[0]), _Receipt(self.namespace, hidden, 0))

        return await self.conn.write(job)


class SecondsKit(SqliteKit):
    """SQLite's kit with the whole-second queue in every worker process."""

    name = "secs"
    description = "SQLite records, a queue whose receipt is its visibility in whole seconds (tests/outside_kit)"
    mutant_modules = ()  # type: ignore[assignment]  # none of its own
    mutate_plan = None  # type: ignore[assignment]

    async def open_worker(self, spec: Any) -> Opened:
        opened = await super().open_worker(spec)
        opened.durable.scheduler.__class__ = SecondsScheduler
        return opened


KIT = SecondsKit()
