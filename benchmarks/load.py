"""Load with locust: the take and append locustfiles (custom users, headless) against Postgres and
Redis, their CSV stats kept in the report, plus each run's own loss/duplicate check.

    python -m benchmarks.load [--quick] [--out DIR]
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ._common import ROOT, machine, parser, plot, report_dir, save_json, servers, table, write_summary
from .locust_support import ENV_RESULT, ENV_STORE, ENV_URL

USERS = 8
QUEUED = 1000


def run_locust(folder: Path, name: str, store: str, url: str, seconds: int) -> dict[str, Any]:
    prefix = folder / f"locust_{name}_{store}"
    result = folder / f"locust_{name}_{store}_check.json"
    env = {**os.environ, "LOCUST_SKIP_MONKEY_PATCH": "1", ENV_STORE: store, ENV_URL: url,
           ENV_RESULT: str(result), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "benchmarks" / f"locustfile_{name}.py"),
           "--headless", "-u", str(USERS), "-r", str(USERS), "-t", f"{seconds}s", "--csv", str(prefix),
           "--only-summary", "--loglevel", "WARNING", "--stop-timeout", "30"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=seconds + 180)
    (folder / f"locust_{name}_{store}.log").write_text(out.stdout + out.stderr)
    stats: dict[str, dict[str, str]] = {}
    with open(f"{prefix}_stats.csv") as f:
        for rec in csv.DictReader(f):
            stats[rec["Name"]] = rec
    check = json.loads(result.read_text()) if result.exists() else {"error": "no check written"}
    history: list[tuple[float, float]] = []
    with open(f"{prefix}_stats_history.csv") as f:
        for rec in csv.DictReader(f):
            if rec["Name"] == "Aggregated" and rec["Requests/s"] not in ("", "N/A"):
                history.append((float(rec["Timestamp"]), float(rec["Requests/s"])))
    main_name = "take" if name == "take" else "append"
    row = stats.get(main_name, {})
    return {"locustfile": name, "store": store, "users": USERS, "seconds": seconds,
            "ops_per_s": float(row.get("Requests/s") or 0), "p50_ms": row.get("50%"), "p99_ms": row.get("99%"),
            "failures": int(row.get("Failure Count") or 0), "check": check, "returncode": out.returncode,
            "history": history}


async def prepare(kind: str, name: str, urls: dict[str, str], stack: Any) -> str:
    """Fresh state for one run; the URL the locustfile should use."""
    if kind == "postgres":
        from without_durability_postgres.kit import fresh_schema

        pool, schema = await stack.enter_async_context(fresh_schema(urls["postgres"], min_size=1, max_size=2))
        if name == "take":
            async with pool.connection() as conn:
                await conn.execute(
                    "INSERT INTO workflow_queue (namespace, workflow, visibility) "
                    "SELECT 'default', 'load-' || i, now() - interval '1 hour' FROM generate_series(1, %(n)s) i",
                    {"n": QUEUED})
        return f"{urls['postgres']}?options={quote(f'-c search_path={schema}')}"
    from redis.asyncio import Redis

    from without_durability_redis import RedisSetScheduler

    client = Redis.from_url(urls["redis"])
    try:
        await client.flushdb()
        if name == "take":
            sched = RedisSetScheduler(client)
            for i in range(0, QUEUED, 50):
                await asyncio.gather(*(sched.schedule(f"load-{j}") for j in range(i, i + 50)))
    finally:
        await client.aclose()
    return urls["redis"]


async def main(folder: Path, quick: bool) -> dict[str, Any]:
    import contextlib

    seconds = 8 if quick else 30
    rows = []
    with servers("postgres", "redis") as srv:
        urls = {"postgres": srv["postgres"].url, "redis": srv["redis"].url}
        for name in ("take", "append"):
            for kind in ("postgres", "redis-set"):
                async with contextlib.AsyncExitStack() as stack:
                    url = await prepare(kind, name, urls, stack)
                    t0 = time.perf_counter()
                    rows.append(await asyncio.to_thread(run_locust, folder, name, kind, url, seconds))
                    print(f"  locust {name} {kind}: {time.perf_counter() - t0:.1f}s", flush=True)
    plot(folder, "locust", f"Locust: {USERS} users, requests/s over time", "unix time", "requests/s",
         {f"{r['locustfile']} {r['store']}": ([t for t, _ in r["history"]], [v for _, v in r["history"]])
          for r in rows})
    t = table(["locustfile", "store", "users", "ops/s", "p50 ms", "p99 ms", "failures", "check"],
              [[r["locustfile"], r["store"], r["users"], r["ops_per_s"], r["p50_ms"], r["p99_ms"],
                r["failures"], json.dumps(r["check"])] for r in rows])
    result = {"benchmark": "load", "machine": machine(), "rows": rows}
    save_json(folder, "load", result)
    write_summary(folder, "load", f"# Load with locust\n\nHeadless, {USERS} custom users each, {seconds}s; "
                  f"CSVs beside this file (`locust_*_stats.csv`).\n\n{t}\n")
    print(t)
    return result


if __name__ == "__main__":
    args = parser(__doc__ or "").parse_args()
    out = report_dir(args.out)
    asyncio.run(main(out, args.quick))
    print(f"\nreport: {out}")
