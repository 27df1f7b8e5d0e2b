"""Worker memory over a long take run: does a Worker's resident memory stay flat?

    python -m benchmarks.memory_soak [--minutes 10] [--workers 8] [--rate 300] [--out DIR]

Eight real ``Worker`` objects (take, claim, resume a trivial body, release, answer) run in this
process against a private Postgres. A feeder re-schedules every finished workflow, paced to at most
``--rate`` passes per second so the run does not eat the shared machine. This process's RSS is
sampled with psutil every 2 s. "Flat" is judged on the median RSS of the last minute against the
median of the minute after a one-minute warm-up (allocator pools, prepared statements and the
connection pool settle in the first seconds); the run passes when the change is within 10%.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil

from ._common import machine, parser, plot, report_dir, save_json, servers, table, write_summary

LONG = timedelta(hours=1)


async def soak(url: str, minutes: float, workers: int, rate: float, folder: Path) -> dict[str, Any]:
    from without_durability import Run, Worker
    from without_durability_postgres import PostgresCheckpointer, PostgresDurable, PostgresScheduler
    from without_durability_postgres.kit import fresh_schema

    proc = psutil.Process()
    samples: list[tuple[float, int]] = []
    finished: asyncio.Queue[str] = asyncio.Queue()

    async def body(run: Run[Any]) -> object:
        finished.put_nowait(run.workflow)
        return None

    async with fresh_schema(url, min_size=workers + 1, max_size=workers + 2) as (pool, _):
        durable = PostgresDurable(PostgresCheckpointer(pool=pool), PostgresScheduler(pool=pool))
        for i in range(200):
            await durable.scheduler.schedule(f"soak-{i:04d}")
        fleet = [Worker(durable, body, alive=timedelta(seconds=30), budget=timedelta(minutes=5),
                        visibility=timedelta(minutes=10), poll_interval=timedelta(milliseconds=50))
                 for _ in range(workers)]
        start = time.monotonic()
        end = start + minutes * 60

        async def feeder() -> None:
            gap = 1.0 / rate
            while time.monotonic() < end:
                w = await finished.get()
                await durable.scheduler.schedule(w)
                await asyncio.sleep(gap)

        async def sampler() -> None:
            while time.monotonic() < end:
                samples.append((time.monotonic() - start, proc.memory_info().rss))
                await asyncio.sleep(2.0)

        tasks = [asyncio.create_task(w.run(until=lambda: time.monotonic() >= end)) for w in fleet]
        await asyncio.gather(feeder(), sampler(), *tasks)
        passes = sum(w.passes for w in fleet)
    secs = samples[-1][0] if samples else 0.0
    warm = [r for t, r in samples if 60 <= t < 120] or [r for _, r in samples[: max(1, len(samples) // 5)]]
    last = [r for t, r in samples if t >= secs - 60] or [samples[-1][1]]
    early, late = statistics.median(warm), statistics.median(last)
    change = (late - early) / early
    result = {"benchmark": "memory_soak", "minutes": minutes, "workers": workers, "rate_cap": rate,
              "passes": passes, "passes_per_s": passes / max(secs, 1e-9), "samples": samples,
              "rss_after_warmup_mb": early / 2**20, "rss_last_minute_mb": late / 2**20,
              "change": change, "flat_within_10pct": abs(change) <= 0.10, "machine": machine(),
              "method": "psutil RSS of the worker process every 2 s; median of minute 2 vs median of the last minute"}
    save_json(folder, "memory_soak", result)
    plot(folder, "memory_soak", "Worker RSS during a take run", "seconds", "RSS (MiB)",
         {"rss": ([t for t, _ in samples], [r / 2**20 for _, r in samples])})
    text = table(["minutes", "workers", "passes", "passes/s", "RSS min 2 (MiB)", "RSS last min (MiB)",
                  "change", "flat (<=10%)"],
                 [[minutes, workers, passes, result["passes_per_s"], result["rss_after_warmup_mb"],
                   result["rss_last_minute_mb"], f"{change:+.1%}", result["flat_within_10pct"]]])
    write_summary(folder, "memory_soak", f"# Worker memory soak\n\n{result['method']}.\n\n{text}\n")
    print(text)
    return result


async def main(folder: Path, minutes: float, workers: int, rate: float) -> dict[str, Any]:
    with servers("postgres") as srv:
        return await soak(srv["postgres"].url, minutes, workers, rate, folder)


if __name__ == "__main__":
    p = parser(__doc__ or "")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--rate", type=float, default=300.0)
    args = p.parse_args()
    out = report_dir(args.out)
    asyncio.run(main(out, 1.0 if args.quick else args.minutes, args.workers, args.rate))
    print(f"\nreport: {out}")
