"""SQLite against its own ceiling: take (then answer) and append through this library, beside the
very same statements run through bare ``sqlite3`` in the same process, on the same kind of file.

    python -m benchmarks.sqlite_ceiling [--quick] [--out DIR]

Ours: 8 asyncio tasks calling ``SqliteScheduler.take`` then ``wake_at(None)``, and 8 calling
``SqliteCheckpointer.append`` over 10 workflows, through the store's one connection thread. Bare:
one loop on a plain ``sqlite3`` connection with the store's settings (WAL, ``synchronous=FULL``,
autocommit off by hand), each step its own ``BEGIN IMMEDIATE`` ... ``COMMIT`` as the store's
write transaction is: ``NEXT_DUE`` + ``HIDE``, then ``ANSWER_DONE``; and ``APPEND``. SQLite has one
writer, so the bare loop is as fast as these statements go here, and the ratio is what the store's
thread hand-off, asyncio and checks cost. Every commit waits for an fsync, whose time on a shared
disk swings by several times within seconds, so ours and bare run side by side on two files,
taking turns a few dozen operations at a time (see ``duel``); ``WD_BENCH_ROUNDS`` rounds (default
3), the ratio is the median of the rounds' ratios; every delivery must be handed out exactly once
and every append load back.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sqlite3
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ._common import check_exactly_once, machine, parser, report_dir, save_json, table, write_summary

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
    settings. Used from one thread at a time (a worker thread's, in turns with the event loop's)."""
    db = sqlite3.connect(folder / "bench.db", isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db


class TakeOurs:
    """``SqliteScheduler.take`` then ``wake_at(None)`` by ``WORKERS`` tasks, ``count`` deliveries at a
    time."""

    system = "ours-take"

    def __init__(self, folder: Path, n: int) -> None:
        self.folder, self.n, self.got = folder, n, []

    async def open(self) -> None:
        self.durable = await new_store(self.folder)
        sched = self.durable.scheduler
        past = datetime.now(UTC) - timedelta(hours=1)
        await self.durable.conn.write(lambda cur: [sched._schedule_in(cur, x, past) for x in ids(self.n)])

    async def run(self, count: int) -> float:
        sched, left = self.durable.scheduler, count

        async def one() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                d = await sched.take(VISIBILITY)
                if d is None:
                    return
                self.got.append(d.workflow)
                await sched.wake_at(d, None)

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(WORKERS)))
        return time.perf_counter() - start

    async def close(self) -> dict[str, Any]:
        await self.durable.close()
        return check_exactly_once("take", ids(self.n), self.got)


class TakeBare:
    """The same statements through a plain ``sqlite3`` connection, one loop: ``NEXT_DUE`` + ``HIDE``
    in one ``BEGIN IMMEDIATE`` ... ``COMMIT``, then ``ANSWER_DONE`` in another."""

    system = "bare-take"

    def __init__(self, folder: Path, n: int) -> None:
        self.folder, self.n, self.got = folder, n, []

    async def open(self) -> None:
        from without_durability import sqlite as s

        await (await new_store(self.folder)).close()  # the store creates the file: the schema is its own
        self.db = bare(self.folder)
        past = micros(datetime.now(UTC) - timedelta(hours=1))
        self.db.execute("BEGIN IMMEDIATE")
        self.db.executemany(s.SCHEDULE, [{"namespace": NAMESPACE, "workflow": x, "at": past} for x in ids(self.n)])
        self.db.execute("COMMIT")

    async def run(self, count: int) -> float:
        return await asyncio.to_thread(self._run, count)

    def _run(self, count: int) -> float:
        from without_durability import sqlite as s

        db, span = self.db, VISIBILITY // timedelta(microseconds=1)
        start = time.perf_counter()
        for _ in range(count):
            db.execute("BEGIN IMMEDIATE")
            now = micros(datetime.now(UTC))
            row = db.execute(s.NEXT_DUE, {"namespace": NAMESPACE, "now": now}).fetchone()
            if row is None:
                db.execute("COMMIT")
                break
            hidden = now + span
            db.execute(s.HIDE, {"namespace": NAMESPACE, "workflow": row[0], "hidden": hidden})
            db.execute("COMMIT")
            self.got.append(row[0])
            db.execute("BEGIN IMMEDIATE")
            db.execute(s.ANSWER_DONE, {"namespace": NAMESPACE, "workflow": row[0], "taken": hidden})
            db.execute("COMMIT")
        return time.perf_counter() - start

    async def close(self) -> dict[str, Any]:
        self.db.close()
        return check_exactly_once("take", ids(self.n), self.got)


def plan(m: int) -> list[tuple[str, dict[str, int]]]:
    return [(f"wf-{i % TARGETS}", {"n": i}) for i in range(m)]


class AppendOurs:
    """``SqliteCheckpointer.append`` over ``TARGETS`` workflows by ``WORKERS`` tasks."""

    system = "ours-append"

    def __init__(self, folder: Path, n: int) -> None:
        self.folder, self.queue, self.got = folder, iter(plan(n)), []

    async def open(self) -> None:
        self.durable = await new_store(self.folder)

    async def run(self, count: int) -> float:
        cp, left = self.durable.checkpointer, count

        async def one() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                item = next(self.queue, None)
                if item is None:
                    return
                self.got.append((item[0], await cp.append(*item), item[1]))

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(WORKERS)))
        return time.perf_counter() - start

    async def close(self) -> dict[str, Any]:
        cp, bad = self.durable.checkpointer, 0
        for w in {w for w, _, _ in self.got}:
            loaded = await cp.load(w)
            bad += sum(1 for x, k, v in self.got if x == w and loaded.get(k) != v)
        await self.durable.close()
        return {"lost_or_wrong": bad}


class AppendBare:
    """The store's ``APPEND`` through a plain ``sqlite3`` connection, one loop, each in its own
    ``BEGIN IMMEDIATE`` ... ``COMMIT``, the value encoded by the store's codec."""

    system = "bare-append"

    def __init__(self, folder: Path, n: int) -> None:
        self.folder, self.n, self.queue, self.keys = folder, n, iter(plan(n)), []

    async def open(self) -> None:
        from without_durability.codec import JsonCodec

        await (await new_store(self.folder)).close()
        self.db, self.codec = bare(self.folder), JsonCodec()

    async def run(self, count: int) -> float:
        return await asyncio.to_thread(self._run, count)

    def _run(self, count: int) -> float:
        from without_durability import sqlite as s

        db = self.db
        start = time.perf_counter()
        for workflow, value in itertools.islice(self.queue, count):
            db.execute("BEGIN IMMEDIATE")
            row = db.execute(s.APPEND, {"workflow": workflow, "value": self.codec.encode(value),
                                        "now": micros(datetime.now(UTC))}).fetchone()
            db.execute("COMMIT")
            self.keys.append(row[0])
        return time.perf_counter() - start

    async def close(self) -> dict[str, Any]:
        stored = self.db.execute("SELECT count(*) FROM checkpoint").fetchone()[0]
        self.db.close()
        return {"lost_or_wrong": self.n - stored}


async def duel(ours: Any, theirs: Any, n: int, slice_: int) -> list[dict[str, Any]]:
    """Ours and bare, each on its own file, taking turns ``slice_`` operations at a time until both
    have done ``n``: every commit here waits for the disk's fsync, whose time swings by several
    times within seconds on a shared machine, so two runs one after the other compare two different
    disks; slices a fraction of a second apart see the same one. Time counts only inside slices."""
    for side in (ours, theirs):
        await side.open()
    spent = {ours.system: 0.0, theirs.system: 0.0}
    for i in range(0, n, slice_):
        order = (ours, theirs) if (i // slice_) % 2 == 0 else (theirs, ours)  # neither always goes first
        for side in order:
            spent[side.system] += await side.run(min(slice_, n - i))
    return [{"system": side.system, "rate": n / spent[side.system], **await side.close()}
            for side in (ours, theirs)]


async def main(folder: Path, quick: bool) -> dict[str, Any]:
    n = 960 if quick else 4800
    slice_ = 40
    rounds = int(os.environ.get("WD_BENCH_ROUNDS", 3))
    duels = [("take", TakeOurs, TakeBare), ("append", AppendOurs, AppendBare)]
    raw: list[dict[str, Any]] = []
    for r in range(rounds):
        for what, ours, theirs in duels:
            with tempfile.TemporaryDirectory(prefix="wd-sqlite-ceiling-") as tmp:
                a, b = Path(tmp) / "ours", Path(tmp) / "bare"
                a.mkdir()
                b.mkdir()
                got = await duel(ours(a, n), theirs(b, n), n, slice_)
            for x in got:
                raw.append({**x, "round": r})
            print(f"  {what} (round {r + 1}): " + ", ".join(f"{x['system']} {x['rate']:,.0f}/s" for x in got)
                  + f"; ratio {got[0]['rate'] / got[1]['rate']:.2f}", flush=True)
    systems = ["ours-take", "bare-take", "ours-append", "bare-append"]
    rows = []
    for name in systems:
        mine = [x for x in raw if x["system"] == name]
        rows.append({"system": name, "rate": statistics.median(x["rate"] for x in mine),
                     "rates": [x["rate"] for x in mine],
                     "lost": sum(int(x.get("lost", 0)) + int(x.get("lost_or_wrong", 0)) for x in mine),
                     "duplicated": sum(int(x.get("duplicated", 0)) for x in mine)})

    def paired(what: str) -> list[float]:
        return [o["rate"] / b["rate"] for o, b in zip([x for x in raw if x["system"] == f"ours-{what}"],
                                                      [x for x in raw if x["system"] == f"bare-{what}"], strict=True)]

    result = {"benchmark": "sqlite_ceiling", "n": n, "rounds": rounds, "workers": WORKERS, "slice": slice_,
              "rows": rows, "raw": raw,
              "take/bare": statistics.median(paired("take")), "append/bare": statistics.median(paired("append")),
              "round_ratios": {"take/bare": paired("take"), "append/bare": paired("append")},
              "machine": machine()}
    save_json(folder, "sqlite_ceiling", result)
    text = table(["system", "rate (median)", "rounds", "lost", "dup"],
                 [[r["system"], r["rate"], ", ".join(f"{x:,.0f}" for x in r["rates"]), r["lost"], r["duplicated"]]
                  for r in rows])
    summary = (f"# SQLite against bare sqlite3\n\n{n} deliveries / appends per round, ours and bare taking "
               f"turns {slice_} at a time, {rounds} rounds; ratios are medians of each round's ratio; ours "
               f"with {WORKERS} tasks, bare one loop.\n\n{text}\n\n"
               f"take / bare: {result['take/bare']:.2f} (rounds: {', '.join(f'{x:.2f}' for x in paired('take'))}); "
               f"append / bare: {result['append/bare']:.2f} "
               f"(rounds: {', '.join(f'{x:.2f}' for x in paired('append'))})\n\nMachine: {result['machine']}\n")
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
