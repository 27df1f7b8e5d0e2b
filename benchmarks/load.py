"""Load with locust: the take and append locustfiles (custom users, headless) against Postgres and
Redis, their CSV stats kept in the report, plus each run's own loss/duplicate check.

    python -m benchmarks.load [--quick] [--out DIR] [--locust-workers N] [--scaling]

``--locust-workers N`` runs locust in its own distributed mode: a master (which holds no users)
and N worker processes on this machine, the users spread over them; more machines join with
``locust --worker --master-host``. That is how load outgrows one Python process: with locust, not
with code of ours. ``--scaling`` runs the take load with one process and then with a master and
two workers, interleaved, to show whether two processes beat one here. Each process writes its own
check; they are merged, so a delivery held by two processes at once, or a key nobody was told
about, is found across processes too.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ._common import ROOT, machine, parser, plot, ratio, report_dir, save_json, servers, table, write_summary
from .locust_support import ENV_RESULT, ENV_STORE, ENV_URL


def free_port() -> int:
    from without_durability.testing.servers import free_port as port

    return int(port())

USERS = 8
QUEUED = 1000


def run_locust(folder: Path, name: str, store: str, url: str, seconds: int, workers: int = 0) -> dict[str, Any]:
    """One headless locust run; ``workers`` > 0: a master and that many worker processes."""
    label = f"{name}_{store}" + (f"_w{workers}" if workers else "")
    prefix = folder / f"locust_{label}"
    results = [folder / f"locust_{label}_check{i}.json" for i in range(max(1, workers))]
    for r in results:
        r.unlink(missing_ok=True)
    env = {**os.environ, "LOCUST_SKIP_MONKEY_PATCH": "1", ENV_STORE: store, ENV_URL: url,
           "PYTHONPATH": str(ROOT)}
    locustfile = str(ROOT / "benchmarks" / f"locustfile_{name}.py")
    cmd = [sys.executable, "-m", "locust", "-f", locustfile,
           "--headless", "-u", str(USERS), "-r", str(USERS), "-t", f"{seconds}s", "--csv", str(prefix),
           "--only-summary", "--loglevel", "WARNING", "--stop-timeout", "30"]
    workers_procs: list[subprocess.Popen[str]] = []
    if workers:
        port = free_port()
        cmd += ["--master", "--expect-workers", str(workers), "--master-bind-port", str(port)]
        for i in range(workers):
            workers_procs.append(subprocess.Popen(
                [sys.executable, "-m", "locust", "-f", locustfile, "--worker", "--master-host", "127.0.0.1",
                 "--master-port", str(port), "--loglevel", "WARNING"],
                env={**env, ENV_RESULT: str(results[i])}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True))
    # A master's messaging to its workers needs locust's monkey-patching; it runs no user, so the
    # store's real sockets are the workers' alone.
    master_env = {k: v for k, v in env.items() if not (workers and k == "LOCUST_SKIP_MONKEY_PATCH")}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 180,
                             env={**master_env, ENV_RESULT: str(results[0])})
    finally:
        logs = []
        for proc in workers_procs:
            try:
                logs.append(proc.communicate(timeout=60)[0])
            except subprocess.TimeoutExpired:
                proc.kill()
                logs.append(proc.communicate()[0])
    (folder / f"locust_{label}.log").write_text(out.stdout + out.stderr + "".join(logs))
    stats: dict[str, dict[str, str]] = {}
    with open(f"{prefix}_stats.csv") as f:
        for rec in csv.DictReader(f):
            stats[rec["Name"]] = rec
    check = merge_checks(name, [json.loads(r.read_text()) for r in results if r.exists()], len(results))
    history: list[tuple[float, float]] = []
    with open(f"{prefix}_stats_history.csv") as f:
        for rec in csv.DictReader(f):
            if rec["Name"] == "Aggregated" and rec["Requests/s"] not in ("", "N/A"):
                history.append((float(rec["Timestamp"]), float(rec["Requests/s"])))
    main_name = "take" if name == "take" else "append"
    row = stats.get(main_name, {})
    return {"locustfile": name, "store": store, "users": USERS, "seconds": seconds,
            "processes": workers or 1, "distributed": bool(workers),
            "ops_per_s": float(row.get("Requests/s") or 0), "p50_ms": row.get("50%"), "p99_ms": row.get("99%"),
            "failures": int(row.get("Failure Count") or 0), "check": check, "returncode": out.returncode,
            "history": history}


def merge_checks(name: str, parts: list[dict[str, Any]], expected: int) -> dict[str, Any]:
    """One check from every process's own. Take: each process's duplicates, plus a delivery
    handed to a process while another held the same workflow (its take returned after the
    other's take returned and before the other began to answer: the server ran it while the
    other still had the workflow). Append: lost or changed keys as each process found them, and
    keys loaded that no process was acknowledged."""
    out: dict[str, Any] = {"processes_reporting": len(parts)}
    if len(parts) < expected:
        out["error"] = f"{expected - len(parts)} process(es) wrote no check"
    if name == "take":
        out["duplicates"] = sum(int(p.get("duplicates", 0)) for p in parts)
        out["answered"] = sum(int(p.get("answered", 0)) for p in parts)
        spans: dict[str, list[tuple[float, float, int]]] = {}
        for i, p in enumerate(parts):
            for w, took, answering in p.get("spans", []):
                spans.setdefault(w, []).append((took, answering, i))
        across = 0
        for held in spans.values():
            held.sort()
            for j, (took, _, who) in enumerate(held):
                across += any(o_took < took < o_ans and other != who for o_took, o_ans, other in held[:j])
        out["duplicates_across_processes"] = across
        return out
    acked = {(w, k) for p in parts for w, keys in p.get("acked_keys", {}).items() for k in keys}
    loaded = {(w, k) for p in parts for w, keys in p.get("loaded_keys", {}).items() for k in keys}
    out.update({"acknowledged": sum(int(p.get("acknowledged", 0)) for p in parts),
                "lost": sum(int(p.get("lost", 0)) for p in parts),
                "wrong": sum(int(p.get("wrong", 0)) for p in parts),
                "unacknowledged_extra": len(loaded - acked)})
    return out


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


async def main(folder: Path, quick: bool, workers: int = 0, scaling: bool = False) -> dict[str, Any]:
    import contextlib

    seconds = 8 if quick else 30
    rows = []
    runs = [(name, kind, workers) for name in ("take", "append") for kind in ("postgres", "redis-set")]
    if scaling:  # one process, then a master and two workers, twice each, interleaved
        runs = [("take", kind, w) for _ in range(2) for kind in ("postgres", "redis-set") for w in (0, 2)]
    with servers("postgres", "redis") as srv:
        urls = {"postgres": srv["postgres"].url, "redis": srv["redis"].url}
        for name, kind, w in runs:
            async with contextlib.AsyncExitStack() as stack:
                url = await prepare(kind, name, urls, stack)
                t0 = time.perf_counter()
                rows.append(await asyncio.to_thread(run_locust, folder, name, kind, url, seconds, w))
                print(f"  locust {name} {kind} ({w or 1} process{'es' if w else ''}): "
                      f"{rows[-1]['ops_per_s']:,.0f} ops/s, {time.perf_counter() - t0:.1f}s", flush=True)
    plot(folder, "locust", f"Locust: {USERS} users, requests/s over time", "unix time", "requests/s",
         {f"{r['locustfile']} {r['store']} x{r['processes']} #{i}": ([t for t, _ in r["history"]],
                                                                     [v for _, v in r["history"]])
          for i, r in enumerate(rows)})
    t = table(["locustfile", "store", "processes", "users", "ops/s", "p50 ms", "p99 ms", "failures", "check"],
              [[r["locustfile"], r["store"], r["processes"], r["users"], r["ops_per_s"], r["p50_ms"], r["p99_ms"],
                r["failures"], json.dumps(r["check"])] for r in rows])
    result: dict[str, Any] = {"benchmark": "load", "machine": machine(), "rows": rows}
    if scaling:
        result["two_processes_over_one"] = {
            kind: ratio(statistics.median(r["ops_per_s"] for r in rows if r["store"] == kind and r["processes"] == 2),
                        statistics.median(r["ops_per_s"] for r in rows if r["store"] == kind and r["processes"] == 1))
            for kind in ("postgres", "redis-set")}
    save_json(folder, "load", result)
    text = (f"# Load with locust\n\nHeadless, {USERS} custom users each, {seconds}s; "
            f"CSVs beside this file (`locust_*_stats.csv`).\n\n{t}\n")
    if scaling:
        text += f"\nTwo worker processes / one process (take ops/s, medians): {result['two_processes_over_one']}\n"
    write_summary(folder, "load", text)
    print(t)
    if scaling:
        print("two processes / one:", result["two_processes_over_one"])
    return result


if __name__ == "__main__":
    p = parser(__doc__ or "")
    p.add_argument("--locust-workers", type=int, default=0,
                   help="run locust distributed: a master and this many worker processes (default: one process)")
    p.add_argument("--scaling", action="store_true",
                   help="take load with one process against a master and two workers, interleaved")
    args = p.parse_args()
    if args.locust_workers < 0:
        p.error(f"--locust-workers must be 0 (one process) or more, got {args.locust_workers}")
    out = report_dir(args.out)
    asyncio.run(main(out, args.quick, args.locust_workers, args.scaling))
    print(f"\nreport: {out}")
