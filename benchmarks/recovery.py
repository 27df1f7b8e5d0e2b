"""Recovery: how long a workflow whose worker died waits before another worker resumes it.

    python -m benchmarks.recovery [--quick] [--out DIR] [--only STORE ...] [--fast-failover-only]

Per store (postgres, redis-set, redis-stream, sqlite; the names the other benchmarks use), two or
more worker *processes* run the library ``Worker`` against one store, with the wakeup on where the
store has one (Postgres LISTEN/NOTIFY, the Redis stream's blocking read). For each sample the
benchmark arrives one workflow; the worker whose pass takes it records a first step and then hangs
inside a second step; at a random moment within the first renewal period (uniform over
``[0, alive/3]``, so the kill lands at every phase of the renewal cycle) the benchmark SIGKILLs that
process and starts a replacement. ``kill_to_resume_ms`` runs from the SIGKILL to the moment another
worker's pass on that workflow starts (both read from ``time.monotonic``, one clock for every
process on Linux). It is printed beside the bound the settings give, ``alive + poll_interval``:
a dead pass's claim lapses ``alive`` after its last renewal, and a polling worker looks at most one
poll interval later.

The settings: ``visibility = alive`` (a taken delivery reappears when its claim lapses, not later;
``visibility`` above ``alive`` would make ``visibility`` the bound), ``retry_contended =
poll_interval`` (a take that lands a moment before the claim lapses tries again after one poll,
not after a second), ``budget = 2 * alive``.

Counted and printed for every store: ``lost`` (workflows not finished at the end), ``past_fence``
(a resumed pass whose token was not above the killed pass's: it ran on a fence that should have
refused it), ``duplicated`` (workflows whose body completed more than once).

Second-fault rows (``second fault: store restart``, each server store): the same kill, then the
store's server SIGKILLed and started again ``DOWN`` seconds later, beginning at a random moment in
``[alive/2, alive]`` after the kill, so the outage covers the moment the dead pass's claim lapses
and the takeover is tried. ``kill_to_done_ms`` (every row) runs from the SIGKILL to the end of the
pass that finished the workflow: under a restart the first pass to start may meet the outage and
leave the delivery to reappear a visibility later. Its bound is ``2 * alive + poll + outage``: the
claim lapses within ``alive``, a takeover the outage failed waits out its delivery's visibility
(``= alive``), then a poll, with the outage (``down`` plus the server's start) on top.

``--fast-failover`` rows: Postgres with ``PostgresCheckpointer(failover=...)`` (see
``without_durability_postgres.failover``), alive = 30 s, where the bound is the server's detection
of the dead worker's session plus a poll, not the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from ._common import ROOT, machine, parser, plot, report_dir, save_json, servers, table, write_summary


@contextlib.contextmanager
def _servers(kinds: list[str], restartable: bool) -> Iterator[dict[str, Any]]:
    """The benchmark's servers; private restartable instances when a row restarts one."""
    if not restartable:
        with servers(*kinds) as srv:
            yield srv
        return
    from without_durability.testing.kit import find_kit

    with contextlib.ExitStack() as stack:
        yield {k: stack.enter_context(find_kit(k).server(restartable=True)) for k in kinds}


STORES = ("postgres", "redis-set", "redis-stream", "sqlite")
SERVER_STORES = ("postgres", "redis-set", "redis-stream")
DOWN = 1.0
"""Seconds the store's server stays down in a second-fault sample before it is started again."""


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


# -- the worker process ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def open_store(spec: dict[str, Any]) -> AsyncIterator[tuple[Any, Any]]:
    """(durable, wakeup or None) for ``spec``: the same store in the benchmark and in each worker."""
    kind = spec["store"]
    if kind == "postgres":
        from psycopg_pool import AsyncConnectionPool

        from without_durability_postgres import (
            PostgresCheckpointer,
            PostgresDurable,
            PostgresScheduler,
            PostgresWakeup,
        )

        pool: Any = AsyncConnectionPool(
            spec["url"],
            open=False,
            min_size=2,
            max_size=4,
            kwargs={"options": f"-c search_path={spec['schema']}"},
        )
        await pool.open(wait=True, timeout=30)
        try:
            fast = bool(spec.get("fast_failover"))
            listener = PostgresWakeup(pool, namespace=spec["schema"], presence=fast)
            durable = PostgresDurable(
                PostgresCheckpointer(pool=pool, failover=listener if fast else None),
                PostgresScheduler(pool, namespace=spec["schema"], notify=True, reap_dead=fast),
            )
            async with listener:
                yield durable, listener
        finally:
            await pool.close()
    elif kind.startswith("redis"):
        from redis.asyncio import Redis

        from without_durability import SplitDurable
        from without_durability_redis import RedisCheckpointer, RedisSetScheduler, RedisStreamScheduler

        client = Redis.from_url(spec["url"])
        try:
            sched: Any = (RedisStreamScheduler if kind == "redis-stream" else RedisSetScheduler)(client)
            yield SplitDurable(RedisCheckpointer(client), sched), (sched if kind == "redis-stream" else None)
        finally:
            await client.aclose()
    else:
        from without_durability import SqliteDurable

        async with await SqliteDurable.open(spec["path"]) as durable:
            yield durable, None


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"ev": event, "pid": os.getpid(), "t": time.monotonic(), **fields}), flush=True)


async def child(spec: dict[str, Any]) -> None:
    """A worker process: the library Worker; a workflow's first pass hangs in its second step."""
    from without_durability import Run, Worker

    async def nothing() -> object:
        return None

    async def hang() -> object:
        await asyncio.sleep(3600)
        return None

    async def body(run: Run[Any]) -> object:
        first = not run.recorded("began")
        emit("start", w=run.workflow, token=run.pass_.token, first=first)
        if first:
            await run.step("began", nothing, lambda v: v)
            emit("began", w=run.workflow, token=run.pass_.token)
            await run.step("work", hang, lambda v: v)  # killed in here
        else:
            await run.step("work", nothing, lambda v: v)
        emit("end", w=run.workflow, token=run.pass_.token)
        return "done"

    alive = timedelta(seconds=spec["alive"])
    poll = timedelta(seconds=spec["poll"])
    async with open_store(spec) as (durable, wakeup):
        worker = Worker(
            durable,
            body,
            alive=alive,
            budget=2 * alive,
            visibility=alive,
            poll_interval=poll,
            retry_contended=poll,
            wakeup=wakeup,
        )
        emit("ready")
        await worker.serve()


# -- the benchmark --------------------------------------------------------------------------------


class Fleet:
    """The worker processes of one configuration, and the events they print."""

    def __init__(self, spec: dict[str, Any], log: Path) -> None:
        self.spec = spec
        self.log = log  # the workers' stderr, kept for a look after a failed run
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.events: list[dict[str, Any]] = []
        self.changed = asyncio.Condition()
        self.readers: list[asyncio.Task[None]] = []

    async def spawn(self, *, ready: bool = True) -> int:
        """Start one worker process; with ``ready``, wait until its Worker runs."""
        with self.log.open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "benchmarks.recovery",
                "--child",
                json.dumps(self.spec),
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                cwd=str(ROOT),
            )
        self.procs[proc.pid] = proc
        self.readers.append(asyncio.create_task(self._read(proc)))
        if ready:
            await self.wait(lambda e: e["ev"] == "ready" and e["pid"] == proc.pid, 60)
        return proc.pid

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                async with self.changed:
                    self.events.append(event)
                    self.changed.notify_all()

    async def wait(self, match: Any, seconds: float) -> dict[str, Any]:
        async with asyncio.timeout(seconds), self.changed:
            while True:
                for e in self.events:
                    if match(e):
                        return e
                await self.changed.wait()

    def kill(self, pid: int) -> float:
        at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        return at

    async def close(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        for r in self.readers:
            r.cancel()
        await asyncio.gather(*self.readers, return_exceptions=True)


async def retried(call: Any, seconds: float = 30.0) -> Any:
    """``call()`` awaited, asked again while the store is unavailable (a restart), up to ``seconds``."""
    from without_durability.errors import StoreError

    deadline = time.monotonic() + seconds
    while True:
        try:
            return await call()
        except StoreError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def measure(
    spec: dict[str, Any],
    samples: int,
    workers: int,
    rng: random.Random,
    log: Path,
    server: Any = None,
) -> dict[str, Any]:
    """One row; with ``server``, each kill is followed by a restart of it (the second fault)."""
    from without_durability.lifecycle import status_of

    alive, poll = spec["alive"], spec["poll"]
    gaps: list[float] = []
    done: list[float] = []
    outages: list[float] = []
    past_fence = 0
    async with open_store(spec) as (durable, _):
        fleet = Fleet(spec, log)
        try:
            for _ in range(workers):
                await fleet.spawn()
            names = []
            for i in range(samples):
                w = f"recovery-{i}"
                names.append(w)
                await retried(lambda w=w, i=i: durable.arrive(w, "go", i))
                began = await fleet.wait(lambda e, w=w: e["ev"] == "began" and e["w"] == w, 30)
                await asyncio.sleep(rng.uniform(0.0, alive / 3))
                killed_at = fleet.kill(began["pid"])
                victim = began["pid"]
                fresh = await fleet.spawn(ready=False)  # the replacement, so the fleet keeps its size
                restart = None
                if server is not None:  # the second fault, while the takeover is due
                    restart = asyncio.create_task(_restart(server, killed_at + rng.uniform(0.5, 1.0) * alive))
                resumed = await fleet.wait(
                    lambda e, w=w, v=victim: e["ev"] == "start" and e["w"] == w and e["pid"] != v,
                    3 * alive + 30,
                )
                gaps.append(resumed["t"] - killed_at)
                if resumed["token"] <= began["token"]:
                    past_fence += 1
                ended = await fleet.wait(lambda e, w=w: e["ev"] == "end" and e["w"] == w, 3 * alive + 30)
                done.append(ended["t"] - killed_at)
                if restart is not None:
                    outages.append(await restart)
                # every sample starts with the whole fleet running, so a survivor is always there
                await fleet.wait(lambda e, p=fresh: e["ev"] == "ready" and e["pid"] == p, 60)
            lost = 0
            for w in names:  # the finished record lands just after the body's "end" line
                until = time.monotonic() + 10
                while status_of(await retried(lambda w=w: durable.checkpointer.load(w))).state != "finished":
                    if time.monotonic() > until:
                        lost += 1
                        break
                    await asyncio.sleep(0.1)
            ends: dict[str, int] = {}
            for e in fleet.events:
                if e["ev"] == "end":
                    ends[e["w"]] = ends.get(e["w"], 0) + 1
            duplicated = sum(n - 1 for n in ends.values() if n > 1)
        finally:
            await fleet.close()
    ms = [g * 1000 for g in gaps]
    done_ms = [g * 1000 for g in done]
    outage = max(outages, default=0.0)
    bound = (alive + poll) * 1000 if server is None else (2 * alive + poll + outage) * 1000
    return {
        "store": spec["store"],
        "second_fault": "store restart" if server is not None else None,
        "down_s": DOWN if server is not None else None,
        "outage_max_ms": outage * 1000 if server is not None else None,
        "kill_to_done_p50_ms": quantile(done_ms, 0.5),
        "kill_to_done_p99_ms": quantile(done_ms, 0.99),
        "fast_failover": bool(spec.get("fast_failover")),
        "wakeup": spec["store"] in ("postgres", "redis-stream"),
        "workers": workers,
        "alive_s": alive,
        "poll_ms": poll * 1000,
        "visibility_s": alive,
        "samples": len(ms),
        "kill_to_resume_p50_ms": quantile(ms, 0.5),
        "kill_to_resume_p99_ms": quantile(ms, 0.99),
        "kill_to_resume_mean_ms": statistics.fmean(ms),
        "kill_to_resume_max_ms": max(ms),
        "bound_ms": bound,
        "p50_to_bound": quantile(ms, 0.5) / bound,
        "p99_to_bound": quantile(ms, 0.99) / bound,
        "lost": lost,
        "past_fence": past_fence,
        "duplicated": duplicated,
    }


async def _restart(server: Any, at: float) -> float:
    """Restart ``server`` (kept down ``DOWN`` s) at monotonic time ``at``; how long it was out."""
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    t0 = time.monotonic()
    await asyncio.to_thread(server.restart, kill=True, down=DOWN)
    return time.monotonic() - t0


@contextlib.asynccontextmanager
async def configured(kind: str, urls: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
    """A fresh store of ``kind`` and the spec every process opens it with."""
    if kind == "postgres":
        from without_durability_postgres.kit import fresh_schema

        async with fresh_schema(urls["postgres"], min_size=1, max_size=2) as (_, schema):
            yield {"store": kind, "url": urls["postgres"], "schema": schema}
    elif kind.startswith("redis"):
        from redis.asyncio import Redis

        client = Redis.from_url(urls["redis"])
        await client.flushdb()
        await client.aclose()
        yield {"store": kind, "url": urls["redis"]}
    else:
        with tempfile.TemporaryDirectory(prefix="wd-recovery-") as tmp:
            path = str(Path(tmp) / "recovery.db")
            from without_durability import SqliteDurable

            async with await SqliteDurable.open(path):
                pass  # created before the workers open it
            yield {"store": kind, "path": path}


def configs(
    quick: bool, only: list[str] | None, fast_only: bool, second: bool = True
) -> list[dict[str, Any]]:
    """What to measure: each store at the lease settings, each server store again with a store
    restart during recovery (``second``), and Postgres with fast failover."""
    alive, poll, samples = (2.0, 0.1, 5) if quick else (5.0, 0.1, 20)
    out: list[dict[str, Any]] = []
    if not fast_only:
        for s in STORES:
            if only and not any(s.startswith(o) for o in only):
                continue
            out.append({"store": s, "alive": alive, "poll": poll, "samples": samples})
            if second and s in SERVER_STORES:
                out.append({"store": s, "alive": alive, "poll": poll, "samples": samples, "restart": True})
    if not only or any("postgres".startswith(o) for o in only):
        out.append(
            {
                "store": "postgres",
                "alive": 30.0,
                "poll": poll,
                "samples": 10 if quick else 30,
                "fast_failover": True,
            }
        )
    return out


async def main(
    folder: Path,
    quick: bool,
    only: list[str] | None = None,
    fast_only: bool = False,
    fast: bool = True,
    second: bool = True,
) -> dict[str, Any]:
    rng = random.Random(20261203)
    plan = [c for c in configs(quick, only, fast_only, second) if fast or not c.get("fast_failover")]
    kinds = [k for k in ("postgres", "redis") if any(c["store"].startswith(k) for c in plan)]
    rows: list[dict[str, Any]] = []
    restartable = any(c.get("restart") for c in plan)
    with _servers(kinds, restartable) as srv:
        urls = {k: srv[k].url for k in kinds}
        for c in plan:
            t0 = time.perf_counter()
            async with configured(c["store"], urls) as spec:
                spec.update(
                    {"alive": c["alive"], "poll": c["poll"], "fast_failover": c.get("fast_failover", False)}
                )
                server = srv[c["store"].split("-")[0]] if c.get("restart") else None
                try:
                    log = folder / "recovery-workers.log"
                    rows.append(await measure(spec, c["samples"], 2, rng, log, server))
                except Exception as exc:
                    rows.append(
                        {
                            "store": c["store"],
                            "second_fault": "store restart" if c.get("restart") else None,
                            "fast_failover": c.get("fast_failover", False),
                            "error": f"{type(exc).__name__}: {exc}",
                        }
                    )
            print(
                f"  {c['store']}{' fast failover' if c.get('fast_failover') else ''}"
                f"{' + store restart' if c.get('restart') else ''}: "
                f"{time.perf_counter() - t0:.1f}s",
                flush=True,
            )
    good = [r for r in rows if "error" not in r]
    label = lambda r: (  # noqa: E731
        f"{r['store']}{' fast failover' if r['fast_failover'] else ''}"
        f"{' + store restart' if r.get('second_fault') else ''}"
    )
    plot(
        folder,
        "recovery",
        "Kill to resume, against the lease bound (alive + poll)",
        "percentile",
        "kill to resume / bound",
        {label(r): ([50, 99], [r["p50_to_bound"], r["p99_to_bound"]]) for r in good},
    )
    text = table(
        [
            "store",
            "second fault",
            "fast failover",
            "wakeup",
            "alive s",
            "poll ms",
            "samples",
            "kill→resume p50 ms",
            "p99 ms",
            "max ms",
            "kill→done p50 ms",
            "p99 ms",
            "outage ms",
            "bound ms",
            "p50/bound",
            "p99/bound",
            "lost",
            "past fence",
            "duplicated",
        ],
        [
            [
                r["store"],
                r.get("second_fault") or "",
                r.get("fast_failover"),
                r.get("wakeup"),
                r.get("alive_s"),
                r.get("poll_ms"),
                r.get("samples"),
                r.get("kill_to_resume_p50_ms"),
                r.get("kill_to_resume_p99_ms"),
                r.get("kill_to_resume_max_ms", r.get("error")),
                r.get("kill_to_done_p50_ms"),
                r.get("kill_to_done_p99_ms"),
                r.get("outage_max_ms"),
                r.get("bound_ms"),
                r.get("p50_to_bound"),
                r.get("p99_to_bound"),
                r.get("lost"),
                r.get("past_fence"),
                r.get("duplicated"),
            ]
            for r in rows
        ],
    )
    bad = sum(int(r.get("lost", 0)) + int(r.get("past_fence", 0)) + int(r.get("duplicated", 0)) for r in good)
    result = {"benchmark": "recovery", "machine": machine(), "rows": rows, "lost_or_past_fence": bad}
    save_json(folder, "recovery", result)
    write_summary(
        folder,
        "recovery",
        "# Recovery\n\nFrom a worker process SIGKILLed mid-step to another "
        "worker's pass on that workflow starting; two worker processes (library Worker, wakeup "
        "on where the store has one), the killed one replaced at once. The bound is what the "
        "settings give: the claim lapses `alive` after its last renewal and a worker looks within "
        "a poll (`visibility = alive`, `retry_contended = poll`). With fast failover (Postgres, "
        "opt-in) the claim is taken over when the server sees the dead worker's session gone, "
        "so the lease bound no longer applies. Rows with a second fault restart the store's "
        f"server ({DOWN:g} s down) between alive/2 and alive after the kill: their bound is "
        "2 * alive + poll + the outage (a takeover the outage failed waits out its visibility). "
        "The machine is shared and noisy: read the ratios."
        f"\n\n{text}\n\nLost, run past its fence or duplicated, all rows: {bad}\n\n"
        f"Machine: {result['machine']}\n",
    )
    print(text)
    print(f"lost, past fence or duplicated: {bad}")
    return result


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        asyncio.run(child(json.loads(sys.argv[2])))
        sys.exit(0)
    p = parser(__doc__ or "")
    p.add_argument(
        "--only",
        nargs="+",
        metavar="STORE",
        help="measure only these stores (prefix match: postgres, redis, redis-stream, sqlite)",
    )
    p.add_argument(
        "--fast-failover-only", action="store_true", help="only the Postgres fast-failover row (alive = 30 s)"
    )
    p.add_argument("--no-fast-failover", action="store_true", help="leave out the fast-failover row")
    p.add_argument(
        "--no-second-fault",
        action="store_true",
        help="leave out the rows with a store restart during recovery",
    )
    args = p.parse_args()
    out = report_dir(args.out)
    asyncio.run(
        main(
            out,
            args.quick,
            args.only,
            args.fast_failover_only,
            not args.no_fast_failover,
            not args.no_second_fault,
        )
    )
    print(f"\nreport: {out}")
