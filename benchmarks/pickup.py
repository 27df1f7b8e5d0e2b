"""Pickup latency: from the ``arrive`` call to the workflow's pass starting, p50/p99, against the
poll interval, with and without a wakeup path.

    python -m benchmarks.pickup [--quick] [--out DIR] [--only STORE ...] [--poll 0.01,0.05,0.25]
        [--samples N] [--postgres-url URL] [--redis-url URL]

``--poll`` takes the poll intervals in seconds (default 0.01,0.1,1); ``--postgres-url`` and
``--redis-url`` measure your own servers instead of private ones started here. Each row's p50,
p90 and p99 go to ``pickup.json`` and ``pickup.csv`` in the report folder.

One real ``Worker`` idles on an empty queue; a producer arrives one workflow at a time at a random
moment (uniform over one poll interval, so arrivals land at every phase of the poll cycle), waits
for its pass to start, and records the gap. The clock starts before ``arrive`` is called, so the
arrive's own commit is included. Wakeup paths: Postgres LISTEN/NOTIFY (``PostgresScheduler(
notify=True)`` + ``PostgresWakeup``), and the Redis stream scheduler's blocking read (its ``wait``).
The sorted-set and SQLite schedulers have none and are shown polling.

The platform's share is measured in the same run: before each arrival, each after an idle gap
drawn from the same distribution and with the same Worker polling, on a connection of its own that
does nothing else, one bare round trip (``SELECT 1`` for Postgres, ``PING`` for Redis) then a second
straight after ("idle first RT", "warm RT"), and one bare committed write (a one-row ``INSERT``;
``INCR``) ("idle commit"). On a machine whose idle CPUs sleep deeply (a VM's haltpoll, power-saving
C-states) the first round trip after idle costs far more than the next, whoever makes it; and an
arrive must commit durably before a worker can see it, so the idle commit is a floor no library
gets under. Both are reported beside the pickup figures. For Postgres with the wakeup, a third
probe, the bare chain: a one-row write that notifies, committed; a listening connection hears it; a
one-row write committed on a third connection. That is what any woken pickup whose claim is durable
before the pass begins goes through, with plain psycopg and trivial statements: what is left of the
pickup beyond it is this library's (its statements, its pool, its Worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from ._common import (
    fmt,
    machine,
    parser,
    plot,
    postgres_settings,
    report_dir,
    save_json,
    servers,
    table,
    write_summary,
)

POLLS = (timedelta(milliseconds=10), timedelta(milliseconds=100), timedelta(seconds=1))
LONG = timedelta(hours=1)


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


@contextlib.asynccontextmanager
async def store(kind: str, wakeup: bool, urls: dict[str, str]) -> AsyncIterator[tuple[Any, Any]]:
    """(durable, wakeup or None) for one configuration."""
    if kind == "postgres":
        from without_durability_postgres import (
            PostgresCheckpointer,
            PostgresDurable,
            PostgresScheduler,
            PostgresWakeup,
        )
        from without_durability_postgres.kit import fresh_schema

        async with fresh_schema(urls["postgres"], min_size=3, max_size=6) as (pool, schema):
            sched = PostgresScheduler(pool, namespace=schema, notify=wakeup)
            durable = PostgresDurable(PostgresCheckpointer(pool=pool), sched)
            if not wakeup:
                yield durable, None
                return
            async with PostgresWakeup(pool, namespace=schema) as listener:
                yield durable, listener
    elif kind.startswith("redis"):
        import uuid

        from redis.asyncio import Redis

        from without_durability import SplitDurable
        from without_durability_redis import RedisCheckpointer, RedisSetScheduler, RedisStreamScheduler
        from without_durability_redis.kit import delete_prefix

        client = Redis.from_url(urls["redis"])
        # keys of this measurement's own, removed after: a Redis given with --redis-url keeps the rest
        prefix = f"wd-pickup-{uuid.uuid4().hex[:12]}:"
        try:
            cls = RedisStreamScheduler if kind == "redis-stream" else RedisSetScheduler
            sched: Any = cls(client, prefix=prefix)
            yield SplitDurable(RedisCheckpointer(client, prefix=prefix), sched), (sched if wakeup else None)
        finally:
            try:
                await delete_prefix(client, prefix)
            finally:
                await client.aclose()
    else:
        from without_durability import SqliteDurable

        with tempfile.TemporaryDirectory(prefix="wd-pickup-") as tmp:
            async with await SqliteDurable.open(Path(tmp) / "pickup.db") as durable:
                yield durable, None


class Probe:
    """Bare requests on a connection used for nothing else: what the platform charges any client."""

    def __init__(self, request: Callable[[], Awaitable[object]], write: Callable[[], Awaitable[object]],
                 chain: Callable[[], Awaitable[object]] | None = None) -> None:
        self.request = request  # the cheapest round trip: SELECT 1 / PING
        self.write = write  # the cheapest durable write: a one-row INSERT committed / INCR
        self.chain = chain  # Postgres: the least a fenced pickup with a wakeup costs (see prober)

    async def round_trips(self) -> tuple[float, float]:
        """Seconds for one bare round trip, then for a second one straight after it."""
        t0 = time.perf_counter()
        await self.request()
        t1 = time.perf_counter()
        await self.request()
        return t1 - t0, time.perf_counter() - t1

    async def commit(self) -> float:
        """Seconds for one bare write, committed as the server is configured to commit."""
        t0 = time.perf_counter()
        await self.write()
        return time.perf_counter() - t0

    async def chained(self) -> float | None:
        """Seconds for the bare chain, or None where there is none."""
        if self.chain is None:
            return None
        t0 = time.perf_counter()
        await self.chain()
        return time.perf_counter() - t0


@contextlib.asynccontextmanager
async def prober(kind: str, urls: dict[str, str]) -> AsyncIterator[Probe | None]:
    """A ``Probe`` on a connection of its own, or None for SQLite (no server to reach)."""
    if kind == "postgres":
        import uuid

        import psycopg
        from psycopg import sql

        conn = await psycopg.AsyncConnection.connect(urls["postgres"], autocommit=True)
        table = sql.Identifier(f"wd_pickup_probe_{uuid.uuid4().hex[:12]}")
        await conn.execute(sql.SQL("CREATE TABLE {} (n int)").format(table))
        insert = sql.SQL("INSERT INTO {} VALUES (1)").format(table)
        # The bare chain: what any pickup that is woken and fenced must pass through, with none of
        # this library's code or statements. A one-row write that notifies, committed (the arrive);
        # a LISTENing connection hears it (the wakeup); a one-row write committed on a third
        # connection (the claim, which must be durable before a pass begins).
        channel = f"wd_pickup_chain_{uuid.uuid4().hex[:12]}"
        notifying = sql.SQL("INSERT INTO {} SELECT 1 FROM (SELECT pg_notify({}, '')) AS n").format(
            table, sql.Literal(channel))
        ear = await psycopg.AsyncConnection.connect(urls["postgres"], autocommit=True)
        claimer = await psycopg.AsyncConnection.connect(urls["postgres"], autocommit=True)
        await ear.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        heard = asyncio.Event()

        async def hear() -> None:
            async for _ in ear.notifies():
                heard.set()

        async def chain() -> None:
            heard.clear()
            await conn.execute(notifying)
            await asyncio.wait_for(heard.wait(), 30)
            await claimer.execute(insert)

        hearing = asyncio.create_task(hear())
        try:
            yield Probe(lambda: conn.execute("SELECT 1"), lambda: conn.execute(insert), chain)
        finally:
            hearing.cancel()
            await asyncio.gather(hearing, return_exceptions=True)
            await conn.execute(sql.SQL("DROP TABLE {}").format(table))
            for c in (conn, ear, claimer):
                await c.close()
    elif kind.startswith("redis"):
        import uuid

        from redis.asyncio import Redis

        client = Redis.from_url(urls["redis"], single_connection_client=True)
        await client.ping()
        key = f"wd-pickup-probe-{uuid.uuid4().hex[:12]}"
        try:
            yield Probe(client.ping, lambda: client.incr(key))
        finally:
            await client.delete(key)
            await client.aclose()
    else:
        yield None


async def measure(kind: str, wakeup: bool, poll: timedelta, samples: int, urls: dict[str, str],
                  rng: random.Random) -> dict[str, Any]:
    from without_durability import Run, Worker

    started: dict[str, float] = {}
    seen = asyncio.Condition()

    async def body(run: Run[Any]) -> object:
        async with seen:
            started.setdefault(run.workflow, time.perf_counter())
            seen.notify_all()
        return None

    gaps: list[float] = []
    commits: list[float] = []  # the arrive call alone (its commit), part of every gap
    first_rts: list[float] = []  # a bare round trip after an idle gap: the platform's floor
    warm_rts: list[float] = []  # the same round trip straight after it
    idle_commits: list[float] = []  # a bare durable write after an idle gap: the arrive's floor
    chains: list[float] = []  # Postgres + wakeup: the bare chain after an idle gap (see prober)
    heard_at: list[float] = []  # when the Postgres listener heard a NOTIFY
    heard: list[float] = []  # per arrival: from the arrive call to the listener hearing its NOTIFY

    async def listen(listener: Any) -> None:
        sub = listener.subscribe()  # a waiter of its own beside the Worker's
        while True:
            before = listener.received
            await sub.wait(LONG)
            if listener.received > before:
                heard_at.append(time.perf_counter())

    async with store(kind, wakeup, urls) as (durable, waker), prober(kind, urls) as probe:
        worker = Worker(durable, body, alive=LONG, budget=LONG, visibility=LONG, poll_interval=poll,
                        wakeup=waker)
        task = asyncio.create_task(worker.run())
        ear = asyncio.create_task(listen(waker)) if kind == "postgres" and waker is not None else None
        try:
            for i in range(samples):
                if probe is not None:  # each after its own idle gap, so nothing after it is warmed
                    await asyncio.sleep(rng.uniform(0.0, poll.total_seconds()) + 0.005)
                    first, warm = await probe.round_trips()
                    first_rts.append(first)
                    warm_rts.append(warm)
                    await asyncio.sleep(rng.uniform(0.0, poll.total_seconds()) + 0.005)
                    idle_commits.append(await probe.commit())
                    if waker is not None and probe.chain is not None:
                        await asyncio.sleep(rng.uniform(0.0, poll.total_seconds()) + 0.005)
                        chained = await probe.chained()
                        if chained is not None:
                            chains.append(chained)
                await asyncio.sleep(rng.uniform(0.0, poll.total_seconds()) + 0.005)
                w = f"pickup-{i}"
                t0 = time.perf_counter()
                await durable.arrive(w, "go", i)
                t1 = time.perf_counter()
                async with asyncio.timeout(poll.total_seconds() + 30), seen:
                    await seen.wait_for(lambda w=w: w in started)
                gaps.append(started[w] - t0)
                commits.append(t1 - t0)
                heard.extend([min(h for h in heard_at if h > t0) - t0] if any(h > t0 for h in heard_at) else [])
        finally:
            worker.stop()
            if ear is not None:
                ear.cancel()
            await asyncio.gather(task, *([ear] if ear else []), return_exceptions=True)
    ms = [g * 1000 for g in gaps]
    row: dict[str, Any] = {"store": kind, "wakeup": wakeup, "poll_ms": poll.total_seconds() * 1000, "samples": len(ms),
           "p50_ms": quantile(ms, 0.5), "p90_ms": quantile(ms, 0.9), "p99_ms": quantile(ms, 0.99),
           "mean_ms": statistics.fmean(ms),
           "max_ms": max(ms), "lost": samples - len(ms),
           "arrive_call_p50_ms": quantile([c * 1000 for c in commits], 0.5),
           "after_arrive_p50_ms": quantile([(g - c) * 1000 for g, c in zip(gaps, commits, strict=True)], 0.5)}
    if heard:
        row["notify_heard_p50_ms"] = quantile([h * 1000 for h in heard], 0.5)
    if first_rts:
        first_p50 = quantile([f * 1000 for f in first_rts], 0.5)
        commit_p50 = quantile([c * 1000 for c in idle_commits], 0.5)
        row.update({"idle_first_rt_p50_ms": first_p50,
                    "idle_first_rt_p99_ms": quantile([f * 1000 for f in first_rts], 0.99),
                    "warm_rt_p50_ms": quantile([f * 1000 for f in warm_rts], 0.5),
                    "p50_beyond_idle_first_rt_ms": row["p50_ms"] - first_p50,
                    "idle_commit_p50_ms": commit_p50,
                    "p50_beyond_idle_commit_ms": row["p50_ms"] - commit_p50})
    if chains:
        chain_p50 = quantile([c * 1000 for c in chains], 0.5)
        row.update({"bare_chain_p50_ms": chain_p50, "p50_beyond_bare_chain_ms": row["p50_ms"] - chain_p50})
    return row


CONFIGS: tuple[tuple[str, bool], ...] = (
    ("postgres", False), ("postgres", True), ("redis-stream", False), ("redis-stream", True),
    ("redis-set", False), ("sqlite", False),
)


def samples_for(poll: timedelta, quick: bool, samples: int | None = None) -> int:
    """Arrivals per poll interval: ``samples`` when given, else fewer for longer intervals (each
    arrival waits up to one interval), a fifth of that with ``quick``."""
    if samples is not None:
        return samples
    seconds = poll.total_seconds()
    per = {0.01: 200, 0.1: 100, 1.0: 40}.get(seconds) or max(20, min(200, round(10 / max(seconds, 0.05))))
    return max(10, per // 5) if quick else per


def parse_polls(text: str) -> tuple[timedelta, ...]:
    """``0.01,0.05,0.25`` (seconds) as poll intervals; a ``ValueError`` naming a bad one."""
    polls = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            seconds = float(part)
        except ValueError:
            raise ValueError(f"--poll: {part!r} is not a number of seconds (e.g. 0.01,0.05,0.25)") from None
        if not 0 < seconds <= 60:
            raise ValueError(f"--poll: {part} s is outside 0 < s <= 60")
        polls.append(timedelta(seconds=seconds))
    if not polls:
        raise ValueError("--poll: give at least one interval in seconds (e.g. 0.01,0.05,0.25)")
    return tuple(polls)


CSV_FIELDS = ("store", "wakeup", "poll_ms", "samples", "p50_ms", "p90_ms", "p99_ms", "mean_ms", "max_ms",
              "lost", "idle_commit_p50_ms", "error")


def save_csv(folder: Path, name: str, rows: list[dict[str, Any]]) -> Path:
    """The rows' figures (``CSV_FIELDS``) as ``<name>.csv``, one row per store, wakeup and poll interval."""
    import csv

    path = folder / f"{name}.csv"
    with path.open("w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        out.writeheader()
        out.writerows(rows)
    return path


def floor_summary(rows: list[dict[str, Any]]) -> str:
    """Plain sentences: how much of each wakeup p50 is what the platform charges any client."""
    lines = []
    for r in rows:
        if not r.get("wakeup") or "idle_first_rt_p50_ms" not in r:
            continue
        p50, first, commit = r["p50_ms"], r["idle_first_rt_p50_ms"], r["idle_commit_p50_ms"]
        lines.append(
            f"- {r['store']} + wakeup, poll {fmt(r['poll_ms'])} ms: p50 {fmt(p50)} ms. The first round "
            f"trip after the idle gap costs {fmt(first)} ms ({first / p50:.0%} of the p50; "
            f"{fmt(r['warm_rt_p50_ms'])} ms straight after); a bare write committed after the idle gap "
            f"costs {fmt(commit)} ms ({commit / p50:.0%}); the rest, {fmt(p50 - commit)} ms, is the "
            f"library's path"
            + (f" (the listener heard the NOTIFY {fmt(r['notify_heard_p50_ms'])} ms after the arrive call "
               f"began, {fmt(p50 - r['notify_heard_p50_ms'])} ms before the pass started: the Worker's "
               f"take, claim and load)." if "notify_heard_p50_ms" in r else ".")
            + (f" The bare chain (a notifying one-row write committed, heard by a listening connection, "
               f"then a one-row write committed on a third: what a woken, fenced pickup passes through, "
               f"without this library) took {fmt(r['bare_chain_p50_ms'])} ms, so the library's own share "
               f"is {fmt(r['p50_beyond_bare_chain_ms'])} ms." if "bare_chain_p50_ms" in r else ""))
    if not lines:
        return ""
    return ("How much of the p50 is the platform's. Each arrival comes after an idle gap (up to one "
            "poll interval), and on this machine the first round trip after idle is slow whoever makes "
            "it. The probes measure, in the same run, after idle gaps drawn like the arrivals' and with "
            "the same Worker polling, on a connection of their own: a bare SELECT 1 (PING on Redis), "
            "and a bare one-row INSERT committed (INCR on Redis). An arrive has to commit durably "
            "before any worker can see it, so the second is a floor no implementation gets under; the "
            "first is the part of it that is only waking up.\n\n" + "\n".join(lines) + "\n")


HOPS = ("arrive returned", "NOTIFY heard", "worker woken", "take sent", "take returned", "claim sent",
        "claim returned", "load sent", "load returned", "take_and_claim sent", "take_and_claim returned",
        "pass started")


class Timeline:
    """Monotonic timestamps at each hop of one pickup at a time, recorded by wrapping the calls the
    Worker makes (the wrappers cost a few microseconds, the same in every variant)."""

    def __init__(self) -> None:
        self.on = False
        self.marks: dict[str, float] = {}
        self.rows: list[dict[str, float]] = []
        self.done = asyncio.Event()

    def mark(self, hop: str, at: float | None = None) -> None:
        if self.on and hop not in self.marks:
            self.marks[hop] = time.perf_counter() if at is None else at

    def timed(self, obj: Any, method: str, hop: str) -> None:
        """Wrap ``obj.method`` to mark ``hop sent`` / ``hop returned`` for the call that found work."""
        call = getattr(obj, method)

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            sent = time.perf_counter()
            out = await call(*args, **kwargs)
            if out is not None or method not in ("take", "take_and_claim"):  # not an empty poll's
                self.mark(f"{hop} sent", sent)
                self.mark(f"{hop} returned")
            return out

        setattr(obj, method, wrapper)


async def side_by_side(poll: timedelta, samples: int, url: str, rng: random.Random) -> list[dict[str, Any]]:
    """Postgres + wakeup, the Worker's take, claim and load as three calls ("separate") and as
    one ``take_and_claim`` ("together"), on two schemas with a Worker each, arrivals alternating
    between them, each arrival after its own idle gap and the floor probed before each: what every
    hop of a pickup costs, and what joining the three saves, measured in one run."""
    from without_durability import Run, Worker
    from without_durability_postgres import PostgresDurable

    class Separate(PostgresDurable):
        take_and_claim = None  # type: ignore[assignment]  # the Worker makes the three calls

    variants: list[tuple[str, Timeline, Any, list[float]]] = []
    async with contextlib.AsyncExitStack() as stack:
        probe = await stack.enter_async_context(prober("postgres", {"postgres": url}))
        assert probe is not None
        workers = []
        for name in ("separate", "together"):
            line = Timeline()
            durable, listener = await stack.enter_async_context(store("postgres", True, {"postgres": url}))
            if name == "separate":
                durable.__class__ = Separate
            else:
                line.timed(durable, "take_and_claim", "take_and_claim")
            line.timed(durable.scheduler, "take", "take")
            line.timed(durable.checkpointer, "claim", "claim")
            line.timed(durable.checkpointer, "load", "load")
            wake_all = listener._wake_all

            def heard(line: Timeline = line, wake_all: Callable[[], None] = wake_all) -> None:
                line.mark("NOTIFY heard")
                wake_all()

            listener._wake_all = heard

            class Woken:
                async def wait(self, at_most: timedelta, line: Timeline = line, listener: Any = listener) -> None:
                    await listener.wait(at_most)
                    line.mark("worker woken")

            async def body(run: Run[Any], line: Timeline = line) -> object:
                line.mark("pass started")
                line.done.set()
                return None

            worker = Worker(durable, body, alive=LONG, budget=LONG, visibility=LONG, poll_interval=poll,
                            wakeup=Woken())
            workers.append((worker, asyncio.create_task(worker.run())))
            variants.append((name, line, durable, []))
        try:
            for i in range(samples):
                for _name, line, durable, floors in variants if i % 2 == 0 else variants[::-1]:
                    await asyncio.sleep(rng.uniform(0.0, poll.total_seconds()) + 0.005)
                    floors.append(await probe.commit() * 1000)
                    await asyncio.sleep(rng.uniform(0.0, poll.total_seconds()) + 0.005)
                    line.marks, line.on = {}, True
                    line.done.clear()
                    t0 = time.perf_counter()
                    await durable.arrive(f"pickup-{i}", "go", i)
                    line.mark("arrive returned")
                    async with asyncio.timeout(poll.total_seconds() + 30):
                        await line.done.wait()
                    line.on = False
                    line.rows.append({hop: (at - t0) * 1000 for hop, at in line.marks.items()})
        finally:
            for worker, _task in workers:
                worker.stop()
            await asyncio.gather(*(task for _, task in workers), return_exceptions=True)
    out = []
    for name, line, _, floors in variants:
        p50, floor = statistics.median(r["pass started"] for r in line.rows), statistics.median(floors)
        hops = {}
        for hop in HOPS:
            at = [r[hop] for r in line.rows if hop in r]
            if at:
                hops[hop] = {"at_p50_ms": statistics.median(at), "n": len(at)}
        out.append({"variant": name, "poll_ms": poll.total_seconds() * 1000, "samples": len(line.rows),
                    "p50_ms": p50, "p99_ms": quantile([r["pass started"] for r in line.rows], 0.99),
                    "idle_commit_p50_ms": floor, "p50_beyond_idle_commit_ms": p50 - floor, "hops": hops})
    return out


def timeline_table(rows: list[dict[str, Any]]) -> str:
    """Each hop's median time since the arrive call began, per variant and poll interval."""
    head = ["hop (ms since the arrive call began, p50)"] + [f"{r['variant']} {fmt(r['poll_ms'])} ms" for r in rows]
    body = [[hop] + [r["hops"].get(hop, {}).get("at_p50_ms") for r in rows] for hop in HOPS
            if any(hop in r["hops"] for r in rows)]
    body += [["pickup p50", *(r["p50_ms"] for r in rows)], ["floor: idle commit p50", *(r["idle_commit_p50_ms"] for r in rows)],
             ["p50 - floor", *(r["p50_beyond_idle_commit_ms"] for r in rows)]]
    return table(head, body)


async def timeline_main(folder: Path, quick: bool) -> dict[str, Any]:
    rng = random.Random(20261202)
    rows: list[dict[str, Any]] = []
    with servers("postgres") as srv:
        url = srv["postgres"].url
        settings = await postgres_settings(url)
        for poll in POLLS:
            t0 = time.perf_counter()
            rows.extend(await side_by_side(poll, samples_for(poll, quick), url, rng))
            print(f"  poll={poll.total_seconds() * 1000:g}ms: {time.perf_counter() - t0:.1f}s", flush=True)
    text = timeline_table(rows)
    result = {"benchmark": "pickup_timeline", "machine": machine(), "postgres_settings": settings, "rows": rows}
    save_json(folder, "pickup_timeline", result)
    write_summary(folder, "pickup_timeline", "# Pickup timeline (Postgres + wakeup)\n\nMedian time of each "
                  "hop since the arrive call began; \"separate\": take, claim and load as three calls; "
                  "\"together\": take_and_claim (one commit). Arrivals alternate between the two; the floor "
                  "is a bare one-row INSERT committed after an idle gap like the arrivals'.\n\n"
                  f"{text}\n\nMachine: {result['machine']}\n")
    print(text)
    return result


def wanted(kind: str, only: list[str] | None) -> bool:
    """Is ``kind`` selected by ``--only`` (a prefix match: ``redis`` takes both Redis schedulers)?"""
    return not only or any(kind.startswith(o) for o in only)


async def main(
    folder: Path,
    quick: bool,
    only: list[str] | None = None,
    polls: tuple[timedelta, ...] = POLLS,
    given: dict[str, str] | None = None,
    samples: int | None = None,
) -> dict[str, Any]:
    """Measure every selected store, wakeup and poll interval in ``polls``; ``given`` maps
    ``postgres``/``redis`` to a server URL of yours (else a private one is started)."""
    rng = random.Random(20261129)
    rows = []
    given = {k: v for k, v in (given or {}).items() if v}
    configs = [(kind, wake) for kind, wake in CONFIGS if wanted(kind, only)]
    kinds = ["postgres"] + (["redis"] if any(k.startswith("redis") for k, _ in configs) else [])
    with servers(*(k for k in kinds if k not in given)) as srv:
        urls = {k: given.get(k) or srv[k].url for k in kinds}
        settings = await postgres_settings(urls["postgres"])
        for kind, wake in configs:
            for poll in polls:
                t0 = time.perf_counter()
                try:
                    rows.append(await measure(kind, wake, poll, samples_for(poll, quick, samples), urls, rng))
                except Exception as exc:
                    rows.append({"store": kind, "wakeup": wake, "poll_ms": poll.total_seconds() * 1000,
                                 "error": f"{type(exc).__name__}: {exc}"})
                print(f"  {kind} wakeup={wake} poll={poll.total_seconds() * 1000:g}ms: "
                      f"{time.perf_counter() - t0:.1f}s", flush=True)
    good = [r for r in rows if "error" not in r]
    label: Callable[[dict[str, Any]], str] = lambda r: f"{r['store']}{' +wakeup' if r['wakeup'] else ''}"  # noqa: E731
    series = {}
    for name in dict.fromkeys(label(r) for r in good):
        pts = [r for r in good if label(r) == name]
        series[f"{name} p50"] = ([r["poll_ms"] for r in pts], [r["p50_ms"] for r in pts])
        series[f"{name} p99"] = ([r["poll_ms"] for r in pts], [r["p99_ms"] for r in pts])
    for kind in ("postgres", "redis-stream"):
        pts = [r for r in good if r["store"] == kind and r["wakeup"] and "idle_first_rt_p50_ms" in r]
        if pts:
            series[f"{kind}: bare commit after idle (floor) p50"] = (
                [r["poll_ms"] for r in pts], [r["idle_commit_p50_ms"] for r in pts])
    plot(folder, "pickup", "Pickup latency (arrive -> pass start)", "poll interval (ms)", "latency (ms)",
         series, logx=True, logy=True)
    text_table = table(["store", "wakeup", "poll ms", "samples", "p50 ms", "p90 ms", "p99 ms", "max ms",
                        "arrive call p50 ms", "after arrive p50 ms", "NOTIFY heard p50 ms", "idle first RT p50 ms",
                        "warm RT p50 ms", "idle commit p50 ms", "p50 beyond idle commit ms", "bare chain p50 ms"],
                       [[r["store"], r["wakeup"], r["poll_ms"], r.get("samples"), r.get("p50_ms"),
                         r.get("p90_ms"), r.get("p99_ms"), r.get("max_ms", r.get("error")), r.get("arrive_call_p50_ms"),
                         r.get("after_arrive_p50_ms"), r.get("notify_heard_p50_ms"), r.get("idle_first_rt_p50_ms"), r.get("warm_rt_p50_ms"),
                         r.get("idle_commit_p50_ms"), r.get("p50_beyond_idle_commit_ms"),
                         r.get("bare_chain_p50_ms")] for r in rows])
    floor = floor_summary(good)
    result = {"benchmark": "pickup", "machine": machine(), "postgres_settings": settings, "rows": rows,
              "polls_s": [p.total_seconds() for p in polls],
              "servers": {k: "given" if k in given else "private" for k in kinds}}
    save_json(folder, "pickup", result)
    save_csv(folder, "pickup", rows)
    write_summary(folder, "pickup", f"# Pickup latency\n\nFrom the arrive call to the pass starting; one "
                  f"idle Worker. \"idle first RT\": a bare round trip (Postgres SELECT 1, Redis PING) on an "
                  f"otherwise unused connection after an idle gap like the arrivals'; \"warm RT\": the same "
                  f"straight after; \"idle commit\": a bare one-row INSERT committed (Redis INCR) after "
                  f"its own idle gap, the floor under any durable arrive; \"NOTIFY heard\": from the arrive "
                  f"call to the Postgres listener hearing its NOTIFY (the rest, to the pass start, is the "
                  f"Worker's take, claim and load).\n\n{text_table}\n\n{floor}\n"
                  f"Machine: {result['machine']}\n")
    print(text_table)
    if floor:
        print("\n" + floor)
    return result


if __name__ == "__main__":
    p = parser(__doc__ or "")
    p.add_argument("--only", nargs="+", metavar="STORE",
                   help="measure only these stores (prefix match: postgres, redis, redis-stream, sqlite)")
    p.add_argument("--timeline", action="store_true",
                   help="Postgres + wakeup only: each hop of a pickup, the Worker's three calls against "
                        "take_and_claim, interleaved in one run")
    p.add_argument("--poll", default=None, metavar="SECONDS,...",
                   help="the poll intervals to measure, in seconds (default 0.01,0.1,1)")
    p.add_argument("--samples", type=int, default=None, metavar="N",
                   help="arrivals per store, wakeup and poll interval (default: fewer for longer intervals)")
    p.add_argument("--postgres-url", default=None, metavar="URL",
                   help="measure this Postgres (its user may create schemas) instead of a private one")
    p.add_argument("--redis-url", default=None, metavar="URL",
                   help="measure this Redis instead of a private one (keys under a prefix of their own)")
    args = p.parse_args()
    try:
        polls = parse_polls(args.poll) if args.poll is not None else POLLS
    except ValueError as exc:
        p.error(str(exc))
    if args.samples is not None and args.samples < 1:
        p.error("--samples: at least 1")
    out = report_dir(args.out)
    if args.timeline:
        asyncio.run(timeline_main(out, args.quick))
    else:
        asyncio.run(main(out, args.quick, args.only, polls,
                         {"postgres": args.postgres_url, "redis": args.redis_url}, args.samples))
    print(f"\nreport: {out}")
