"""Take throughput: deliveries taken and answered per second against worker count, on a pre-filled
queue, for every scheduler; beside it, in the same run, the ceilings (pgbench running
PostgresScheduler's own statements, redis-benchmark running the shipped answer-and-take scripts),
a naive FOR UPDATE without SKIP LOCKED, and PgQueuer draining the same number of jobs.

    python -m benchmarks.take [--quick] [--out DIR] [--only LABEL] [--workers 1,8] [--uvloop]

A "worker" here is one asyncio task doing the scheduler's part of a Worker, without a workflow
body. On Postgres that is measured two ways, each against pgbench running exactly its statements:
``postgres`` answers each delivery and takes the next in one statement (``answer_and_take``, what
``Worker`` does), against pgbench running FINISH_AND_TAKE; ``postgres-two-calls`` loops take ->
wake_at(None) (the bare ``Scheduler`` calls), against pgbench running TAKE then FINISH. On Redis,
each scheduler's ``answer_and_take`` (bare name) against redis-benchmark sending its script with an
answer that finds nothing (so the ceiling does a little less than ours), and redis-py alone chaining
the same script with real answers, one command per call: the Python driver's own share. Every run
checks that each pre-filled workflow was handed out exactly once (nothing lost, nothing duplicated)
and the queue is empty.

With ``--uvloop`` (or ``WD_BENCH_UVLOOP=1``; the ``uvloop`` extra), the Redis schedulers are also
run on a uvloop event loop (in a thread of their own, the default loop idle meanwhile), as
``redis-set-uvloop`` and ``redis-stream-uvloop``, interleaved with the rest: beside the default
asyncio figures, never instead of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from ._common import (
    WORKERS,
    machine,
    on_uvloop,
    parser,
    plot,
    postgres_settings,
    ratio,
    report_dir,
    save_json,
    servers,
    table,
    uvloop_wanted,
    write_summary,
)
from .take_systems.drain import VISIBILITY
from .take_systems.pgbench import pgbench, pgbench_chain_script, pgbench_script
from .take_systems.pgqueuer_bench import pgqueuer_runs
from .take_systems.postgres import postgres_batched, postgres_ours, psycopg_raw
from .take_systems.redis_bench import REDIS_KINDS, redis_benchmark, redis_py_raw, redis_runs
from .take_systems.sqlite import sqlite_runs


def pick(rows: list[dict[str, Any]], system: str, w: int) -> float | None:
    for r in rows:
        if r["system"] == system and r["workers"] == w:
            return r.get("rate")
    return None


def aggregate(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (system, workers): the median rate of its rounds (all rounds kept in
    ``rates``); loss and duplicate counts summed over every round."""
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for r in raw:
        groups.setdefault((r["system"], r.get("workers")), []).append(r)
    out = []
    for group in groups.values():
        row = dict(group[-1])
        rates = [g["rate"] for g in group if g.get("rate") is not None]
        row["rate"] = statistics.median(rates) if rates else None
        row["rates"] = rates
        row["rounds"] = len(group)
        for k in ("lost", "duplicated", "unexpected", "left_in_queue", "failed"):
            if any(k in g for g in group):
                row[k] = sum(int(g.get(k) or 0) for g in group)
        if any("taken_exactly_n" in g for g in group):
            row["taken_exactly_n"] = all(g.get("taken_exactly_n") for g in group)
        for k in ("server_usec_per_call", "client_cpu_usec_per_call"):
            got = [g[k] for g in group if g.get(k) is not None]
            if got:
                row[k] = statistics.median(got)
        row.pop("round", None)
        out.append(row)
    return out


async def main(folder: Path, quick: bool, counts: Sequence[int] = WORKERS,
               only: str | None = None, uvloop: bool | None = None) -> dict[str, Any]:
    n = 960 if quick else 4800  # divisible by every worker count
    rounds = int(os.environ.get("WD_BENCH_ROUNDS", 1 if quick else 3))
    nr = 5 * n  # Redis drains several times faster: a longer run keeps the timing above the noise
    uvloop = uvloop_wanted(uvloop)
    rows: list[dict[str, Any]] = []
    with servers("postgres", "redis") as srv:
        pg, rd = srv["postgres"], srv["redis"]
        settings = await postgres_settings(pg.url)
        # The pairs the ratios are made of run interleaved, ``rounds`` times, and each figure is the
        # median of its rounds: on a shared machine a neighbour's burst then hits both sides.
        paired: list[tuple[str, Callable[[], Awaitable[list[dict[str, Any]]]]]] = [
            ("postgres (ours, answer_and_take)", lambda: postgres_ours(pg.url, n, counts, naive=False, chain=True)),
            ("pgbench ceiling (FINISH_AND_TAKE)", lambda: pgbench(pg.url, n, counts, folder, chain=True)),
            ("postgres (ours, take + wake_at)", lambda: postgres_ours(pg.url, n, counts, naive=False)),
            ("pgbench ceiling (TAKE; FINISH)", lambda: pgbench(pg.url, n, counts, folder, chain=False)),
            ("psycopg alone (FINISH_AND_TAKE)", lambda: psycopg_raw(pg.url, n, counts, chain=True)),
            ("pgqueuer batch 10", lambda: pgqueuer_runs(pg.url, n, counts, 10)),
            ("redis (ours)", lambda: redis_runs(rd.url, nr, counts)),
            ("redis-benchmark ceiling", lambda: redis_benchmark(rd.url, rd.port, nr, counts)),
            ("redis-py alone (same scripts)", lambda: redis_py_raw(rd.url, nr, counts)),
        ]
        if uvloop:
            paired.append(("redis (ours, uvloop)",
                           lambda: on_uvloop(lambda: redis_runs(rd.url, nr, counts, suffix="-uvloop"))))
        once: list[tuple[str, Callable[[], Awaitable[list[dict[str, Any]]]]]] = [
            ("psycopg alone (TAKE; FINISH)", lambda: psycopg_raw(pg.url, n, counts, chain=False)),
            ("postgres naive FOR UPDATE", lambda: postgres_ours(pg.url, n, counts, naive=True)),
            ("postgres batched (take_many/finish_many, 10)", lambda: postgres_batched(pg.url, n, counts, 10)),
            ("pgqueuer batch 1", lambda: pgqueuer_runs(pg.url, n, counts, 1)),
            ("sqlite (ours)", lambda: sqlite_runs(n, counts)),
        ]
        if only:  # a development run of some comparisons (their labels contain ``only``)
            paired = [p for p in paired if only in p[0]]
            once = [p for p in once if only in p[0]]
        schedule = [(r, label, step) for r in range(rounds) for label, step in paired]
        schedule += [(0, label, step) for label, step in once]
        for r, label, step in schedule:
            t0 = time.perf_counter()
            try:
                got = await step()
            except Exception as exc:  # one broken comparison must not hide the rest
                got = [{"system": label, "error": f"{type(exc).__name__}: {exc}"}]
            rows += [{**g, "round": r} for g in got]
            print(f"  {label} (round {r + 1}): {time.perf_counter() - t0:.1f}s", flush=True)
    raw = rows
    rows = aggregate(raw)
    ratios = []
    for w in counts:
        ratios.append({
            "workers": w,
            "pg/pgbench": ratio(pick(rows, "postgres", w), pick(rows, "pgbench", w)),
            "pg-two-calls/pgbench-two-statements": ratio(pick(rows, "postgres-two-calls", w),
                                                         pick(rows, "pgbench-two-statements", w)),
            "psycopg-raw/pgbench": ratio(pick(rows, "psycopg-raw", w), pick(rows, "pgbench", w)),
            "pg/psycopg-raw": ratio(pick(rows, "postgres", w), pick(rows, "psycopg-raw", w)),
            "pg/pg-two-calls": ratio(pick(rows, "postgres", w), pick(rows, "postgres-two-calls", w)),
            "pg/pgqueuer-b1": ratio(pick(rows, "postgres", w), pick(rows, "pgqueuer-b1", w)),
            "pg/pgqueuer-b10": ratio(pick(rows, "postgres", w), pick(rows, "pgqueuer-b10", w)),
            "pg-two-calls/naive": ratio(pick(rows, "postgres-two-calls", w), pick(rows, "postgres-naive", w)),
            "pg-batch10/pg": ratio(pick(rows, "postgres-batch10", w), pick(rows, "postgres", w)),
            "pg-batch10/pgqueuer-b10": ratio(pick(rows, "postgres-batch10", w), pick(rows, "pgqueuer-b10", w)),
            **{f"{kind.removeprefix('redis-')}/redis-benchmark": ratio(
                pick(rows, kind, w), pick(rows, f"redis-benchmark-{name}", w)) for kind, name in REDIS_KINDS},
            **({f"{kind.removeprefix('redis-')}-uvloop/redis-benchmark": ratio(
                pick(rows, f"{kind}-uvloop", w), pick(rows, f"redis-benchmark-{name}", w))
                for kind, name in REDIS_KINDS} if uvloop else {}),
            **{f"redis-py-raw-{kind.removeprefix('redis-')}/redis-benchmark": ratio(
                pick(rows, f"redis-py-raw-{kind}", w), pick(rows, f"redis-benchmark-{name}", w))
               for kind, name in REDIS_KINDS},
        })
    result = {"benchmark": "take", "n": n, "n_redis": nr, "rounds": rounds, "raw": raw, "uvloop": uvloop,
              "visibility_s": VISIBILITY.total_seconds(),
              "machine": machine(), "postgres_settings": settings, "rows": rows, "ratios": ratios,
              "pgbench_script": pgbench_script(), "pgbench_chain_script": pgbench_chain_script()}
    save_json(folder, "take", result)
    systems = sorted({r["system"] for r in rows if "error" not in r})
    plot(folder, "take", "Take throughput (take + answer per second)", "workers", "deliveries/s",
         {s: (list(counts), [pick(rows, s, w) for w in counts]) for s in systems}, logx=True, logy=True)
    rate_table = table(["system", *[f"w={w}" for w in counts], "lost", "dup"],
                       [[s, *[pick(rows, s, w) for w in counts],
                         sum(r.get("lost", 0) for r in rows if r["system"] == s),
                         sum(r.get("duplicated", 0) for r in rows if r["system"] == s)] for s in systems])
    ratio_table = table(list(ratios[0]), [list(r.values()) for r in ratios])
    server_rows = [[r["system"], r["workers"], r["server_usec_per_call"], r.get("client_cpu_usec_per_call")]
                   for r in rows if "server_usec_per_call" in r]
    server_table = table(["system", "workers", "Redis server us per EVALSHA (median)",
                          "client CPU us per call (median)"], server_rows)
    errors = [r for r in rows if "error" in r]
    text = (f"# Take throughput\n\n{n} pre-filled deliveries per point ({nr} on Redis); the paired systems (ours and "
            f"pgbench both ways, psycopg alone, PgQueuer batch 10, Redis and redis-benchmark) are the "
            f"median of {rounds} interleaved rounds; deliveries/s (taken and answered; `-take-only` "
            f"and redis-benchmark rows: takes/s).\n\n"
            f"- `postgres`: one `answer_and_take` per delivery (what `Worker` sends); `pgbench`: the "
            f"same FINISH_AND_TAKE statement.\n"
            f"- `postgres-two-calls`: `take` then `wake_at(None)` (the bare Scheduler calls); "
            f"`pgbench-two-statements`: the same TAKE then FINISH.\n"
            f"- `psycopg-raw*`: those statements through psycopg alone (no pool, none of our code).\n\n"
            f"{rate_table}\n\n"
            f"## Ratios\n\n{ratio_table}\n\n"
            + (f"## What each call costs Redis and the client\n\nINFO commandstats after each run: redis-benchmark "
               f"answers nothing, so its calls cost the server less than ours. Client CPU: this process's "
               f"(user + system) for ours and redis-py alone, redis-benchmark's own for it; on a machine "
               f"whose cores are all busy, server plus client CPU per call is what sets each side's rate."
               f"\n\n{server_table}\n\n" if server_rows else "")
            + f"Postgres settings: {settings}\n\n"
            f"Machine: {result['machine']}\n")
    if errors:
        text += "\n## Errors\n\n" + "\n".join(f"- {e['system']}: {e['error']}" for e in errors) + "\n"
    write_summary(folder, "take", text)
    print(rate_table)
    print()
    print(ratio_table)
    if server_rows:
        print()
        print(server_table)
    for e in errors:
        print("ERROR", e["system"], e["error"])
    return result


if __name__ == "__main__":
    p = parser(__doc__ or "")
    p.add_argument("--only", help="run only the comparisons whose label contains this (e.g. redis)")
    p.add_argument("--workers", help="worker counts, comma-separated (default: 1,2,4,8,16)")
    p.add_argument("--uvloop", action="store_true", default=None,
                   help="also run the Redis schedulers on uvloop, beside asyncio (or WD_BENCH_UVLOOP=1)")
    args = p.parse_args()
    out = report_dir(args.out)
    chosen = tuple(int(x) for x in args.workers.split(",")) if args.workers else WORKERS
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(out, args.quick, chosen, args.only, args.uvloop))
    print(f"\nreport: {out}")
