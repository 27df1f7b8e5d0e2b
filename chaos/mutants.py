"""One deliberately broken store, so the gate proves it can say no (the full mutant catalogue is its
own piece of work): an SQLite checkpointer whose ``record`` skips the fence check."""

from __future__ import annotations

import sqlite3

from without_durability import Pass, Recorded
from without_durability.rules import check_key
from without_durability.sqlite import SqliteCheckpointer


class RecordWithoutFence(SqliteCheckpointer):
    """``record`` writes first-writer-wins but never asks whether a newer pass exists."""

    async def record(self, pass_: Pass, key: str, value: object) -> Recorded:
        check_key(pass_.workflow, key)
        encoded = self._encode(pass_.workflow, key, value)

        def job(cur: sqlite3.Cursor) -> Recorded:
            return self._put(cur, pass_.workflow, key, encoded, self._stamp())

        return await self.conn.write(job)
