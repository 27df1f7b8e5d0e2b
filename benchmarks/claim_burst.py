"""Claims per second of a concurrent burst on one workflow (``RedisCheckpointer.claim`` with a lease
of a microsecond, so each claim mints a token), with the checkpointer's calls sent together (as it
ships) and each alone (as before), interleaved so machine load falls on both alike; and how far
ahead of the server's clock the burst ran the tokens (claims faster than one a millisecond). The
chaos ``claim-burst`` round needs a lead longer than its retention.

    python -m benchmarks.claim_burst [--quick] [--out DIR]
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

from ._common import machine, parser, report_dir, save_json, table

TASKS = (1, 16, 64)
TINY = timedelta(microseconds=1)


async def _measure(url: str, coalesce: bool, tasks: int, seconds: float, n: int) -> dict[str, Any]:
    from redis.asyncio import Redis

    from without_durability_redis import RedisCheckpointer
    from without_durability_redis._scripts import Scripts

    client = Redis.from_url(url)
    cp = RedisCheckpointer(client, prefix=f"bench-burst-{n}:", warn_persistence=False)
    cp._scripts = Scripts(client, {}, coalesce=coalesce)
    await cp.claim("w", alive=TINY, budget=TINY)
    made = 0
    end = time.monotonic() + seconds

    async def claimer() -> None:
        nonlocal made
        while time.monotonic() < end:
            await cp.claim("w", alive=TINY, budget=TINY)
            made += 1

    started = time.monotonic()
    await asyncio.gather(*(claimer() for _ in range(tasks)))
    took = time.monotonic() - started
    last = int(await client.hget(cp.claim_key("w"), "token"))
    now = await client.time()
    await client.aclose()
    return {
        "sent": "together" if coalesce else "alone",
        "tasks": tasks,
        "claims": made,
        "per_second": round(made / took),
        "lead_ms": last - (now[0] * 1000 + now[1] // 1000),
    }


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    out = report_dir(args.out)
    seconds = 1.0 if args.quick else 3.0
    from without_durability_redis.local_server import local_redis

    rows = []
    with local_redis() as server:
        n = 0
        for tasks in TASKS:
            for coalesce in (False, True):
                n += 1
                rows.append(asyncio.run(_measure(server.url, coalesce, tasks, seconds, n)))
    save_json(out, "claim_burst", {"machine": machine(), "seconds": seconds, "rows": rows})
    shown = table(
        ["calls sent", "tasks", "claims", "claims/s", "token lead over the clock, ms"],
        [[r["sent"], r["tasks"], r["claims"], r["per_second"], r["lead_ms"]] for r in rows],
    )
    (out / "claim_burst.md").write_text(shown + "\n")
    print(shown)


if __name__ == "__main__":
    main()
