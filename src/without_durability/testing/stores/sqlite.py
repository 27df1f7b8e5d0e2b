"""The SQLite store's factory: a fresh file per test, a manual clock the suite moves, and ledger
effects written in SQL against the open transaction's cursor.

The ledger table is test data, not product schema: the factory creates it in each test's file.
"""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from ..._values import Pass
from ...clock import ManualClock
from ...sqlite import SqliteConnection, SqliteDurable, SqliteEffect
from ..harness import (
    EffectFailed,
    EffectKit,
    ManualTestClock,
    StoreFactory,
    StoreUnderTest,
    register,
)

LEDGER_TABLE = "wd_test_ledger"

CREATE_LEDGER = f"""
CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} (
    name TEXT PRIMARY KEY,
    total INTEGER NOT NULL
) WITHOUT ROWID
"""

LEDGER_ADD = f"""
INSERT INTO {LEDGER_TABLE} (name, total) VALUES (?, ?)
ON CONFLICT (name) DO UPDATE SET total = {LEDGER_TABLE}.total + excluded.total
RETURNING total
"""

LEDGER_READ = f"SELECT total FROM {LEDGER_TABLE} WHERE name = ?"


async def create_ledger(conn: SqliteConnection) -> None:
    """Create the test ledger table in ``conn``'s file (harmless if it exists)."""
    await conn.write(lambda cur: cur.execute(CREATE_LEDGER))


def sqlite_effects(conn: SqliteConnection) -> EffectKit[SqliteEffect]:
    """Ledger effects in SQL over the transaction's cursor (the ledger table must exist)."""

    def ledger_add(name: str, amount: int) -> SqliteEffect:
        def effect(cur: sqlite3.Cursor) -> object:
            return int(cur.execute(LEDGER_ADD, (name, amount)).fetchone()[0])

        return effect

    async def ledger_read(name: str) -> int:
        def job(cur: sqlite3.Cursor) -> int:
            row = cur.execute(LEDGER_READ, (name,)).fetchone()
            return 0 if row is None else int(row[0])

        return await conn.read(job)

    def superseding(pass_: Pass, inner: SqliteEffect) -> SqliteEffect:
        def effect(cur: sqlite3.Cursor) -> object:
            result = inner(cur)
            # Inside one IMMEDIATE transaction nobody else can claim, so the newer claim is made
            # through the same cursor; the store must notice it when it re-checks the fence.
            cur.execute(
                "UPDATE claim SET token = token + 1 WHERE workflow = ? AND token = ?",
                (pass_.workflow, pass_.token),
            )
            return result

        return effect

    def failing(inner: SqliteEffect) -> SqliteEffect:
        def effect(cur: sqlite3.Cursor) -> object:
            inner(cur)
            raise EffectFailed("effect failed after performing its write")

        return effect

    return EffectKit(ledger_add, ledger_read, superseding, failing)


@asynccontextmanager
async def open_sqlite(_server: object) -> AsyncIterator[StoreUnderTest[SqliteEffect]]:
    """A fresh SQLite store in a new temporary file, on a manual clock."""
    clock = ManualClock()
    with tempfile.TemporaryDirectory(prefix="wd-sqlite-") as folder:
        path = Path(folder) / "store.db"
        durable = await SqliteDurable.open(path, clock=clock)
        try:
            await create_ledger(durable.conn)
            yield StoreUnderTest(
                "sqlite",
                durable,
                ManualTestClock(clock),
                sqlite_effects(durable.conn),
                extra={"path": path},
            )
        finally:
            await durable.close()


SQLITE = register(
    StoreFactory("sqlite", open_sqlite, description="one SQLite file in WAL mode (stdlib sqlite3)")
)
