"""Append throughput: concurrent appends spread over 1, 10 and 1,000 workflows, every store, with
pgbench running PostgresCheckpointer's own APPEND statement as the Postgres ceiling; then a check
that nothing was lost (every returned key loads back with its value, keys distinct, none extra).
What the workflow's turn costs (the advisory lock that keeps Postgres commits in seq order): the
same runs with the statement as it was without it (the ``postgres-seq-out-of-commit-order``
mutant's), ours and pgbench, interleaved with the real ones, ``WD_BENCH_ROUNDS`` rounds (medians).
With ``--uvloop`` (or ``WD_BENCH_UVLOOP=1``; the ``uvloop`` extra), ours and psycopg alone also run
on a uvloop event loop (``postgres-uvloop``, ``psycopg-raw-uvloop``), in the same rounds: beside the
default asyncio figures, never instead of them. With ``--split-cores`` (or ``WD_BENCH_SPLIT_CORES=1``;
Linux, two CPUs or more), ours, psycopg alone and pgbench run once more in each round with the
Postgres server (its postmaster and every backend) on the first CPU and the clients on the rest
(``-split`` rows): what the ratio is when a client's CPU is not taken from the server, as where the
database has a host of its own.

    python -m benchmarks.append [--quick] [--out DIR] [--uvloop] [--split-cores]
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, TypeVar

from ._common import (
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
    timed_on,
    uvloop_wanted,
    write_summary,
)
from .take_systems.pgbench import pgbench_statement

CONCURRENCY = 16
TARGETS = (1, 10, 1000)
STORES = ("memory", "sqlite", "postgres", "redis")
UNORDERED = "postgres-without-turn"
"""The Postgres store with its APPEND as it was before the turn: commits out of seq order."""
RAW = "psycopg-raw"
"""PostgresCheckpointer's APPEND through psycopg alone: the Python driver's share of the gap."""
T = TypeVar("T")
UV = "-uvloop"
"""Suffix of the rows run on uvloop (``--uvloop``)."""
SPLIT = "-split"
"""Suffix of the rows run with the server and the clients on CPUs of their own (``--split-cores``)."""


@contextlib.contextmanager
def split_cores(server_pid: int | None) -> Iterator[None]:
    """The server (``server_pid`` and every process under it; backends forked meanwhile inherit
    it) on the first CPU this process may use, and every thread of this process (so the pgbench it
    starts, too) on the others; everything back on all of them afterwards."""
    import psutil

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise RuntimeError(f"--split-cores needs two CPUs or more; this process may use {cpus}")
    if server_pid is None:
        raise RuntimeError("--split-cores needs a server this run started (its process to place)")
    server = psutil.Process(server_pid)

    def place(server_cpus: list[int], client_cpus: list[int]) -> None:
        for proc in (server, *server.children(recursive=True)):
            with contextlib.suppress(psutil.NoSuchProcess):  # a backend that ended meanwhile
                proc.cpu_affinity(server_cpus)
        for tid in os.listdir("/proc/self/task"):  # Linux sets affinity per thread
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(tid), client_cpus)

    place(cpus[:1], cpus[1:])
    try:
        yield
    finally:
        place(cpus, cpus)


@contextlib.asynccontextmanager
async def checkpointer(kind: str, urls: dict[str, str]) -> AsyncIterator[Any]:
    if kind == "memory":
        from without_durability import MemoryCheckpointer

        yield MemoryCheckpointer()
    elif kind == "sqlite":
        from without_durability import SqliteDurable

        with tempfile.TemporaryDirectory(prefix="wd-append-") as tmp:
            async with await SqliteDurable.open(Path(tmp) / "append.db") as durable:
                yield durable.checkpointer
    elif kind in ("postgres", UNORDERED):
        from without_durability_postgres import PostgresCheckpointer
        from without_durability_postgres.kit import fresh_schema

        cls = _unordered() if kind == UNORDERED else PostgresCheckpointer
        async with fresh_schema(urls["postgres"], min_size=CONCURRENCY, max_size=CONCURRENCY) as (pool, _):
            yield cls(pool=pool)
    else:
        from redis.asyncio import Redis

        from without_durability_redis import RedisCheckpointer

        client = Redis.from_url(urls["redis"], max_connections=CONCURRENCY * 2)
        try:
            await client.flushdb()
            yield RedisCheckpointer(client)
        finally:
            await client.aclose()


def _unordered() -> Any:
    from without_durability_postgres.mutants import SeqOutOfCommitOrder

    return SeqOutOfCommitOrder


def shares(plan: list[T]) -> list[list[T]]:
    """``plan`` dealt out to the ``CONCURRENCY`` appenders, a fixed share each, as pgbench ``-t``
    gives each of its clients: the run ends when the slowest finishes, on both sides (a shared
    queue would let ours finish together while pgbench's clients straggle, flattering short runs)."""
    return [plan[i::CONCURRENCY] for i in range(CONCURRENCY)]


async def run_ours(kind: str, k: int, m: int, urls: dict[str, str], seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    plan = [(str(rng.randrange(1, k + 1)), {"n": i}) for i in range(m)]
    got: list[tuple[str, str, object]] = []
    async with checkpointer(kind, urls) as cp:

        async def appender(share: list[tuple[str, dict[str, int]]]) -> None:
            for workflow, value in share:
                got.append((workflow, await cp.append(workflow, value), value))

        start = time.perf_counter()
        await asyncio.gather(*(appender(share) for share in shares(plan)))
        seconds = time.perf_counter() - start
        # The check: every acknowledged append loads back under its key, with its value; keys are
        # distinct; and a workflow holds nothing that was not acknowledged.
        by_wf: dict[str, dict[str, object]] = {}
        for workflow, key, value in got:
            by_wf.setdefault(workflow, {})[key] = value
        lost = wrong = extra = dup = 0
        order_broken = 0
        for workflow, want in by_wf.items():
            loaded = await cp.load(workflow)
            dup += sum(1 for w, _, _ in got if w == workflow) - len(want) if k == 1 else 0
            lost += sum(1 for key in want if key not in loaded)
            wrong += sum(1 for key, v in want.items() if key in loaded and loaded[key] != v)
            extra += sum(1 for key in loaded if key not in want)
            keys = list(loaded)
            order_broken += keys != sorted(keys)
    if k != 1:
        dup = len(got) - sum(len(v) for v in by_wf.values())
    return {"store": kind, "targets": k, "appends": m, "seconds": seconds, "rate": len(got) / seconds,
            "lost": lost, "duplicated_keys": dup, "wrong_value": wrong, "unacknowledged_extra": extra,
            "order_broken_workflows": order_broken}


async def run_raw(url: str, k: int, m: int, seed: int) -> dict[str, Any]:
    """The APPEND statement (with the turn) through psycopg directly: one autocommit connection per
    appender, no pool, values encoded beforehand, none of this library's code. What the Python
    driver alone reaches here, so the gap to pgbench splits into the driver's share and ours."""
    import json

    import psycopg

    from without_durability_postgres import PostgresCheckpointer
    from without_durability_postgres.kit import fresh_schema

    rng = random.Random(seed)
    plan = [(str(rng.randrange(1, k + 1)), json.dumps({"n": i})) for i in range(m)]
    async with fresh_schema(url, min_size=1, max_size=1) as (pool, schema):
        conns = [await psycopg.AsyncConnection.connect(url, autocommit=True, options=f"-c search_path={schema}")
                 for _ in range(CONCURRENCY)]
        acked = 0
        by_conn = dict(zip(conns, shares(plan), strict=True))

        async def one(c: psycopg.AsyncConnection[Any]) -> None:
            nonlocal acked
            for workflow, value in by_conn[c]:
                row = await (await c.execute(PostgresCheckpointer.APPEND, {"workflow": workflow, "value": value})
                             ).fetchone()
                acked += row is not None

        seconds = await timed_on(conns, one)
        async with pool.connection() as conn:
            rows = (await (await conn.execute("SELECT count(*) FROM workflow_checkpoint")).fetchone() or [0])[0]
    return {"store": RAW, "targets": k, "appends": m, "seconds": seconds, "rate": acked / seconds,
            "lost": acked - rows}


async def run_deliver(url: str, mode: str, m: int, seed: int) -> dict[str, Any]:
    """``PostgresDurable.deliver`` (append + schedule, one commit) to 1,000 workflows, with the wakeup
    NOTIFY ``off``; ``ships``: coalesced, as the last statement of only the transaction that claimed
    the one NOTIFY in flight (what ships); or in ``every`` transaction (the naive way: each commit
    then takes the database-wide lock a notifying commit takes)."""
    from without_durability_postgres import PostgresCheckpointer, PostgresDurable, PostgresScheduler
    from without_durability_postgres._boundary import connect
    from without_durability_postgres.kit import fresh_schema
    from without_durability_postgres.wakeup import CHANNEL, NOTIFY

    class NotifyInside(PostgresDurable):
        async def deliver(self, workflow: str, message: object) -> str:
            cp = self.checkpointer
            encoded = cp._encode(workflow, "inbox/", message)
            async with connect(self.pool, "deliver") as conn:
                key = await cp._append_on(conn, workflow, encoded)
                await self.scheduler._schedule_on(conn, workflow)
                await conn.execute(NOTIFY, {"channel": CHANNEL, "namespace": self.scheduler.namespace})
            return key

    rng = random.Random(seed)
    plan = [(f"d-{rng.randrange(1000)}", {"n": i}) for i in range(m)]
    async with fresh_schema(url, min_size=CONCURRENCY + 1, max_size=CONCURRENCY + 2) as (pool, schema):
        sched = PostgresScheduler(pool, namespace=schema, notify=(mode == "ships"))
        cls = NotifyInside if mode == "every" else PostgresDurable
        durable = cls(PostgresCheckpointer(pool=pool), sched)
        queue = iter(plan)
        acked = 0

        async def one() -> None:
            nonlocal acked
            for workflow, value in queue:
                await durable.deliver(workflow, value)
                acked += 1

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(CONCURRENCY)))
        seconds = time.perf_counter() - start
        if sched.notifier is not None:
            await sched.notifier.flush()
        async with pool.connection() as conn:
            rows = (await (await conn.execute("SELECT count(*) FROM workflow_checkpoint")).fetchone() or [0])[0]
    return {"store": f"postgres-deliver-notify-{mode}", "targets": 1000, "appends": m, "seconds": seconds,
            "rate": acked / seconds, "lost": acked - rows,
            "notifies_sent": None if sched.notifier is None else sched.notifier.sent}


async def run_pgbench(url: str, k: int, m: int, folder: Path, *, ordered: bool = True) -> dict[str, Any]:
    from without_durability_postgres import PostgresCheckpointer
    from without_durability_postgres.kit import fresh_schema

    statement = PostgresCheckpointer.APPEND if ordered else _unordered().APPEND
    script = folder / f"pgbench_append{'' if ordered else '_without_turn'}.sql"
    script.write_text(f"\\set k random(1, {k})\n"
                      + pgbench_statement(statement, {"workflow": "k"}) + ";\n")
    match = re.match(r"postgresql://(\w+)@([\d.]+):(\d+)/(\w+)", url)
    assert match, url
    user, host, port, db = match.groups()
    per = m // CONCURRENCY
    async with fresh_schema(url, min_size=1, max_size=2) as (pool, schema):
        env = {**os.environ, "PGOPTIONS": f"-c search_path={schema}"}
        cmd = ["pgbench", "-n", "-M", "prepared", "-h", host, "-p", port, "-U", user, "-c", str(CONCURRENCY),
               "-j", "2", "-t", str(per), "-D", 'value={"n": 1}', "-f", str(script), db]
        out = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, env=env, timeout=600)
        async with pool.connection() as conn:
            rows = (await (await conn.execute("SELECT count(*) FROM workflow_checkpoint")).fetchone() or [0])[0]
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out.stdout)
    return {"store": "pgbench" if ordered else "pgbench-without-turn", "targets": k,
            "appends": per * CONCURRENCY, "rate": float(tps[1]) if tps else None,
            "lost": per * CONCURRENCY - rows, "returncode": out.returncode,
            "stderr": out.stderr.strip()[-400:] if out.returncode else ""}


async def main(folder: Path, quick: bool, uvloop: bool | None = None,
               split: bool | None = None) -> dict[str, Any]:
    m = 800 if quick else 4000
    uvloop = uvloop_wanted(uvloop)
    if split is None:
        split = os.environ.get("WD_BENCH_SPLIT_CORES", "") not in ("", "0")
    rounds = int(os.environ.get("WD_BENCH_ROUNDS", 1 if quick else 3))
    rows: list[dict[str, Any]] = []
    pg: list[dict[str, Any]] = []
    with servers("postgres", "redis") as srv:
        urls = {"postgres": srv["postgres"].url, "redis": srv["redis"].url}
        settings = await postgres_settings(urls["postgres"])
        for kind in STORES:
            if kind == "postgres":
                continue  # below, interleaved with its ceiling
            for k in TARGETS:
                t0 = time.perf_counter()
                try:
                    rows.append(await run_ours(kind, k, m, urls, seed=k))
                except Exception as exc:
                    rows.append({"store": kind, "targets": k, "error": f"{type(exc).__name__}: {exc}"})
                print(f"  {kind} targets={k}: {time.perf_counter() - t0:.1f}s", flush=True)
        # ours and pgbench, with and without the turn, interleaved so a neighbour's burst hits all
        for r in range(rounds):
            for k in TARGETS:
                for kind in ("postgres", UNORDERED):
                    got = await run_ours(kind, k, m, urls, seed=k)
                    pg.append({**got, "round": r})
                    pg.append({**await run_pgbench(urls["postgres"], k, m, folder, ordered=kind == "postgres"),
                               "round": r})
                pg.append({**await run_raw(urls["postgres"], k, m, seed=k), "round": r})
                if uvloop:  # the same two on uvloop, in a thread of their own, in the same round
                    got = await on_uvloop(lambda: run_ours("postgres", k, m, urls, seed=k))  # noqa: B023
                    pg.append({**got, "store": "postgres" + UV, "round": r})
                    got = await on_uvloop(lambda: run_raw(urls["postgres"], k, m, seed=k))  # noqa: B023
                    pg.append({**got, "store": RAW + UV, "round": r})
                if split:  # the server on one CPU, the clients on the other(s)
                    with split_cores(srv["postgres"].pid):
                        got = await run_ours("postgres", k, m, urls, seed=k)
                        pg.append({**got, "store": "postgres" + SPLIT, "round": r})
                        got = await run_raw(urls["postgres"], k, m, seed=k)
                        pg.append({**got, "store": RAW + SPLIT, "round": r})
                        got = await run_pgbench(urls["postgres"], k, m, folder)
                        pg.append({**got, "store": "pgbench" + SPLIT, "round": r})
                print(f"  postgres round {r + 1}/{rounds} targets={k}", flush=True)
        for name in ("postgres", UNORDERED, "pgbench", "pgbench-without-turn", RAW,
                     *(("postgres" + UV, RAW + UV) if uvloop else ()),
                     *(("postgres" + SPLIT, RAW + SPLIT, "pgbench" + SPLIT) if split else ())):
            for k in TARGETS:
                mine = [x for x in pg if x["store"] == name and x["targets"] == k]
                rates = [x["rate"] for x in mine if x.get("rate")]
                rows.append({**mine[-1], "rate": statistics.median(rates) if rates else None,
                             "rounds": len(mine), "round_rates": [x.get("rate") for x in mine],
                             "lost": sum(int(x.get("lost", 0) or 0) for x in mine)})
        for mode in ("off", "ships", "every", "off", "ships", "every"):
            rows.append(await run_deliver(urls["postgres"], mode, m, seed=7))

    def rate(store: str, k: int) -> float | None:
        return next((r.get("rate") for r in rows if r["store"] == store and r["targets"] == k), None)

    ratios = [{"targets": k, "postgres/pgbench": ratio(rate("postgres", k), rate("pgbench", k)),
               "psycopg alone/pgbench (the driver's share)": ratio(rate(RAW, k), rate("pgbench", k)),
               "postgres/psycopg alone (ours)": ratio(rate("postgres", k), rate(RAW, k)),
               "without the turn: postgres/pgbench": ratio(rate(UNORDERED, k), rate("pgbench-without-turn", k)),
               "turn cost, ours (with/without)": ratio(rate("postgres", k), rate(UNORDERED, k)),
               "turn cost, pgbench (with/without)": ratio(rate("pgbench", k), rate("pgbench-without-turn", k)),
               **({"on uvloop: postgres/pgbench": ratio(rate("postgres" + UV, k), rate("pgbench", k)),
                   "on uvloop: psycopg alone/pgbench": ratio(rate(RAW + UV, k), rate("pgbench", k))}
                  if uvloop else {}),
               **({"cores split: postgres/pgbench": ratio(rate("postgres" + SPLIT, k), rate("pgbench" + SPLIT, k)),
                   "cores split: psycopg alone/pgbench": ratio(rate(RAW + SPLIT, k), rate("pgbench" + SPLIT, k))}
                  if split else {})}
              for k in TARGETS]

    def deliver_rate(mode: str) -> float | None:
        got = [r["rate"] for r in rows if r["store"] == f"postgres-deliver-notify-{mode}"]
        return statistics.median(got) if got else None

    deliver = {"off": deliver_rate("off"), "coalesced, in the claiming transaction (ships)": deliver_rate("ships"),
               "in every transaction": deliver_rate("every")}
    notify_ratios = {"ships/off": ratio(deliver["coalesced, in the claiming transaction (ships)"], deliver["off"]),
                     "every/off": ratio(deliver["in every transaction"], deliver["off"])}
    names = [*STORES, "pgbench", RAW, UNORDERED, "pgbench-without-turn",
             *(("postgres" + UV, RAW + UV) if uvloop else ()),
             *(("postgres" + SPLIT, RAW + SPLIT, "pgbench" + SPLIT) if split else ())]
    plot(folder, "append", f"Append throughput ({CONCURRENCY} concurrent appenders)", "workflows appended to",
         "appends/s", {s: (list(TARGETS), [rate(s, k) for k in TARGETS]) for s in names}, logy=True)
    losses = {s: sum(int(r.get("lost", 0) or 0) + int(r.get("duplicated_keys", 0) or 0)
                     + int(r.get("wrong_value", 0) or 0) + int(r.get("unacknowledged_extra", 0) or 0)
                     for r in rows if r["store"] == s) for s in names}
    t = table(["store", *[f"{k} wf" for k in TARGETS], "lost/dup/wrong"],
              [[s, *[rate(s, k) for k in TARGETS], losses[s]] for s in names])
    rt = table(list(ratios[0]), [list(r.values()) for r in ratios])
    dt = table(["deliver with NOTIFY", "deliveries/s (median of 2)"], [[k, v] for k, v in deliver.items()])
    result = {"benchmark": "append", "appends": m, "rounds": rounds, "concurrency": CONCURRENCY,
              "machine": machine(),
              "postgres_settings": settings, "rows": rows, "ratios": ratios, "deliver": deliver,
              "notify_ratios": notify_ratios}
    save_json(folder, "append", result)
    errors = [r for r in rows if "error" in r]
    text = (f"# Append throughput\n\n{m} appends per point by {CONCURRENCY} concurrent appenders, "
            f"appends/s (Postgres and pgbench: median of {rounds} interleaved rounds; "
            f"`-without-turn`: the APPEND statement without the per-workflow lock that keeps commits "
            f"in seq order; `{RAW}`: the APPEND with the turn through psycopg alone, no pool, none of "
            f"our code; `{UV}`: the same on a uvloop event loop; `{SPLIT}`: the server on one CPU and "
            f"the clients on the other(s)).\n\n{t}\n\n## Ratios\n\n{rt}\n\n## What the wakeup NOTIFY costs a writer\n\n"
            f"PostgresDurable.deliver to 1,000 workflows, {CONCURRENCY} concurrent.\n\n{dt}\n\n"
            f"Ratios: {notify_ratios}\n")
    if errors:
        text += "\n## Errors\n\n" + "\n".join(f"- {e['store']} {e['targets']}: {e['error']}" for e in errors)
    write_summary(folder, "append", text)
    print(t)
    print()
    print(rt)
    print()
    print(dt)
    for e in errors:
        print("ERROR", e)
    return result


if __name__ == "__main__":
    p = parser(__doc__ or "")
    p.add_argument("--uvloop", action="store_true", default=None,
                   help="also run ours and psycopg alone on uvloop, beside asyncio (or WD_BENCH_UVLOOP=1)")
    p.add_argument("--split-cores", action="store_true", default=None,
                   help="also run ours, psycopg alone and pgbench with the server on one CPU and the clients "
                   "on the other(s) (or WD_BENCH_SPLIT_CORES=1)")
    args = p.parse_args()
    out = report_dir(args.out)
    asyncio.run(main(out, args.quick, args.uvloop, args.split_cores))
    print(f"\nreport: {out}")
