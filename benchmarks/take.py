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
import csv
import io
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from ._common import (
    WORKERS,
    check_exactly_once,
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

VISIBILITY = timedelta(minutes=10)
NAMESPACE = "bench"
PARAM = re.compile(r"%\((\w+)\)s")


# -- rendering our own statements for pgbench -------------------------------------------------


def pgbench_statement(statement: str, rename: dict[str, str] | None = None) -> str:
    """A psycopg statement (``%(name)s`` parameters) as pgbench SQL (``:name`` variables), renamed
    where the variable holds another statement's result. Nothing else in the text changes."""
    rename = rename or {}
    out = PARAM.sub(lambda m: ":" + rename.get(m[1], m[1]), statement.strip())
    return out.replace("%%", "%")


def always_one_row(statement: str) -> str:
    """``statement`` (``WITH ... UPDATE ... RETURNING``, a take of at most one row) reshaped so that
    it always returns exactly one row: the taken row, or ``-`` and a time long past when the take
    found nothing. pgbench aborts a client whose \\gset gets no row, and a SKIP LOCKED take can
    come back empty while rows remain (every one it reached was locked); the next step then
    answers nothing. The final UPDATE becomes one more CTE (Postgres allows a data-modifying CTE
    only at the top level), its text unchanged; the empty transactions are counted and taken out
    of the rate."""
    head, sep, update = statement.rpartition("\nUPDATE workflow_queue AS q")
    assert sep and head.lstrip().startswith("WITH "), statement
    return (f"{head},\ntaken AS ({sep.lstrip()}{update})\nSELECT coalesce(min(workflow), '-') AS workflow,\n"
            f"       coalesce(min(visibility), '2000-01-01T00:00:00Z') AS visibility FROM taken")


def pgbench_script() -> str:
    """One pgbench transaction = one delivery: PostgresScheduler.TAKE (its row kept with \\gset),
    then PostgresScheduler.FINISH with the receipt that take returned."""
    from without_durability_postgres import PostgresScheduler

    take = always_one_row(pgbench_statement(PostgresScheduler.TAKE))
    finish = pgbench_statement(PostgresScheduler.FINISH,
                               {"workflow": "take_workflow", "receipt": "take_visibility"})
    return f"{take}\n\\gset take_\n{finish};\n"


def pgbench_chain_script() -> str:
    """One pgbench transaction = one delivery: PostgresScheduler.FINISH_AND_TAKE answering the
    delivery the client's previous transaction took (kept with \\gset) and taking the next, as
    ``answer_and_take`` does. The first answers nothing (pgbench -D sets a workflow no row has)."""
    from without_durability_postgres import PostgresScheduler

    chain = always_one_row(pgbench_statement(PostgresScheduler.FINISH_AND_TAKE,
                                             {"workflow": "take_workflow", "receipt": "take_visibility"}))
    return f"{chain}\n\\gset take_\n"


# -- Postgres ---------------------------------------------------------------------------------


def workflow_ids(n: int) -> list[str]:
    return [f"wf-{i:08d}" for i in range(n)]


PREFILL = """
INSERT INTO workflow_queue (namespace, workflow, visibility)
SELECT %(namespace)s, 'wf-' || lpad(i::text, 8, '0'),
       now() - interval '1 hour' + i * interval '1 microsecond'
  FROM generate_series(0, %(n)s - 1) AS i
"""


async def drain_steps(step: Callable[[Any], Awaitable[Any]], n: int, workers: int,
                      limit: float = 300.0) -> dict[str, Any]:
    """``workers`` tasks loop ``d = await step(d)`` (``step`` answers the delivery it is given, if
    any, and returns the next) until all ``n`` were taken. A step that finds nothing while some are
    still untaken counts as a spurious empty (a naive FOR UPDATE does that) and is retried."""
    got: list[str] = []
    state = {"empty": 0}
    deadline = time.monotonic() + limit

    async def one() -> None:
        d = None
        while time.monotonic() < deadline:
            d = await step(d)
            if d is None:
                if len(got) >= n:
                    return
                state["empty"] += 1
                await asyncio.sleep(0)
                continue
            got.append(d.workflow)

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(workers)))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "rate": len(got) / seconds, "taken": got, "empty_takes": state["empty"]}


async def drain(take: Callable[[], Awaitable[Any]], answer: Callable[[Any], Awaitable[None]] | None,
                n: int, workers: int) -> dict[str, Any]:
    """``drain_steps`` with two calls per delivery: answer the one in hand (unless ``answer`` is
    None), then take."""

    async def step(prev: Any) -> Any:
        if prev is not None and answer is not None:
            await answer(prev)
        return await take()

    return await drain_steps(step, n, workers)


async def drain_chained(sched: Any, n: int, workers: int) -> dict[str, Any]:
    """``drain_steps`` with one call per delivery: ``answer_and_take`` on the one in hand (a plain
    take when there is none)."""
    return await drain_steps(
        lambda d: sched.take(VISIBILITY) if d is None else sched.answer_and_take(d, None, VISIBILITY),
        n, workers)


async def postgres_ours(url: str, n: int, counts: Sequence[int], naive: bool,
                        chain: bool = False) -> list[dict[str, Any]]:
    from without_durability_postgres import PostgresScheduler
    from without_durability_postgres.kit import fresh_schema

    class NaiveScheduler(PostgresScheduler):
        TAKE = PostgresScheduler.TAKE.replace("FOR UPDATE SKIP LOCKED", "FOR UPDATE")

    assert NaiveScheduler.TAKE != PostgresScheduler.TAKE
    cls = NaiveScheduler if naive else PostgresScheduler
    rows = []
    for w in counts:
        async with fresh_schema(url, min_size=w, max_size=w) as (pool, _):
            async with pool.connection() as conn:
                await conn.execute(PREFILL, {"namespace": NAMESPACE, "n": n})
            sched = cls(pool, namespace=NAMESPACE)
            if chain:
                r = await drain_chained(sched, n, w)
            else:
                r = await drain(lambda s=sched: s.take(VISIBILITY),
                                lambda d, s=sched: s.wake_at(d, None), n, w)
            async with pool.connection() as conn:
                left = (await (await conn.execute("SELECT count(*) FROM workflow_queue")).fetchone() or [0])[0]
        check = check_exactly_once("pg", workflow_ids(n), r.pop("taken"))
        system = "postgres-naive" if naive else "postgres" if chain else "postgres-two-calls"
        rows.append({"system": system, "workers": w, "n": n, **r, **check, "left_in_queue": left})
    return rows


async def postgres_batched(url: str, n: int, counts: Sequence[int], batch: int) -> list[dict[str, Any]]:
    """The batching option: each worker loops take_many(batch) -> finish_many(those)."""
    from without_durability_postgres import PostgresScheduler
    from without_durability_postgres.kit import fresh_schema

    rows = []
    for w in counts:
        async with fresh_schema(url, min_size=w, max_size=w) as (pool, _):
            async with pool.connection() as conn:
                await conn.execute(PREFILL, {"namespace": NAMESPACE, "n": n})
            sched = PostgresScheduler(pool, namespace=NAMESPACE)
            got: list[str] = []

            async def one(s: PostgresScheduler = sched, out: list[str] = got) -> None:
                while ds := await s.take_many(VISIBILITY, batch):
                    out.extend(d.workflow for d in ds)
                    await s.finish_many(ds)

            start = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(w)))
            seconds = time.perf_counter() - start
            async with pool.connection() as conn:
                left = (await (await conn.execute("SELECT count(*) FROM workflow_queue")).fetchone() or [0])[0]
        check = check_exactly_once("pg-batch", workflow_ids(n), got)
        rows.append({"system": f"postgres-batch{batch}", "workers": w, "n": n, "seconds": seconds,
                     "rate": len(got) / seconds, **check, "left_in_queue": left})
    return rows


async def psycopg_raw(url: str, n: int, counts: Sequence[int], chain: bool) -> list[dict[str, Any]]:
    """The same statements through psycopg directly (one autocommit connection per worker, no pool,
    none of this library's code): what the Python driver alone reaches, so the gap to pgbench can
    be split into the driver's share and ours. ``chain``: FINISH_AND_TAKE, else TAKE then FINISH."""
    import psycopg

    from without_durability_postgres import PostgresScheduler
    from without_durability_postgres.kit import fresh_schema

    rows = []
    for w in counts:
        async with fresh_schema(url, min_size=1, max_size=1) as (pool, schema):
            async with pool.connection() as conn:
                await conn.execute(PREFILL, {"namespace": NAMESPACE, "n": n})
            conns = [await psycopg.AsyncConnection.connect(url, autocommit=True,
                                                           options=f"-c search_path={schema}")
                     for _ in range(w)]
            got: list[str] = []

            async def one(c: psycopg.AsyncConnection[Any], out: list[str] = got) -> None:
                params: dict[str, Any] = {"namespace": NAMESPACE, "visibility": VISIBILITY}
                if chain:
                    last = {**params, "workflow": "", "receipt": None}
                    while row := await (await c.execute(PostgresScheduler.FINISH_AND_TAKE, last)).fetchone():
                        out.append(row[0])
                        last = {**params, "workflow": row[0], "receipt": row[1]}
                    return
                while row := await (await c.execute(PostgresScheduler.TAKE, params)).fetchone():
                    out.append(row[0])
                    await c.execute(PostgresScheduler.FINISH,
                                    {"namespace": NAMESPACE, "workflow": row[0], "receipt": row[1]})

            seconds = await timed_on(conns, one)
            async with pool.connection() as conn:
                left = (await (await conn.execute("SELECT count(*) FROM workflow_queue")).fetchone() or [0])[0]
        check = check_exactly_once("raw", workflow_ids(n), got)
        rows.append({"system": "psycopg-raw" if chain else "psycopg-raw-two-statements", "workers": w,
                     "n": n, "seconds": seconds,
                     "rate": len(got) / seconds, **check, "left_in_queue": left})
    return rows


async def pgbench(url: str, n: int, counts: Sequence[int], folder: Path, chain: bool) -> list[dict[str, Any]]:
    """pgbench (prepared statements, -j 2) running ``pgbench_chain_script`` when ``chain``, else
    ``pgbench_script``, ``n / w`` transactions per client."""
    import psycopg

    from without_durability_postgres.kit import fresh_schema

    script = folder / ("pgbench_chain.sql" if chain else "pgbench_take.sql")
    script.write_text(pgbench_chain_script() if chain else pgbench_script())
    m = re.match(r"postgresql://(\w+)@([\d.]+):(\d+)/(\w+)", url)
    assert m, url
    user, host, port, db = m.groups()
    rows = []
    for w in counts:
        async with fresh_schema(url, min_size=1, max_size=2) as (pool, schema):
            async with pool.connection() as conn:
                await conn.execute(PREFILL, {"namespace": NAMESPACE, "n": n})
            per_client = n // w
            env = {**os.environ, "PGOPTIONS": f"-c search_path={schema}"}
            cmd = ["pgbench", "-n", "-M", "prepared", "-h", host, "-p", port, "-U", user,
                   "-c", str(w), "-j", str(min(w, 2)), "-t", str(per_client),
                   "-D", f"namespace={NAMESPACE}", "-D", f"visibility={int(VISIBILITY.total_seconds())} seconds",
                   "-D", "take_workflow=-", "-D", "take_visibility=2000-01-01T00:00:00Z",
                   "-f", str(script), db]
            out = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, env=env,
                                          timeout=600)
            tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out.stdout)
            failed = re.search(r"number of failed transactions: (\d+)", out.stdout)
            async with pool.connection() as conn:
                untaken, hidden = (await (await conn.execute(
                    "SELECT count(*) FILTER (WHERE visibility <= now()), count(*) FILTER (WHERE visibility > now())"
                    " FROM workflow_queue")).fetchone() or (0, 0))
        done = per_client * w
        # Every transaction that found nothing left one prefilled row untaken: the deliveries made
        # are done - untaken, and the rate counts only those. A chain leaves each client's last
        # delivery taken and unanswered (pgbench has no last step), so up to w rows stay hidden.
        taken = done - untaken
        aborted = out.returncode != 0 or "aborted" in out.stdout + out.stderr
        rate = float(tps[1]) * taken / done if tps and not aborted else None
        rows.append({"system": "pgbench" if chain else "pgbench-two-statements", "workers": w, "n": done,
                     "rate": rate, "transactions_per_s": float(tps[1]) if tps else None,
                     "empty_takes": untaken, "failed": int(failed[1]) if failed else None,
                     "left_in_queue": hidden - (w if chain else 0), "returncode": out.returncode,
                     "stderr": out.stderr.strip()[-500:] if aborted else ""})
    del psycopg
    return rows


def acknowledger(done: list[str], stamps: list[float]) -> Callable[[Any], Awaitable[None]]:
    """A PgQueuer entrypoint that only notes the job and when (returning acknowledges it)."""
    from pgqueuer.models import Job

    async def job(j: Job) -> None:
        done.append(str(j.id))
        stamps.append(time.perf_counter())

    return job


async def pgqueuer_runs(url: str, n: int, counts: Sequence[int], batch: int) -> list[dict[str, Any]]:
    """PgQueuer (its QueueManager, drain mode) on its own database: ``w`` managers, each on its own
    connection, dequeue ``batch`` at a time and acknowledge ``n`` jobs."""
    import psycopg
    from pgqueuer import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    base = url.rsplit("/", 1)[0]
    dburl = f"{base}/pgqueuer_bench"
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        exists = await (await admin.execute(
            "SELECT 1 FROM pg_database WHERE datname = 'pgqueuer_bench'")).fetchone()
        if not exists:
            await admin.execute("CREATE DATABASE pgqueuer_bench")
    async with await psycopg.AsyncConnection.connect(dburl, autocommit=True) as conn:
        q = Queries.from_psycopg_connection(conn)
        if not await q.schema_is_installed():
            await q.install()
    rows = []
    for w in counts:
        async with await psycopg.AsyncConnection.connect(dburl, autocommit=True) as conn:
            await conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
            q = Queries.from_psycopg_connection(conn)
            ids: list[int] = []
            for start in range(0, n, 1000):
                k = min(1000, n - start)
                ids += [int(i) for i in await q.enqueue(["bench"] * k, [b"x"] * k, [0] * k)]
        done: list[str] = []
        stamps: list[float] = []
        conns = [await psycopg.AsyncConnection.connect(dburl, autocommit=True) for _ in range(w)]
        try:
            managers = []
            for c in conns:
                qm = QueueManager(Queries.from_psycopg_connection(c))
                qm.entrypoint("bench")(acknowledger(done, stamps))
                managers.append(qm)
            start = time.perf_counter()
            await asyncio.wait_for(asyncio.gather(*(
                qm.run(mode=QueueExecutionMode.drain, batch_size=batch,
                       dequeue_timeout=timedelta(seconds=1), log_aggregation_interval=timedelta(0))
                for qm in managers)), 600)
            seconds = time.perf_counter() - start
        finally:
            for c in conns:
                await c.close()
        async with await psycopg.AsyncConnection.connect(dburl, autocommit=True) as conn:
            left = (await (await conn.execute("SELECT count(*) FROM pgqueuer")).fetchone() or [0])[0]
        check = check_exactly_once("pgq", [str(i) for i in ids], done)
        # A QueueManager spends a few fixed seconds starting and draining (about 5 s here whatever
        # the job count), so the rate is taken over the jobs themselves: first handled to last.
        busy = max(stamps) - min(stamps) if len(stamps) > 1 else seconds
        rows.append({"system": f"pgqueuer-b{batch}", "workers": w, "n": n, "seconds": busy,
                     "wall_seconds_with_start_and_drain": seconds,
                     "rate": (len(done) - 1) / busy, **check, "left_in_queue": left})
    return rows


# -- Redis ------------------------------------------------------------------------------------


REDIS_KINDS = (("redis-set", "set_answer_take"), ("redis-stream", "stream_answer_take"))
"""Each Redis scheduler, and the script its ``answer_and_take`` runs (what the ceilings run too)."""


def redis_scheduler(kind: str, client: Any) -> Any:
    from without_durability_redis import RedisSetScheduler, RedisStreamScheduler

    cls = RedisSetScheduler if kind == "redis-set" else RedisStreamScheduler
    return cls(client, namespace=NAMESPACE)


async def redis_prefill(client: Any, kind: str, n: int) -> tuple[Any, list[str]]:
    """A flushed database and ``n`` workflows scheduled due now, through the scheduler."""
    await client.flushdb()
    sched = redis_scheduler(kind, client)
    ids = workflow_ids(n)
    for i in range(0, n, 50):
        await asyncio.gather(*(sched.schedule(x) for x in ids[i:i + 50]))
    return sched, ids


def redis_script_call(sched: Any, answered: tuple[str, str, str]) -> tuple[list[str], list[Any]]:
    """The keys and arguments of the answer-and-take script answering ``answered`` (workflow and
    receipt parts; ``("-", "0", "0")`` answers nothing) with no next time, as ``answer_and_take``
    sends them."""
    from without_durability_redis._scripts import span

    wf, a, b = answered
    vis = span(VISIBILITY)
    if hasattr(sched, "stream_key"):
        return list(sched._keys), [wf, a, b, "", vis, sched.consumer, sched.wake_batch]
    return [sched.key], [wf, a, "", vis]


async def server_usec_per_call(client: Any) -> float | None:
    """Redis's own time per EVALSHA since the last ``CONFIG RESETSTAT`` (``INFO commandstats``): what
    each call cost the server, so a ceiling that does less per call shows as such."""
    stats = await client.info("commandstats")
    got = stats.get("cmdstat_evalsha", {}).get("usec_per_call")
    return None if got is None else float(got)


async def redis_runs(url: str, n: int, counts: Sequence[int], suffix: str = "") -> list[dict[str, Any]]:
    """Both Redis schedulers through this library: ``answer_and_take`` per delivery (what Worker
    sends; the system's bare name), and take alone (``-take-only``); ``suffix`` after each name
    (``-uvloop`` for the runs on uvloop)."""
    from redis.asyncio import Redis

    rows = []
    client = Redis.from_url(url, max_connections=64)
    try:
        for kind, _ in REDIS_KINDS:
            for w in counts:
                for chained in (True, False):
                    sched, ids = await redis_prefill(client, kind, n)
                    await client.config_resetstat()
                    cpu = time.process_time()
                    if chained:
                        r = await drain_chained(sched, n, w)
                    else:
                        r = await drain(lambda s=sched: s.take(VISIBILITY), None, n, w)
                    cpu = time.process_time() - cpu
                    check = check_exactly_once(kind, ids, r.pop("taken"))
                    rows.append({"system": (kind if chained else f"{kind}-take-only") + suffix, "workers": w,
                                 "n": n, **r, **check, "server_usec_per_call": await server_usec_per_call(client),
                                 "client_cpu_usec_per_call": cpu / n * 1e6})
    finally:
        await client.aclose()
    return rows


async def redis_py_raw(url: str, n: int, counts: Sequence[int]) -> list[dict[str, Any]]:
    """The shipped answer-and-take scripts through redis-py's EVALSHA directly, each call answering
    the delivery the previous one took (none of this library's code): the Python driver's own rate
    (with hiredis when installed), to split the gap to redis-benchmark into the driver's share and ours."""
    import redis.utils
    from redis.asyncio import Redis

    from without_durability_redis import script_source

    rows = []
    client = Redis.from_url(url, max_connections=64)
    try:
        for kind, name in REDIS_KINDS:
            for w in counts:
                sched, ids = await redis_prefill(client, kind, n)
                sha = await client.script_load(script_source(name))
                got: list[str] = []

                async def one(out: list[str] = got, sched: Any = sched, sha: str = sha) -> None:
                    answered = ("-", "0", "0")
                    while True:
                        keys, args = redis_script_call(sched, answered)
                        reply = await client.evalsha(sha, len(keys), *keys, *args)
                        if not reply or reply[0] in (b"", ""):
                            return
                        parts = [p.decode() if isinstance(p, bytes) else str(p) for p in reply]
                        out.append(parts[0])
                        answered = (parts[0], parts[1], parts[2] if len(parts) > 2 else "0")

                await client.config_resetstat()
                start, cpu = time.perf_counter(), time.process_time()
                await asyncio.gather(*(one() for _ in range(w)))
                seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
                check = check_exactly_once("redis-py", ids, got)
                rows.append({"system": f"redis-py-raw-{kind}", "workers": w, "n": n, "seconds": seconds,
                             "rate": len(got) / seconds, "hiredis": redis.utils.HIREDIS_AVAILABLE,
                             **check, "server_usec_per_call": await server_usec_per_call(client),
                             "client_cpu_usec_per_call": cpu / len(got) * 1e6})
    finally:
        await client.aclose()
    return rows


def children_cpu() -> float:
    """CPU seconds (user and system) of this process's finished children: redis-benchmark's own."""
    import resource

    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


async def redis_benchmark(url: str, port: int, n: int, counts: Sequence[int]) -> list[dict[str, Any]]:
    """redis-benchmark sending EVALSHA of the shipped answer-and-take scripts (the same text our
    client loads), each call answering nothing (an unknown workflow: one lookup that finds nothing,
    where ours answers a real delivery) and taking one."""
    from redis.asyncio import Redis

    from without_durability_redis import script_source

    rows = []
    client = Redis.from_url(url)
    try:
        for kind, name in REDIS_KINDS:
            for w in counts:
                sched, _ = await redis_prefill(client, kind, n)
                sha = await client.script_load(script_source(name))
                keys, args = redis_script_call(sched, ("-", "0", "0"))
                cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", str(w), "-n", str(n),
                       "--csv", "EVALSHA", sha, str(len(keys)), *keys, *[str(a) for a in args]]
                await client.config_resetstat()
                cpu = children_cpu()
                out = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=600)
                cpu = children_cpu() - cpu
                rps = None
                for rec in csv.reader(io.StringIO(out.stdout)):
                    if rec and rec[0] != "test":
                        rps = float(rec[1])
                if kind == "redis-set":
                    hidden = await client.zcount(sched.key, f"({time.time() * 1e6:.0f}", "+inf")
                else:
                    hidden = await client.zcard(sched.timers_key)
                rows.append({"system": f"redis-benchmark-{name}", "workers": w, "n": n, "rate": rps,
                             "server_usec_per_call": await server_usec_per_call(client),
                             "client_cpu_usec_per_call": cpu / n * 1e6,
                             "taken_exactly_n": hidden == n, "hidden_after": hidden})
    finally:
        await client.aclose()
    return rows


# -- SQLite -----------------------------------------------------------------------------------


async def sqlite_runs(n: int, counts: Sequence[int]) -> list[dict[str, Any]]:
    from datetime import UTC, datetime

    from without_durability import SqliteDurable

    async def once(w: int, folder: Path) -> dict[str, Any]:
        durable = await SqliteDurable.open(folder / "bench.db", namespace=NAMESPACE)
        try:
            sched = durable.scheduler
            ids = workflow_ids(n)
            past = datetime.now(UTC) - timedelta(hours=1)
            await durable.conn.write(lambda cur: [sched._schedule_in(cur, x, past) for x in ids])
            r = await drain(lambda: sched.take(VISIBILITY), lambda d: sched.wake_at(d, None), n, w)
        finally:
            await durable.close()
        check = check_exactly_once("sqlite", ids, r.pop("taken"))
        return {"system": "sqlite", "workers": w, "n": n, **r, **check}

    rows = []
    for w in counts:
        with tempfile.TemporaryDirectory(prefix="wd-bench-") as tmp:
            rows.append(await once(w, Path(tmp)))
    return rows


# -- the run ----------------------------------------------------------------------------------


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
