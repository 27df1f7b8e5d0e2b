"""Sessions that hold what a wd-chaos probe needs held, on a real server, so that a claim and a
record meet in one order every run (``Opened.holds``; ``wd_chaos.client.landing`` uses them): one session
locks a workflow's claim row, another holds an uncommitted write of one key, and a third watches
who waits behind them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg

# Another session's row lock: a claim's upsert, and a fence that is an UPDATE, wait for it.
LOCK_CLAIM = "SELECT 1 FROM workflow_claim WHERE workflow = %(workflow)s FOR UPDATE"

# Held uncommitted, this row makes any insert of the same key wait on the unique index until it
# rolls back (and then insert as if it had never been).
HOLD_WRITE = """
INSERT INTO workflow_checkpoint (workflow, key, value) VALUES (%(workflow)s, %(key)s, 'null'::jsonb)
"""

# Sessions waiting on a lock that the holding sessions hold, or on one held by such a waiter (a
# second updater of a row queues on the first waiter's tuple lock, not on the row's holder).
WAITING = """
WITH w AS (
    SELECT pid, pg_blocking_pids(pid) AS behind FROM pg_stat_activity WHERE wait_event_type = 'Lock'
)
SELECT count(*) FROM w
 WHERE behind && %(held)s::int[]
    OR behind && ARRAY(SELECT pid FROM w WHERE behind && %(held)s::int[])
"""


class PostgresHolds:
    """Three sessions of their own in the run's schema (see the module docstring); close them with
    ``close``. Each hold ends when its block exits: the claim's lock is released as it was, the
    held write rolled back, so neither ever changes what the store holds."""

    def __init__(self, sessions: list[psycopg.AsyncConnection[Any]]) -> None:
        self._claim, self._write, self._watch = sessions
        self._held = [self._claim.info.backend_pid, self._write.info.backend_pid]

    @classmethod
    async def open(cls, url: str, schema: str) -> PostgresHolds:
        """Connect the three sessions to ``url`` with ``schema`` first on their search path."""
        sessions: list[psycopg.AsyncConnection[Any]] = []
        try:
            for _ in range(3):
                sessions.append(
                    await psycopg.AsyncConnection.connect(
                        url, autocommit=True, options=f"-c search_path={schema}", connect_timeout=5
                    )
                )
        except BaseException:
            for s in sessions:
                await s.close()
            raise
        return cls(sessions)

    async def close(self) -> None:
        """Close the sessions (rolling back whatever a hold left open)."""
        for s in (self._claim, self._write, self._watch):
            await s.close()

    @asynccontextmanager
    async def claim(self, workflow: str) -> AsyncIterator[None]:
        """Inside: ``workflow``'s claim row is locked by another session (it must exist), so a
        claim of it, and a fence that locks it, waits until the block exits."""
        async with self._claim.transaction(force_rollback=True):
            await self._claim.execute(LOCK_CLAIM, {"workflow": workflow})
            yield

    @asynccontextmanager
    async def write(self, workflow: str, key: str) -> AsyncIterator[None]:
        """Inside: another session holds an uncommitted write of ``key`` (absent before), so a
        write of that key waits until the block exits; the held write is then rolled back."""
        async with self._write.transaction(force_rollback=True):
            await self._write.execute(HOLD_WRITE, {"workflow": workflow, "key": key})
            yield

    async def waiting(self) -> int:
        """How many sessions wait behind the holds now (directly, or queued behind one that does)."""
        cur = await self._watch.execute(WAITING, {"held": self._held})
        row = await cur.fetchone()
        return int(row[0]) if row else 0


def holds_opener(url: str, schema: str) -> Any:
    """``Opened.holds`` for the run's schema: an async context manager yielding ``PostgresHolds``."""

    @asynccontextmanager
    async def opened() -> AsyncIterator[PostgresHolds]:
        holds = await PostgresHolds.open(url, schema)
        try:
            yield holds
        finally:
            await holds.close()

    return opened
