"""A store kit from outside the project, built as ``examples/third_party_store`` is (a ``StoreKit``
registered under the ``without_durability.stores`` entry point): SQLite's records, and a queue whose
answers act by workflow id without checking the receipt, as a job queue that acks by id does. The
stock scenarios must find it INVALID, naming the calls (``tests/test_outside_queue_kit.py``)."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any

from without_durability import Delivery
from without_durability.kits.sqlite import SqliteKit
from without_durability.sqlite import SqliteScheduler
from without_durability.sqlite.schema import _micros
from without_durability.testing.kit import Opened


class ByIdScheduler(SqliteScheduler):
    """``wake_at`` finds the delivery by its workflow id and acts, whoever took it since."""

    async def wake_at(self, delivery: Delivery, at: datetime | None) -> None:
        params: dict[str, Any] = {"namespace": self.namespace, "workflow": delivery.workflow}

        def job(cur: sqlite3.Cursor) -> None:
            if at is None:
                cur.execute("DELETE FROM queue WHERE namespace = :namespace AND workflow = :workflow", params)
            else:
                cur.execute(
                    "UPDATE queue SET visibility = :at WHERE namespace = :namespace AND workflow = :workflow",
                    {**params, "at": _micros(at)},
                )

        await self.conn.write(job)


class ByIdKit(SqliteKit):
    """SQLite's kit with the by-id queue in every worker process."""

    name = "byid"
    description = "SQLite records, a queue that acks by id (tests/outside_kit)"
    mutant_modules = ()  # type: ignore[assignment]  # none of its own
    mutate_plan = None  # type: ignore[assignment]

    async def open_worker(self, spec: Any) -> Opened:
        opened = await super().open_worker(spec)
        opened.durable.scheduler.__class__ = ByIdScheduler
        return opened


KIT = ByIdKit()
