"""What ``RedisCheckpointer(replicas=1)`` (``WAIT 1`` after every write) costs: ``supply`` calls
per second and their latency, with and without it, on a private primary with two replicas under
Sentinel, reached through ``Sentinel.master_for`` as a deployment would. What it buys is measured
by ``wd-chaos run failover-async --store redis`` (no WAIT) against ``wd-chaos run failover --store
redis`` (WAIT 1): see README, Failover.

    python -m benchmarks.redis_wait [--quick] [--out DIR]
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from ._common import machine, parser, report_dir, save_json, table

CONCURRENCY = (1, 16)


async def _measure(pair: Any, replicas: int, concurrency: int, seconds: float) -> dict[str, Any]:
    from redis.asyncio.sentinel import Sentinel

    from without_durability_redis import RedisCheckpointer

    untyped: Any = Sentinel
    client = untyped(pair.sentinels, socket_timeout=5).master_for(pair.service, socket_timeout=5)
    cp = RedisCheckpointer(client, prefix=f"bench-wait{replicas}-c{concurrency}:", replicas=replicas)
    latencies: list[float] = []
    end = time.monotonic() + seconds

    async def one(worker: int) -> None:
        n = 0
        while time.monotonic() < end:
            n += 1
            t = time.perf_counter()
            await cp.supply(f"w{worker}-{n % 50}", f"k{n}", {"n": n})
            latencies.append(time.perf_counter() - t)

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(concurrency)))
    took = time.monotonic() - started
    await client.aclose()
    latencies.sort()
    return {
        "replicas": replicas,
        "concurrency": concurrency,
        "calls": len(latencies),
        "per_second": round(len(latencies) / took),
        "p50_ms": round(statistics.median(latencies) * 1000, 3),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 3),
    }


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    out = report_dir(args.out)
    seconds = 2.0 if args.quick else 6.0
    from without_durability_redis.replicated import replicated_redis

    rows = []
    with replicated_redis() as pair:
        for concurrency in CONCURRENCY:
            for replicas in (0, 1):  # interleaved, so machine load falls on both alike
                rows.append(asyncio.run(_measure(pair, replicas, concurrency, seconds)))
    save_json(out, "redis_wait", {"machine": machine(), "rows": rows})
    shown = table(
        ["WAIT replicas", "concurrency", "supply/s", "p50 ms", "p99 ms"],
        [[r["replicas"], r["concurrency"], r["per_second"], r["p50_ms"], r["p99_ms"]] for r in rows],
    )
    (out / "redis_wait.md").write_text(shown + "\n")
    print(shown)


if __name__ == "__main__":
    main()
