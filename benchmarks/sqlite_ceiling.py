"""SQLite against its own ceiling: take (then answer) and append through this library, beside the
very same statements run through bare ``sqlite3`` in the same process, on the same kind of file.

    python -m benchmarks.sqlite_ceiling [--quick] [--out DIR]

Ours: 8 asyncio tasks calling ``SqliteScheduler.take`` then ``wake_at(None)``, and 8 calling
``SqliteCheckpointer.append`` over 10 workflows, through the store's one connection thread. Bare:
one loop on a plain ``sqlite3`` connection with the store's settings (WAL, ``synchronous=FULL``,
autocommit off by hand), each step its own ``BEGIN IMMEDIATE`` ... ``COMMIT`` as the store's
write transaction is: ``NEXT_DUE`` + ``HIDE``, then ``ANSWER_DONE``; and ``APPEND``. SQLite has one
writer, so the bare loop is as fast as these statements go here, and the ratio is what the store's
thread hand-off, asyncio and checks cost. Rounds interleave (``WD_BENCH_ROUNDS``, default 3),
medians; every delivery must be handed out exactly once and every append load back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ._common import check_exactly_once, machine, parser, ratio, report_dir, save_json, table, write_summary

WORKERS = 8
TARGETS = 10
VISIBILITY = timedelta(minutes=10)
NAMESPACE = "bench"


def ids(n: int) -> list[str]:
    return [f"wf-{i:08d}" for i in range(n)]


def micros(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000)


async def new_store(folder: Path) -> Any:
    from without_durability import SqliteDurable

    return await SqliteDurable.open(folder / "bench.db", namespace=NAMESPACE)


def bare(folder: Path) -> sqlite3.Connection:
    """A plain connection to a store file the store created (same schema), with the store's
    settings."""
    db = sqlite3.connect(folder / "bench.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db


async def take_ours(folder: Path, n: int) -> dict[str, Any]:
    durable = await new_store(folder)
    try:
        sched = durable.scheduler
        past = datetime.now(UTC) - timedelta(hours=1)
        await durable.conn.write(lambda cur: [sched._schedule_in(cur, x, past) for x in ids(n)])
        got: list[str] = []

        async def one() -> None:
            while (d := await sched.take(VISIBILITY)) is not None:
                got.append(d.workflow)
                await sched.wake_at(d, None)

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(WORKERS)))
        seconds = time.perf_counter() - start
    finally:
        await durable.close()
    return {"system": "ours-take", "rate": len(got) / seconds, **check_exactly_once("take", ids(n), got)}


def take_bare(folder: Path, n: int) -> dict[str, Any]:
    from without_durability import sqlite as s

    db = bare(folder)
    try:
        past = micros(datetime.now(UTC) - timedelta(hours=1))
        db.execute("BEGIN IMMEDIATE")
        db.executemany(s.SCHEDULE, [{"namespace": NAMESPACE, "workflow": x, "at": past} for x in ids(n)])
        db.execute("COMMIT")
        got: list[str] = []
        span = VISIBILITY // timedelta(microseconds=1)
        start = time.perf_counter()
        while True:
            db.execute("BEGIN IMMEDIATE")
            now = micros(datetime.now(UTC))
            row = db.execute(s.NEXT_DUE, {"namespace": NAMESPACE, "now": now}).fetchone()
            if row is None:
                db.execute("COMMIT")
                break
            hidden = now + span
            db.execute(s.HIDE, {"namespace": NAMESPACE, "workflow": row[0], "hidden": hidden})
            db.execute("COMMIT")
            got.append(row[0])
            db.execute("BEGIN IMMEDIATE")
            db.execute(s.ANSWER_DONE, {"namespace": NAMESPACE, "workflow": row[0], "taken": hidden})
            db.execute("COMMIT")
        seconds = time.perf_counter() - start
    finally:
        db.close()
    return {"system": "bare-take", "rate": len(got) / seconds, **check_exactly_once("take", ids(n), got)}


def plan(m: int) -> list[tuple[str, dict[str, int]]]:
    return [(f"wf-{i % TARGETS}", {"n": i}) for i in range(m)]


async def append_ours(folder: Path, m: int) -> dict[str, Any]:
    durable = await new_store(folder)
    try:
        cp = durable.checkpointer
        queue = iter(plan(m))
        got: list[tuple[str, str, object]] = []

        async def one() -> None:
            for workflow, value in queue:
                got.append((workflow, await cp.append(workflow, value), value))

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(WORKERS)))
        seconds = time.perf_counter() - start
        bad = 0
        for w in {w for w, _, _ in got}:
            loaded = await cp.load(w)
            bad += sum(1 for x, k, v in got if x == w and loaded.get(k) != v)
    finally:
        await durable.close()
    return {"system": "ours-append", "rate": len(got) / seconds, "lost_or_wrong": bad}


def append_bare(folder: Path, m: int) -> dict[str, Any]:
    from without_durability import sqlite as s
    from without_durability.codec import JsonCodec

    codec = JsonCodec()
    db = bare(folder)
    try:
        keys = []
        start = time.perf_counter()
        for workflow, value in plan(m):
            db.execute("BEGIN IMMEDIATE")
            row = db.execute(s.APPEND, {"workflow": workflow, "value": codec.encode(value),
                                        "now": micros(datetime.now(UTC))}).fetchone()
            db.execute("COMMIT")
            keys.append(row[0])
        seconds = time.perf_counter() - start
        stored = db.execute("SELECT count(*) FROM checkpoint").fetchone()[0]
    finally:
        db.close()
    return {"system": "bare-append", "rate": len(keys) / seconds, "lost_or_wrong": m - stored}


async def main(folder: Path, quick: bool) -> dict[str, Any]:
    n = 960 if quick else 4800
    rounds = int(os.environ.get("WD_BENCH_ROUNDS", 3))
    steps = [
        ("ours-take", lambda d: take_ours(d, n)),
        ("bare-take", lambda d: asyncio.to_thread(take_bare, d, n)),
        ("ours-append", lambda d: append_ours(d, n)),
        ("bare-append", lambda d: asyncio.to_thread(append_bare, d, n)),
    ]
    raw: list[dict[str, Any]] = []
    for r in range(rounds):
        for name, step in steps:
            with tempfile.TemporaryDirectory(prefix="wd-sqlite-ceiling-") as tmp:
                if name.startswith("bare"):  # the store creates the file, so the schema is its own
                    await (await new_store(Path(tmp))).close()
                got = await step(Path(tmp))
            raw.append({**got, "round": r})
            print(f"  {name} (round {r + 1}): {got['rate']:,.0f}/s", flush=True)
    rows = []
    for name, _ in steps:
        mine = [x for x in raw if x["system"] == name]
        rows.append({"system": name, "rate": statistics.median(x["rate"] for x in mine),
                     "rates": [x["rate"] for x in mine],
                     "lost": sum(int(x.get("lost", 0)) + int(x.get("lost_or_wrong", 0)) for x in mine),
                     "duplicated": sum(int(x.get("duplicated", 0)) for x in mine)})
    rate = {r["system"]: r["rate"] for r in rows}
    result = {"benchmark": "sqlite_ceiling", "n": n, "rounds": rounds, "workers": WORKERS, "rows": rows,
              "raw": raw, "take/bare": ratio(rate["ours-take"], rate["bare-take"]),
              "append/bare": ratio(rate["ours-append"], rate["bare-append"]), "machine": machine()}
    save_json(folder, "sqlite_ceiling", result)
    text = table(["system", "rate (median)", "rounds", "lost", "dup"],
                 [[r["system"], r["rate"], ", ".join(f"{x:,.0f}" for x in r["rates"]), r["lost"], r["duplicated"]]
                  for r in rows])
    summary = (f"# SQLite against bare sqlite3\n\n{n} deliveries / appends per round, {rounds} interleaved "
               f"rounds, medians; ours with {WORKERS} tasks, bare one loop.\n\n{text}\n\n"
               f"take / bare: {result['take/bare']:.2f}; append / bare: {result['append/bare']:.2f}\n\n"
               f"Machine: {result['machine']}\n")
    write_summary(folder, "sqlite_ceiling", summary)
    print(text)
    print(f"\ntake / bare {result['take/bare']:.2f}, append / bare {result['append/bare']:.2f}")
    return result


if __name__ == "__main__":
    args = parser(__doc__ or "").parse_args()
    out = report_dir(args.out)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(out, args.quick))
    print(f"\nreport: {out}")
