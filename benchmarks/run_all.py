"""Every benchmark in one run, into one report folder, with the headline table the README quotes.

    python -m benchmarks.run_all [--quick] [--soak-minutes 10] [--sustain-minutes 30] [--out DIR]

``--only pickup --out reports/bench/<time>`` re-runs one part into an existing report and rebuilds
its summary from the parts' JSON files (each keeps its own time and machine load).

Runs, in order: take throughput, append throughput, take against queue depth (backlog), SQLite
against bare sqlite3, pickup latency, recovery after a SIGKILL, locust load, then the worker
memory soak (last and alone, so its load does not disturb the other figures; ``--soak-minutes 0``
skips it). Writes ``summary.md`` (the headline table, then each benchmark's own summary), the JSON,
PNG and CSV files of each, and prints the headline table. When ``reports/baseline/headline.json``
exists (or ``--baseline DIR``), every ratio is set beside the baseline's and any more than 20%
worse is flagged, in ``summary.md`` and on the terminal.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from . import append, backlog, load, memory_soak, pickup, recovery, sqlite_ceiling, take
from ._common import ROOT, fmt, machine, parser, report_dir, table


def headline(results: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The summary table: each ratio or figure, what it is measured against, and the target."""
    rows: list[dict[str, Any]] = []

    def add(figure: str, value: Any, target: str = "", met: bool | None = None, context: str = "") -> None:
        rows.append({"figure": figure, "value": value, "target": target,
                     "met": "-" if met is None else ("yes" if met else "NO"), "context": context})

    t = results.get("take")
    if t:
        r8 = next((r for r in t["ratios"] if r["workers"] == 8), {})
        rate = {(r["system"], r.get("workers")): r.get("rate") for r in t["rows"] if "rate" in r}
        pg8, bench8 = rate.get(("postgres", 8)), rate.get(("pgbench", 8))
        v = r8.get("pg/pgbench")
        add("Postgres take (answer_and_take, as Worker) / pgbench on the same statement, 8 workers", v,
            ">= 0.7", None if v is None else v >= 0.7, f"{fmt(pg8)} vs {fmt(bench8)} deliveries/s")
        add("psycopg alone (same statement, no library) / pgbench, 8 workers", r8.get("psycopg-raw/pgbench"),
            "", None, "the Python driver's own share of the gap")
        add("Postgres take / psycopg alone, 8 workers", r8.get("pg/psycopg-raw"), "", None,
            "this library's share of the gap")
        add("Postgres take + wake_at (two calls) / pgbench on TAKE; FINISH, 8 workers",
            r8.get("pg-two-calls/pgbench-two-statements"), "", None,
            f"{fmt(rate.get(('postgres-two-calls', 8)))} vs {fmt(rate.get(('pgbench-two-statements', 8)))} /s")
        add("Postgres answer_and_take / two calls, 8 workers", r8.get("pg/pg-two-calls"), "", None,
            "what one statement per delivery buys")
        for b in ("b1", "b10"):
            v = r8.get(f"pg/pgqueuer-{b}")
            add(f"Postgres take (unbatched) / PgQueuer (batch {b[1:]}), 8 workers", v, "> 1",
                None if v is None else v > 1, f"PgQueuer {fmt(rate.get((f'pgqueuer-{b}', 8)))}/s")
        v = r8.get("pg-batch10/pgqueuer-b10")
        add("Postgres batched take (take_many/finish_many 10) / PgQueuer (batch 10), 8 workers", v, "> 1",
            None if v is None else v > 1, f"batched {fmt(rate.get(('postgres-batch10', 8)))}/s")
        add("Postgres take + wake_at / naive FOR UPDATE (no SKIP LOCKED), 8 workers",
            r8.get("pg-two-calls/naive"), "", None, f"naive {fmt(rate.get(('postgres-naive', 8)))}/s")
        add("Postgres batched take_many+finish_many(10) / answer_and_take, 8 workers", r8.get("pg-batch10/pg"),
            "", None, f"batched {fmt(rate.get(('postgres-batch10', 8)))}/s")
        for kind in ("set", "stream"):
            v = r8.get(f"{kind}/redis-benchmark")
            add(f"Redis {kind} answer_and_take / redis-benchmark on the same script, 8 workers", v,
                ">= 0.5", None if v is None else v >= 0.5,
                f"{fmt(rate.get((f'redis-{kind}', 8)))} vs "
                f"{fmt(rate.get((f'redis-benchmark-{kind}_answer_take', 8)))} /s")
            if f"{kind}-uvloop/redis-benchmark" in r8:  # WD_BENCH_UVLOOP=1: beside the default loop's
                v = r8.get(f"{kind}-uvloop/redis-benchmark")
                add(f"Redis {kind} answer_and_take on uvloop / redis-benchmark, 8 workers", v, "", None,
                    f"{fmt(rate.get((f'redis-{kind}-uvloop', 8)))} /s (opt-in loop; the row above is asyncio's)")
            add(f"redis-py alone (same {kind} script, no library) / redis-benchmark, 8 workers",
                r8.get(f"redis-py-raw-{kind}/redis-benchmark"), "", None,
                "the Python driver's own share of the gap (one command per call, no coalescing)")
        add("SQLite take+answer, 8 workers (deliveries/s)", rate.get(("sqlite", 8)))
        lost = sum(int(r.get("lost", 0)) + int(r.get("duplicated", 0)) for r in t["rows"])
        add("Take: deliveries lost or duplicated (every run)", lost, "0", lost == 0)
    a = results.get("append")
    if a:
        for r in a["ratios"]:
            add(f"Postgres append / pgbench APPEND, {r['targets']} workflows", r["postgres/pgbench"],
                ">= 0.7", None if r["postgres/pgbench"] is None else r["postgres/pgbench"] >= 0.7)
            if "psycopg alone/pgbench (the driver's share)" in r:
                add(f"psycopg alone (same APPEND, no library) / pgbench, {r['targets']} workflows",
                    r["psycopg alone/pgbench (the driver's share)"], "", None, "the Python driver's own share of the gap")
            if "on uvloop: postgres/pgbench" in r:  # WD_BENCH_UVLOOP=1: beside the default loop's
                add(f"Postgres append on uvloop / pgbench APPEND, {r['targets']} workflows",
                    r["on uvloop: postgres/pgbench"], "", None,
                    f"psycopg alone on uvloop {fmt(r.get('on uvloop: psycopg alone/pgbench'))} "
                    "(opt-in loop; the row above is asyncio's)")
            if "cores split: postgres/pgbench" in r:  # WD_BENCH_SPLIT_CORES=1
                add(f"Postgres append / pgbench APPEND, server on one CPU and clients on the other, "
                    f"{r['targets']} workflows", r["cores split: postgres/pgbench"], "", None,
                    f"psycopg alone {fmt(r.get('cores split: psycopg alone/pgbench'))}: the clients' CPU no "
                    "longer taken from the server")
            add(f"What each workflow's turn leaves of append (with/without), {r['targets']} workflows",
                r.get("turn cost, ours (with/without)"), "", None, "the price of loads that only grow")
        bad = sum(int(r.get(k, 0) or 0) for r in a["rows"]
                  for k in ("lost", "duplicated_keys", "wrong_value", "unacknowledged_extra"))
        add("Append: lost, duplicated or wrong (every store)", bad, "0", bad == 0)
    b = results.get("backlog")
    if b:
        v = b.get("ratio_largest_to_smallest")
        add(f"Postgres take at {b['flat'][-1]['queued']:,} queued / at {b['flat'][0]['queued']:,}, 8 workers",
            v, ">= 0.8", None if v is None else v >= 0.8,
            ", ".join(f"{r['queued']:,}: {fmt(r['rate'])}/s" for r in b["flat"]))
        s = b.get("sustained")
        if s:
            v = s.get("last_to_first_five_minutes")
            add(f"Sustained take/finish, {fmt(s['minutes'])} min: last five minutes / first five", v, ">= 0.8",
                None if v is None else v >= 0.8,
                f"dead tuples at the end {s['samples'][-1]['dead_tuples'] if s['samples'] else '-'}, "
                f"autovacuum runs {s['samples'][-1]['autovacuum_runs'] if s['samples'] else '-'}")
    sq = results.get("sqlite_ceiling")
    if sq:
        for what in ("take", "append"):
            v = sq.get(f"{what}/bare")
            add(f"SQLite {what} (ours, {sq['workers']} tasks) / the same statements through bare sqlite3", v,
                ">= 0.7", None if v is None else v >= 0.7,
                ", ".join(f"{r['system']} {fmt(r['rate'])}/s" for r in sq["rows"] if what in r["system"]))
    p = results.get("pickup")
    if p:
        for r in p["rows"]:
            if r.get("wakeup") and "p50_ms" in r:
                # The target is restated against the machine's floor in the same run: a bare commit
                # after the same idle gap is what no durable arrive can get under.
                beyond = r.get("p50_beyond_idle_commit_ms")
                ok = None if beyond is None else beyond <= 3
                add(f"Pickup p50 ms, {r['store']} + wakeup, poll {fmt(r['poll_ms'])} ms", r["p50_ms"],
                    "<= floor + 3", ok,
                    f"p99 {fmt(r['p99_ms'])} ms; the arrive call alone {fmt(r.get('arrive_call_p50_ms'))} ms, "
                    f"its commit to the pass {fmt(r.get('after_arrive_p50_ms'))} ms; "
                    + (f"NOTIFY heard at {fmt(r['notify_heard_p50_ms'])} ms; " if "notify_heard_p50_ms" in r else "")
                    + f"the machine's floor, a bare commit after "
                    f"the same idle: {fmt(r.get('idle_commit_p50_ms'))} ms (first round trip "
                    f"{fmt(r.get('idle_first_rt_p50_ms'))} ms)"
                    + (f"; the bare chain (notifying commit, heard, a second commit), the least a woken, "
                       f"fenced pickup costs: {fmt(r['bare_chain_p50_ms'])} ms" if "bare_chain_p50_ms" in r else ""))
        for r in p["rows"]:
            if not r.get("wakeup") and r["store"] == "postgres" and "p50_ms" in r:
                add(f"Pickup p50 ms, postgres polling, poll {fmt(r['poll_ms'])} ms", r["p50_ms"], "", None,
                    f"p99 {fmt(r['p99_ms'])} ms")
    rc = results.get("recovery")
    if rc:
        for r in rc["rows"]:
            if "kill_to_resume_p50_ms" not in r:
                continue
            if r.get("fast_failover"):
                add(f"Recovery kill to resume p50 ms, {r['store']} fast failover, alive {fmt(r['alive_s'])} s",
                    r["kill_to_resume_p50_ms"], "<= 250", r["kill_to_resume_p50_ms"] <= 250,
                    f"p99 {fmt(r['kill_to_resume_p99_ms'])} ms; the lease bound would be {fmt(r['bound_ms'])} ms")
            else:
                add(f"Recovery kill to resume p50 ms, {r['store']}, alive {fmt(r['alive_s'])} s", r["kill_to_resume_p50_ms"],
                    "<= alive + poll", r["kill_to_resume_p50_ms"] <= r["bound_ms"],
                    f"p99 {fmt(r['kill_to_resume_p99_ms'])} ms; bound {fmt(r['bound_ms'])} ms "
                    f"(p50 {fmt(r['p50_to_bound'])} of it)")
        bad = int(rc.get("lost_or_past_fence", 0))
        add("Recovery: workflows lost, run past their fence or duplicated (every store)", bad, "0", bad == 0)
    lo = results.get("load")
    if lo:
        for r in lo["rows"]:
            c = r["check"]
            bad = int(c.get("duplicates", 0)) + sum(int(c.get(k, 0)) for k in ("lost", "wrong", "unacknowledged_extra"))
            add(f"Locust {r['locustfile']} on {r['store']}: ops/s ({r['users']} users)", r["ops_per_s"], "",
                None, f"p99 {r['p99_ms']} ms, failures {r['failures']}, lost/dup {bad}")
    m = results.get("memory_soak")
    if m:
        add(f"Worker RSS change over {fmt(m['minutes'])} min take run", f"{m['change']:+.1%}", "within 10%",
            m["flat_within_10pct"], f"{fmt(m['rss_after_warmup_mb'])} -> {fmt(m['rss_last_minute_mb'])} MiB, "
            f"{m['passes']} passes")
    text = table(["figure", "value", "target", "met", "context"], [list(r.values()) for r in rows])
    return text, rows


BASELINE = ROOT / "reports" / "baseline"
WORSE = 0.8
"""A ratio below this fraction of the baseline's is flagged (more than 20% worse)."""


def against_baseline(rows: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Each ratio of this run (a figure with a "/" in its name) beside the baseline's, flagged when
    it is more than 20% worse. Figures the baseline lacks, or that are not numbers, are left out."""
    then = {r["figure"]: r["value"] for r in baseline}
    out = []
    for r in rows:
        old, new = then.get(r["figure"]), r["value"]
        if "/" not in r["figure"] or not isinstance(old, int | float) or not isinstance(new, int | float) or not old:
            continue
        out.append({"figure": r["figure"], "baseline": old, "now": new, "now/baseline": new / old,
                    "flag": "WORSE" if new < WORSE * old else ""})
    text = table(["figure", "baseline", "now", "now/baseline", "flag"], [list(r.values()) for r in out])
    return text, out


TITLES = {"take": "Take throughput", "append": "Append throughput", "backlog": "Backlog",
          "sqlite_ceiling": "SQLite against bare sqlite3", "pickup": "Pickup latency", "recovery": "Recovery",
          "load": "Load with locust", "memory_soak": "Worker memory soak"}
"""Each part's heading in its own ``<part>.md`` (and, one level down, in ``summary.md``)."""


def kept_sections(summary: Path) -> dict[str, str]:
    """Each part's section of an earlier ``summary.md``, by part name: what an ``--only`` re-run
    keeps of the parts it did not run whose own ``.md`` is not in the folder (a committed baseline
    holds only the JSON and the summary)."""
    if not summary.exists():
        return {}
    text = summary.read_text()
    starts = sorted((i, name) for name, title in TITLES.items() if (i := text.find(f"\n## {title}\n")) >= 0)
    ends = [i for i, _ in starts[1:]] + [len(text)]
    return {name: text[i + 1:end].rstrip() + "\n" for (i, name), end in zip(starts, ends, strict=True)}


async def main(folder: Path, quick: bool, soak_minutes: float, only: set[str] | None = None,
               baseline: Path = BASELINE, sustain_minutes: float | None = None) -> dict[str, Any]:
    results: dict[str, Any] = {"machine_at_start": machine()}
    steps = [("take", lambda: take.main(folder, quick)), ("append", lambda: append.main(folder, quick)),
             ("backlog", lambda: backlog.main(folder, quick, sustain_minutes)),
             ("sqlite_ceiling", lambda: sqlite_ceiling.main(folder, quick)),
             ("pickup", lambda: pickup.main(folder, quick)), ("recovery", lambda: recovery.main(folder, quick)),
             ("load", lambda: load.main(folder, quick))]
    if soak_minutes > 0:
        steps.append(("memory_soak", lambda: memory_soak.main(folder, soak_minutes, 8, 300.0)))
    for name, step in steps:
        if only and name not in only:
            saved = folder / f"{name}.json"
            if saved.exists():  # a part kept from an earlier run into this folder (its own time inside)
                results[name] = json.loads(saved.read_text())
            continue
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        results[name] = await step()
        print(f"== {name} done in {time.perf_counter() - t0:.0f}s\n", flush=True)
    results["machine_at_end"] = machine()
    text, rows = headline(results)
    parts = [f"# Benchmarks, {results['machine_at_start']['when']}\n",
             "Ratios are the figures to read (this machine is shared and noisy); absolute rates are "
             "context.\n", text, "",
             f"Machine at start: {json.dumps(results['machine_at_start'])}  ",
             f"Machine at end: {json.dumps(results['machine_at_end'])}", ""]
    compared: list[dict[str, Any]] = []
    base = baseline / "headline.json"
    if base.exists():
        ctext, compared = against_baseline(rows, json.loads(base.read_text()))
        worse = [c["figure"] for c in compared if c["flag"]]
        parts.insert(3, f"## Against the baseline ({baseline})\n\n{ctext}\n\n"
                     + (f"**{len(worse)} ratio(s) more than 20% worse than the baseline.**\n" if worse
                        else "No ratio more than 20% worse than the baseline.\n"))
    kept = kept_sections(folder / "summary.md")
    for name in TITLES:
        path = folder / f"{name}.md"
        if path.exists():
            parts.append(path.read_text().replace("\n# ", "\n## ", 1).replace("# ", "## ", 1))
        elif name in kept:  # not re-run, and only the earlier summary has its tables
            parts.append(kept[name])
    (folder / "summary.md").write_text("\n".join(parts))
    (folder / "headline.json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
    print(text)
    if base.exists():
        print()
        for c in compared:
            if c["flag"]:
                print(f"WORSE than the baseline: {c['figure']}: {fmt(c['now'])} vs {fmt(c['baseline'])}")
        print(f"{sum(1 for c in compared if c['flag'])} of {len(compared)} ratios more than 20% worse "
              f"than {base}")
    results["against_baseline"] = compared
    return results


if __name__ == "__main__":
    p = parser(__doc__ or "")
    p.add_argument("--soak-minutes", type=float, default=10.0)
    p.add_argument("--sustain-minutes", type=float, default=None,
                   help="length of backlog's sustained take/answer run (default: 30, none with --quick)")
    p.add_argument("--only", help="comma-separated parts to (re)run into --out; the others are read "
                   "from their JSON already there (take, append, backlog, sqlite_ceiling, pickup, recovery, load, memory_soak)")
    p.add_argument("--baseline", default=str(BASELINE),
                   help="folder holding the headline.json to compare with (default: reports/baseline)")
    args = p.parse_args()
    out = report_dir(args.out)
    only = set(args.only.split(",")) if args.only else None
    asyncio.run(main(out, args.quick, 0.5 if args.quick and args.soak_minutes > 0 else args.soak_minutes, only,
                     Path(args.baseline), args.sustain_minutes))
    print(f"\nreport: {out}/summary.md")
