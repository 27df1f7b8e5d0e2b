"""Pickup latency: from the ``arrive`` call to the workflow's pass starting, p50/p99, against the
poll interval, with and without a wakeup path.

    python -m benchmarks.pickup [--quick] [--out DIR]

One real ``Worker`` idles on an empty queue; a producer arrives one workflow at a time at a random
moment (uniform over one poll interval, so arrivals land at every phase of the poll cycle), waits
for its pass to start, and records the gap. The clock starts before ``arrive`` is called, so the
arrive's own commit is included. Wakeup paths: Postgres LISTEN/NOTIFY (``PostgresScheduler(
notify=True)`` + ``PostgresWakeup``), and the Redis stream scheduler's blocking read (its ``wait``).
The sorted-set and SQLite schedulers have none and are shown polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from ._common import (
    machine,
    parser,
    plot,
    postgres_settings,
    report_dir,
    save_json,
    servers,
    table,
    write_summary,
)

POLLS = (timedelta(milliseconds=10), timedelta(milliseconds=100), timedelta(seconds=1))
LONG = timedelta(hours=1)


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


@contextlib.asynccontextmanager
async def store(kind: str, wakeup: bool, urls: dict[str, str]) -> AsyncIterator[tuple[Any, Any]]:
    """(durable, wakeup or None) for one configuration."""
    if kind == "postgres":
        from without_durability.testing.stores.postgres import fresh_schema
        from without_durability_postgres import (
            PostgresCheckpointer,
            PostgresDurable,
            PostgresScheduler,
            PostgresWakeup,
        )

        async with fresh_schema(urls["postgres"], min_size=3, max_size=6) as (pool, schema):
            sched = PostgresScheduler(pool, namespace=schema, notify=wakeup)
            durable = PostgresDurable(PostgresCheckpointer(pool=pool), sched)
            if not wakeup:
                yield durable, None
                return
            async with PostgresWakeup(pool, namespace=schema) as listener:
                yield durable, listener
    elif kind.startswith("redis"):
        from redis.asyncio import Redis

        from without_durability import SplitDurable
        from without_durability_redis import RedisCheckpointer, RedisSetScheduler, RedisStreamScheduler

        client = Redis.from_url(urls["redis"])
        try:
            await client.flushdb()
            cls = RedisStreamScheduler if kind == "redis-stream" else RedisSetScheduler
            sched: Any = cls(client)
            yield SplitDurable(RedisCheckpointer(client), sched), (sched if wakeup else None)
        finally:
            await client.aclose()
    else:
        from without_durability import SqliteDurable

        with tempfile.TemporaryDirectory(prefix="wd-pickup-") as tmp:
            async with await SqliteDurable.open(Path(tmp) / "pickup.db") as durable:
                yield durable, None


async def measure(kind: str, wakeup: bool, poll: timedelta, samples: int, urls: dict[str, str],
                  rng: random.Random) -> dict[str, Any]:
    from without_durability import Run, Worker

    started: dict[str, float] = {}
    seen = asyncio.Condition()

    async def body(run: Run[Any]) -> object:
        async with seen:
            started.setdefault(run.workflow, time.perf_counter())
            seen.notify_all()
        return None

    gaps: list[float] = []
    commits: list[float] = []  # the arrive call alone (its commit), part of every gap
    async with store(kind, wakeup, urls) as (durable, waker):
        worker = Worker(durable, body, alive=LONG, budget=LONG, visibility=LONG, poll_interval=poll,
                        wakeup=waker)
        task = asyncio.create_task(worker.run())
        try:
            for i in range(samples):
                await asyncio.sleep(rng.uniform(0.0, poll.total_seconds()) + 0.005)
                w = f"pickup-{i}"
                t0 = time.perf_counter()
                await durable.arrive(w, "go", i)
                t1 = time.perf_counter()
                async with asyncio.timeout(poll.total_seconds() + 30), seen:
                    await seen.wait_for(lambda w=w: w in started)
                gaps.append(started[w] - t0)
                commits.append(t1 - t0)
        finally:
            worker.stop()
            await asyncio.gather(task, return_exceptions=True)
    ms = [g * 1000 for g in gaps]
    return {"store": kind, "wakeup": wakeup, "poll_ms": poll.total_seconds() * 1000, "samples": len(ms),
            "p50_ms": quantile(ms, 0.5), "p99_ms": quantile(ms, 0.99), "mean_ms": statistics.fmean(ms),
            "max_ms": max(ms), "lost": samples - len(ms),
            "arrive_call_p50_ms": quantile([c * 1000 for c in commits], 0.5),
            "after_arrive_p50_ms": quantile([(g - c) * 1000 for g, c in zip(gaps, commits, strict=True)], 0.5)}


CONFIGS: tuple[tuple[str, bool], ...] = (
    ("postgres", False), ("postgres", True), ("redis-stream", False), ("redis-stream", True),
    ("redis-set", False), ("sqlite", False),
)


def samples_for(poll: timedelta, quick: bool) -> int:
    per = {0.01: 200, 0.1: 100, 1.0: 40}[poll.total_seconds()]
    return max(10, per // 5) if quick else per


async def main(folder: Path, quick: bool) -> dict[str, Any]:
    rng = random.Random(20261129)
    rows = []
    with servers("postgres", "redis") as srv:
        urls = {"postgres": srv["postgres"].url, "redis": srv["redis"].url}
        settings = await postgres_settings(urls["postgres"])
        for kind, wake in CONFIGS:
            for poll in POLLS:
                t0 = time.perf_counter()
                try:
                    rows.append(await measure(kind, wake, poll, samples_for(poll, quick), urls, rng))
                except Exception as exc:
                    rows.append({"store": kind, "wakeup": wake, "poll_ms": poll.total_seconds() * 1000,
                                 "error": f"{type(exc).__name__}: {exc}"})
                print(f"  {kind} wakeup={wake} poll={poll.total_seconds() * 1000:g}ms: "
                      f"{time.perf_counter() - t0:.1f}s", flush=True)
    good = [r for r in rows if "error" not in r]
    label: Callable[[dict[str, Any]], str] = lambda r: f"{r['store']}{' +wakeup' if r['wakeup'] else ''}"  # noqa: E731
    series = {}
    for name in dict.fromkeys(label(r) for r in good):
        pts = [r for r in good if label(r) == name]
        series[f"{name} p50"] = ([r["poll_ms"] for r in pts], [r["p50_ms"] for r in pts])
        series[f"{name} p99"] = ([r["poll_ms"] for r in pts], [r["p99_ms"] for r in pts])
    plot(folder, "pickup", "Pickup latency (arrive -> pass start)", "poll interval (ms)", "latency (ms)",
         series, logx=True, logy=True)
    text_table = table(["store", "wakeup", "poll ms", "samples", "p50 ms", "p99 ms", "max ms",
                        "arrive call p50 ms", "after arrive p50 ms"],
                       [[r["store"], r["wakeup"], r["poll_ms"], r.get("samples"), r.get("p50_ms"),
                         r.get("p99_ms"), r.get("max_ms", r.get("error")), r.get("arrive_call_p50_ms"),
                         r.get("after_arrive_p50_ms")] for r in rows])
    result = {"benchmark": "pickup", "machine": machine(), "postgres_settings": settings, "rows": rows}
    save_json(folder, "pickup", result)
    write_summary(folder, "pickup", f"# Pickup latency\n\nFrom the arrive call to the pass starting; one "
                  f"idle Worker.\n\n{text_table}\n\nMachine: {result['machine']}\n")
    print(text_table)
    return result


if __name__ == "__main__":
    args = parser(__doc__ or "").parse_args()
    out = report_dir(args.out)
    asyncio.run(main(out, args.quick))
    print(f"\nreport: {out}")
