"""Two store kits from outside the project, built as ``examples/third_party_store`` is: SQLite's
records, and a job queue of its own (a ``jobs`` table, a row per job, an id per row) shaped like
the peer queues issue 44 names rather than like ours. Each gets one thing wrong that the stock
scenarios must find, naming the calls (``tests/test_outside_queue_kit.py``):

- ``jobs``: every schedule adds a job, as a queue without a one-entry-per-key mode does, so a
  workflow scheduled while queued or held has two entries: the queue grows, and the second entry
  hands the workflow to a second worker while the first still holds it;
- ``keyed-jobs``: one entry per key, kept by dropping a schedule while the key has a job, held or
  not, so a wakeup that lands while the workflow is held is lost once its holder answers.

Answers act on their own job (its id and the visibility its take set), as they should."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from without_durability import Delivery
from without_durability.kits.sqlite import SqliteKit
from without_durability.sqlite import SqliteScheduler
from without_durability.sqlite.schema import _micros, _span
from without_durability.testing.kit import Opened

JOBS = """CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, namespace TEXT NOT NULL, workflow TEXT NOT NULL,
    visibility INTEGER NOT NULL)"""


@dataclass(frozen=True, slots=True)
class JobReceipt:
    """A job's id and the visibility its take set."""

    job: int
    hidden: int


class JobsScheduler(SqliteScheduler):
    """The ``jobs`` table as a ``Scheduler``: every schedule adds a job."""

    keyed = False

    def _schedule_in(self, cur: sqlite3.Cursor, workflow: str, at: datetime | None) -> None:
        when = _micros(at if at is not None else self.clock())
        params = {"namespace": self.namespace, "workflow": workflow, "at": when}
        if self.keyed:  # one job per key: a schedule while the key has one (held or not) is dropped
            cur.execute(
                "INSERT INTO jobs (namespace, workflow, visibility) SELECT :namespace, :workflow, :at"
                " WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE namespace = :namespace AND workflow = :workflow)",
                params,
            )
        else:
            cur.execute("INSERT INTO jobs (namespace, workflow, visibility) VALUES (:namespace, :workflow, :at)", params)

    async def take(self, visibility: timedelta) -> Delivery | None:
        def job(cur: sqlite3.Cursor) -> Delivery | None:
            now = _micros(self.clock())
            row = cur.execute(
                "SELECT id, workflow FROM jobs WHERE namespace = ? AND visibility <= ? ORDER BY visibility, id LIMIT 1",
                (self.namespace, now),
            ).fetchone()
            if row is None:
                return None
            hidden = now + _span(visibility)
            cur.execute("UPDATE jobs SET visibility = ? WHERE id = ?", (hidden, row[0]))
            return Delivery(str(row[1]), JobReceipt(int(row[0]), hidden))

        return await self.conn.write(job)

    async def wake_at(self, delivery: Delivery, at: datetime | None) -> None:
        receipt = delivery.receipt
        assert isinstance(receipt, JobReceipt), receipt
        mine = {"job": receipt.job, "hidden": receipt.hidden}

        def job(cur: sqlite3.Cursor) -> None:
            if at is None:
                cur.execute("DELETE FROM jobs WHERE id = :job AND visibility = :hidden", mine)
            else:
                cur.execute("UPDATE jobs SET visibility = :at WHERE id = :job AND visibility = :hidden", {**mine, "at": _micros(at)})

        await self.conn.write(job)

    async def cancel(self, workflow: str) -> None:
        params = (self.namespace, workflow)
        await self.conn.write(lambda cur: cur.execute("DELETE FROM jobs WHERE namespace = ? AND workflow = ?", params))


class KeyedJobsScheduler(JobsScheduler):
    """The ``jobs`` table with one job per key, a schedule while the key has one dropped."""

    keyed = True


class JobsKit(SqliteKit):
    """SQLite's records with the ``jobs`` queue in every worker process."""

    name = "jobs"
    description = "SQLite records, a job queue whose every schedule adds a job (tests/outside_kit)"
    mutant_modules = ()  # type: ignore[assignment]  # none of its own
    mutate_plan = None  # type: ignore[assignment]
    scheduler: type[JobsScheduler] = JobsScheduler

    async def open_worker(self, spec: Any) -> Opened:
        opened = await super().open_worker(spec)
        scheduler = opened.durable.scheduler
        scheduler.__class__ = self.scheduler
        await scheduler.conn.write(lambda cur: cur.execute(JOBS))
        namespace = scheduler.namespace

        async def read_queue() -> dict[str, int]:
            def job(cur: sqlite3.Cursor) -> dict[str, int]:
                rows = cur.execute("SELECT workflow, count(*) FROM jobs WHERE namespace = ? GROUP BY workflow", (namespace,))
                return {str(w): int(n) for w, n in rows}

            return await scheduler.conn.read(job)

        opened.read_queue = read_queue
        return opened


class KeyedJobsKit(JobsKit):
    """SQLite's records with the one-job-per-key queue."""

    name = "keyed-jobs"
    description = "SQLite records, a job queue that drops a schedule while the key has a job (tests/outside_kit)"
    scheduler = KeyedJobsScheduler


JOBS_KIT = JobsKit()
KEYED_KIT = KeyedJobsKit()
