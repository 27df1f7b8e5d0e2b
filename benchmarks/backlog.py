"""Take throughput against the depth of the queue, and over a sustained run: does a Postgres queue
stay flat with a million deliveries waiting, and after a long while of takes and answers?

    python -m benchmarks.backlog [--quick] [--out DIR] [--sustain-minutes M]

Flat: one schema per depth (1k, 100k and 1M deliveries queued; quick: 1k and 100k), each
pre-filled with every delivery due. 8 workers then chain ``answer_and_take`` for a fixed number of
deliveries, each answer putting its workflow back as due now, so the depth stays exactly what it
was and every point runs the same statements (an UPDATE of the indexed visibility, as a sleep
answer makes). The depths are measured in interleaved rounds, each figure the median of its rounds.

Sustained (full run only, 30 minutes unless ``--sustain-minutes`` says otherwise): 8 workers
take and finish (a DELETE, as a finished workflow makes) while a producer keeps the queue at a
steady depth, recording throughput, the table's dead tuples and autovacuum runs every interval.

Writes ``backlog.json``: ``"flat": [{"queued": n, "rate": r}, ...]``,
``"ratio_largest_to_smallest"``, and, after a sustained run, ``"sustained"`` with its samples and
``"last_to_first_five_minutes"``. Every delivery handed out is checked against double handling.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ._common import (
    machine,
    parser,
    plot,
    postgres_settings,
    ratio,
    report_dir,
    save_json,
    servers,
    table,
    write_summary,
)

WORKERS = 8
VISIBILITY = timedelta(minutes=10)
NAMESPACE = "backlog"
PREFILL = """
INSERT INTO workflow_queue (namespace, workflow, visibility)
SELECT %(namespace)s, 'wf-' || lpad(i::text, 8, '0'),
       now() - interval '1 hour' + i * interval '1 microsecond'
  FROM generate_series(%(start)s, %(stop)s - 1) AS i
"""
TABLE_STATS = """
SELECT n_live_tup, n_dead_tup, autovacuum_count, vacuum_count, pg_total_relation_size(relid)
  FROM pg_stat_user_tables WHERE schemaname = %(schema)s AND relname = 'workflow_queue'
"""


async def prefill(pool: Any, n: int) -> None:
    """``n`` due deliveries, inserted in slices so a million does not make one huge transaction,
    then settled as a queue that has stood a while would be: vacuumed (hint bits and visibility
    map set, as autovacuum leaves them) and checkpointed (the bulk load's dirty pages written), so
    the figure is the queue's depth and not the cost of having just loaded it."""
    async with pool.connection() as conn:
        for start in range(0, n, 200_000):
            await conn.execute(PREFILL, {"namespace": NAMESPACE, "start": start, "stop": min(n, start + 200_000)})
    async with pool.connection() as conn:
        await conn.set_autocommit(True)
        await conn.execute("VACUUM (ANALYZE) workflow_queue")
        await conn.execute("CHECKPOINT")
        await conn.set_autocommit(False)


async def chain_round(sched: Any, deliveries: int, workers: int) -> dict[str, Any]:
    """``workers`` tasks chain ``answer_and_take``, each answer putting the workflow back as due
    now, until ``deliveries`` were handed out. A workflow is never held by two workers at once."""
    held: set[str] = set()
    state = {"got": 0, "double": 0, "empty": 0}

    async def one() -> None:
        d = None
        while state["got"] < deliveries:
            if d is None:
                d = await sched.take(VISIBILITY)
            else:
                held.discard(d.workflow)
                d = await sched.answer_and_take(d, datetime.now(UTC), VISIBILITY)
            if d is None:
                state["empty"] += 1
                await asyncio.sleep(0.001)
                continue
            if d.workflow in held:
                state["double"] += 1
            held.add(d.workflow)
            state["got"] += 1
        if d is not None:  # put the last one back, so the depth stays what it was
            held.discard(d.workflow)
            await sched.wake_at(d, datetime.now(UTC))

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(workers)))
    seconds = time.perf_counter() - start
    return {"rate": state["got"] / seconds, "seconds": seconds, "handed_out": state["got"],
            "held_twice": state["double"], "empty_takes": state["empty"]}


async def flat(url: str, depths: Sequence[int], deliveries: int, rounds: int) -> list[dict[str, Any]]:
    from without_durability_postgres import PostgresScheduler
    from without_durability_postgres.kit import fresh_schema

    async with contextlib.AsyncExitStack() as stack:
        scheds: dict[int, tuple[Any, Any, str]] = {}
        for n in depths:
            t0 = time.perf_counter()
            pool, schema = await stack.enter_async_context(fresh_schema(url, min_size=WORKERS, max_size=WORKERS))
            await prefill(pool, n)
            scheds[n] = (PostgresScheduler(pool, namespace=NAMESPACE), pool, schema)
            print(f"  prefilled {n:,} in {time.perf_counter() - t0:.1f}s", flush=True)
        raw: dict[int, list[dict[str, Any]]] = {n: [] for n in depths}
        for r in range(rounds):
            for n in depths:
                sched, pool, _ = scheds[n]
                got = await chain_round(sched, deliveries, WORKERS)
                async with pool.connection() as conn:
                    row = await (await conn.execute("SELECT count(*) FROM workflow_queue")).fetchone()
                got["queued_after"] = row[0] if row else None
                raw[n].append(got)
                print(f"  {n:>9,} queued, round {r + 1}: {got['rate']:,.0f}/s", flush=True)
    out = []
    for n in depths:
        rates = [g["rate"] for g in raw[n]]
        out.append({"queued": n, "rate": statistics.median(rates), "rates": rates,
                    "held_twice": sum(g["held_twice"] for g in raw[n]),
                    "queued_after": [g["queued_after"] for g in raw[n]]})
    return out


async def sustained(url: str, minutes: float, depth: int, interval: float) -> dict[str, Any]:
    """Take and finish for ``minutes`` while a producer keeps ``depth`` deliveries queued; a sample
    of throughput, dead tuples and autovacuum runs every ``interval`` seconds."""
    from without_durability_postgres import PostgresScheduler
    from without_durability_postgres.kit import fresh_schema

    async with fresh_schema(url, min_size=WORKERS + 2, max_size=WORKERS + 2) as (pool, schema):
        await prefill(pool, depth)
        sched = PostgresScheduler(pool, namespace=NAMESPACE)
        stop = time.monotonic() + minutes * 60
        done = {"n": 0, "seq": depth}
        seen: set[str] = set()
        dup = {"n": 0}

        async def worker() -> None:
            d = await sched.take(VISIBILITY)
            while time.monotonic() < stop:
                if d is None:
                    await asyncio.sleep(0.01)
                    d = await sched.take(VISIBILITY)
                    continue
                if d.workflow in seen:
                    dup["n"] += 1
                seen.add(d.workflow)
                done["n"] += 1
                d = await sched.answer_and_take(d, None, VISIBILITY)
            if d is not None:
                await sched.wake_at(d, None)

        async def producer() -> None:
            # A new workflow for each one finished, in batches, so the depth holds.
            while time.monotonic() < stop:
                want = done["n"] + depth - done["seq"]
                if want > 0:
                    first, done["seq"] = done["seq"], done["seq"] + want
                    async with pool.connection() as conn:
                        await conn.execute(PREFILL, {"namespace": NAMESPACE, "start": first, "stop": first + want})
                await asyncio.sleep(0.2)

        samples: list[dict[str, Any]] = []

        async def sampler() -> None:
            t0, last = time.monotonic(), 0
            previous = t0
            while time.monotonic() < stop:
                await asyncio.sleep(min(interval, max(0.0, stop - time.monotonic())))
                at = time.monotonic()
                elapsed, previous = at - previous, at
                async with pool.connection() as conn:
                    row = await (await conn.execute(TABLE_STATS, {"schema": schema})).fetchone()
                live, dead, autovac, vac, size = row or (None,) * 5
                n = done["n"]
                samples.append({"t": round(at - t0, 1), "rate": (n - last) / elapsed,
                                "live_tuples": live, "dead_tuples": dead, "autovacuum_runs": autovac,
                                "vacuum_runs": vac, "table_bytes": size})
                last = n
                print(f"  sustained t={samples[-1]['t']:>6}s rate={samples[-1]['rate']:,.0f}/s dead={dead} "
                      f"autovacuums={autovac}", flush=True)

        await asyncio.gather(*(worker() for _ in range(WORKERS)), producer(), sampler())
    window = max(1, round(300 / interval))  # five minutes of samples (all of them in a short run)
    first = [s["rate"] for s in samples[:window]]
    last = [s["rate"] for s in samples[-window:]]
    return {"minutes": minutes, "depth": depth, "interval_s": interval, "samples": samples,
            "handed_out": done["n"], "handed_out_twice": dup["n"],
            "last_to_first_five_minutes": ratio(statistics.mean(last) if last else None,
                                                statistics.mean(first) if first else None)}


async def main(folder: Path, quick: bool, sustain_minutes: float | None = None) -> dict[str, Any]:
    depths = (1_000, 100_000) if quick else (1_000, 100_000, 1_000_000)
    deliveries = 960 if quick else 4800
    rounds = 3
    minutes = (0.0 if quick else 30.0) if sustain_minutes is None else sustain_minutes
    with servers("postgres") as srv:
        url = srv["postgres"].url
        settings = await postgres_settings(url)
        rows = await flat(url, depths, deliveries, rounds)
        result: dict[str, Any] = {
            "benchmark": "backlog", "workers": WORKERS, "deliveries_per_round": deliveries, "rounds": rounds,
            "flat": [{"queued": r["queued"], "rate": r["rate"]} for r in rows], "flat_detail": rows,
            "ratio_largest_to_smallest": ratio(rows[-1]["rate"], rows[0]["rate"]),
            "machine": machine(), "postgres_settings": settings,
        }
        if minutes > 0:
            result["sustained"] = await sustained(url, minutes, 10_000, 30.0 if minutes >= 5 else 5.0)
    save_json(folder, "backlog", result)
    flat_table = table(["queued", "deliveries/s (median)", "rounds", "held twice"],
                       [[r["queued"], r["rate"], ", ".join(f"{x:,.0f}" for x in r["rates"]), r["held_twice"]]
                        for r in rows])
    text = (f"# Backlog\n\n{WORKERS} workers chaining answer_and_take, {deliveries} deliveries per round, "
            f"{rounds} interleaved rounds; each answer puts the workflow back as due now, so the depth holds.\n\n"
            f"{flat_table}\n\nLargest / smallest: {result['ratio_largest_to_smallest']:.2f}\n")
    plot(folder, "backlog", "Take throughput against queue depth", "queued", "deliveries/s",
         {"postgres answer_and_take": ([r["queued"] for r in rows], [r["rate"] for r in rows])}, logx=True)
    if "sustained" in result:
        s = result["sustained"]
        text += (f"\n## Sustained\n\n{s['minutes']} minutes, depth {s['depth']}: last/first five minutes "
                 f"{s['last_to_first_five_minutes']}; handed out {s['handed_out']}, twice "
                 f"{s['handed_out_twice']}.\n\n"
                 + table(["t (s)", "deliveries/s", "dead tuples", "autovacuum runs"],
                         [[x["t"], x["rate"], x["dead_tuples"], x["autovacuum_runs"]] for x in s["samples"]]))
        plot(folder, "backlog_sustained", "Sustained take/finish", "seconds", "deliveries/s",
             {"rate": ([x["t"] for x in s["samples"]], [x["rate"] for x in s["samples"]])})
    text += f"\n\nPostgres settings: {settings}\n\nMachine: {result['machine']}\n"
    write_summary(folder, "backlog", text)
    print(flat_table)
    print(f"\nlargest / smallest: {result['ratio_largest_to_smallest']:.2f}")
    return result


if __name__ == "__main__":
    p = parser(__doc__ or "")
    p.add_argument("--sustain-minutes", type=float, default=None,
                   help="length of the sustained run (default: 30, none with --quick)")
    args = p.parse_args()
    out = report_dir(args.out)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(out, args.quick, args.sustain_minutes))
    print(f"\nreport: {out}")
