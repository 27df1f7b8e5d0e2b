"""Both Redis schedulers through this library, redis-benchmark sending the shipped answer-and-take
scripts (the ceiling), and redis-py alone chaining the same scripts (the driver's share)."""

from __future__ import annotations

import asyncio
import csv
import io
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from .._common import check_exactly_once
from .drain import NAMESPACE, VISIBILITY, drain, drain_chained, workflow_ids

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
        await asyncio.gather(*(sched.schedule(x) for x in ids[i : i + 50]))
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
                    rows.append(
                        {
                            "system": (kind if chained else f"{kind}-take-only") + suffix,
                            "workers": w,
                            "n": n,
                            **r,
                            **check,
                            "server_usec_per_call": await server_usec_per_call(client),
                            "client_cpu_usec_per_call": cpu / n * 1e6,
                        }
                    )
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
                rows.append(
                    {
                        "system": f"redis-py-raw-{kind}",
                        "workers": w,
                        "n": n,
                        "seconds": seconds,
                        "rate": len(got) / seconds,
                        "hiredis": redis.utils.HIREDIS_AVAILABLE,
                        **check,
                        "server_usec_per_call": await server_usec_per_call(client),
                        "client_cpu_usec_per_call": cpu / len(got) * 1e6,
                    }
                )
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
                cmd = [
                    "redis-benchmark",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-c",
                    str(w),
                    "-n",
                    str(n),
                    "--csv",
                    "EVALSHA",
                    sha,
                    str(len(keys)),
                    *keys,
                    *[str(a) for a in args],
                ]
                await client.config_resetstat()
                cpu = children_cpu()
                out = await asyncio.to_thread(
                    subprocess.run, cmd, capture_output=True, text=True, timeout=600
                )
                cpu = children_cpu() - cpu
                rps = None
                for rec in csv.reader(io.StringIO(out.stdout)):
                    if rec and rec[0] != "test":
                        rps = float(rec[1])
                if kind == "redis-set":
                    hidden = await client.zcount(sched.key, f"({time.time() * 1e6:.0f}", "+inf")
                else:
                    hidden = await client.zcard(sched.timers_key)
                rows.append(
                    {
                        "system": f"redis-benchmark-{name}",
                        "workers": w,
                        "n": n,
                        "rate": rps,
                        "server_usec_per_call": await server_usec_per_call(client),
                        "client_cpu_usec_per_call": cpu / n * 1e6,
                        "taken_exactly_n": hidden == n,
                        "hidden_after": hidden,
                    }
                )
    finally:
        await client.aclose()
    return rows
