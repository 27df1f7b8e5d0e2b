"""The smallest whole workflow: one transact, one step, one value from outside, on SQLite.

    python examples/hello.py

Prints each pass's progress and ``ok``, and exits 0, when the workflow finished with the ledger
moved exactly once.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

from without_durability import Run, SqliteDurable, Worker, status_of


def reserve(cursor: sqlite3.Cursor) -> object:
    # runs inside the store's own write transaction: the row and the record commit together
    cursor.execute("CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, held INTEGER)")
    cursor.execute(
        "INSERT INTO stock VALUES ('piano', 1) ON CONFLICT (sku) DO UPDATE SET held = held + 1"
    )
    return cursor.execute("SELECT held FROM stock WHERE sku = 'piano'").fetchone()[0]


async def greet(run: Run[object]) -> object:
    held = await run.transact("reserve", reserve, int)  # exactly once, in the store

    async def say_hello() -> object:  # a step's effect is async: a call to the outside world
        return f"hello {run.workflow}"

    hello = await run.step("hello", say_hello, str)  # at least once
    print(f"  pass {run.pass_.token}: reserved {held}, said {hello!r}; waiting for approval")
    approval = await run.awaiting("approval", str)  # a pass ends here until arrive() writes it
    print(f"  pass {run.pass_.token}: approved by {approval}")
    return {"held": held, "approved_by": approval}


async def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        durable = await SqliteDurable.open(Path(folder) / "hello.db")
        try:
            worker = Worker(
                durable,
                greet,
                alive=timedelta(seconds=10),
                budget=timedelta(minutes=1),
                visibility=timedelta(seconds=30),
                poll_interval=timedelta(milliseconds=50),
            )
            await durable.scheduler.schedule("order-1")
            await worker.run(max_passes=1)  # reserves, says hello, stops at the wait
            await durable.arrive("order-1", "approval", "alice")  # records and schedules, one commit
            await worker.run(max_passes=2)  # the next pass replays and finishes
            status = status_of(await durable.checkpointer.load("order-1"))
        finally:
            await durable.close()
    ok = status.state == "finished" and status.result == {"held": 1, "approved_by": "alice"}
    print("ok" if ok else f"FAIL: {status}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
