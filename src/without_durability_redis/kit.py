"""The Redis store's kits: ``redis-set`` and ``redis-stream`` on one server, and ``redis-cluster``
and ``redis-cluster-stream`` (the checkpointer with either scheduler) on a private 3-node Redis
Cluster; for the suite and for wd-chaos runs alike.

Each test gets its own key prefix and deletes exactly its own keys afterwards (a server named by
``WD_REDIS_URL`` may hold other data; nothing here flushes it). Time is the server's, so the suite's
clock is a real one.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from without_durability._values import Pass
from without_durability.durable import SplitDurable
from without_durability.testing.harness import EffectFailed, EffectKit, RealTestClock, StoreUnderTest
from without_durability.testing.kit import MutatePlan, Opened, Spec, StoreKit
from without_durability.testing.replicated import Replicated
from without_durability.testing.servers import (
    Server,
    ServerRecipe,
    ServerUnavailable,
    provide,
    why_unavailable,
)

from .local_server import REDIS_CLUSTER_SERVER, REDIS_SERVER
from .replicated import RedisReplicated, replicated_redis
from .replicated import unavailable as replication_unavailable


def _driver_missing() -> str | None:
    try:
        import redis.asyncio  # noqa: F401
    except ModuleNotFoundError:
        return "the redis driver is not installed: pip install 'without-durability[redis]'"
    return None


def redis_effects(checkpointer: Any, client: Any) -> EffectKit[Any]:
    """Ledger effects as Lua over a hash under the workflow's own tag (``<hash_key>:ledger``)."""
    from without_durability_redis import LuaEffect

    def ledger_key(name: str) -> str:
        return f"{checkpointer.hash_key(name)}:ledger"

    def ledger_add(name: str, amount: int) -> LuaEffect:
        return LuaEffect(
            "return cjson.encode(redis.call('HINCRBY', KEYS[1], 'total', tonumber(ARGV[1])))",
            (ledger_key(name),),
            (amount,),
        )

    async def ledger_read(name: str) -> int:
        value = await client.hget(ledger_key(name), "total")
        return int(value) if value is not None else 0

    def superseding(pass_: Pass, inner: LuaEffect) -> LuaEffect:
        # Nothing can run inside a script, so the effect raises the claim's token itself. The claim
        # key is handed over as an argument rather than declared: the store undoes an effect's
        # declared keys when it refuses the record, and this write stands for a claim made by
        # someone else, which must survive (it is the same slot, so a cluster allows it).
        return LuaEffect(
            f"local result = (function()\n{inner.source}\nend)()\n"
            "redis.call('HINCRBY', ARGV[#ARGV], 'token', 1)\nreturn result",
            inner.keys,
            (*inner.args, checkpointer.claim_key(pass_.workflow)),
        )

    def failing(inner: LuaEffect) -> LuaEffect:
        return LuaEffect(
            f"(function()\n{inner.source}\nend)()\nerror('effect failed after performing its write')",
            inner.keys,
            inner.args,
            on_error=EffectFailed,
        )

    return EffectKit(ledger_add, ledger_read, superseding, failing)


async def delete_prefix(client: Any, prefix: str) -> int:
    """Delete every key under ``prefix`` (one key at a time, so a cluster's slots never mix); how
    many. Glob characters in ``prefix`` are escaped: it matches itself only."""
    pattern = "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + "*"
    keys = [key async for key in client.scan_iter(match=pattern, count=500)]
    for key in keys:
        await client.unlink(key)
    return len(keys)


def _opener(name: str, scheduler: str, cluster: bool) -> Callable[[Server], Any]:
    @asynccontextmanager
    async def open_store(server: Server) -> AsyncIterator[StoreUnderTest[Any]]:
        from redis.asyncio import Redis
        from redis.asyncio.cluster import RedisCluster

        from without_durability_redis import (
            RedisCheckpointer,
            RedisSetScheduler,
            RedisStreamScheduler,
        )

        client: Any = RedisCluster.from_url(server.url) if cluster else Redis.from_url(server.url)
        prefix = f"wdtest-{uuid.uuid4().hex[:12]}:"
        try:
            checkpointer = RedisCheckpointer(client, prefix=prefix)
            sched: Any
            if scheduler == "stream":
                sched = RedisStreamScheduler(client, prefix=prefix, consumer="suite")
            else:
                sched = RedisSetScheduler(client, prefix=prefix)
            durable: SplitDurable[Any] = SplitDurable(checkpointer, sched)
            effects = redis_effects(checkpointer, client)
            yield StoreUnderTest(
                name,
                durable,
                RealTestClock(),
                effects,
                extra={"client": client, "prefix": prefix, "server": server},
            )
        finally:
            try:
                await delete_prefix(client, prefix)
            finally:
                await client.aclose()

    return open_store


# -- wd-chaos: one key prefix shared by the run's processes ----------------------------------------

_LEDGER_LUA = """
-- KEYS[1]: this workflow's ledger list (same hash slot as the workflow)
-- ARGV[1]: the transact key, ARGV[2]: the pass token. Returns the new entry as JSON.
local n = redis.call('RPUSH', KEYS[1], cjson.encode({key = ARGV[1], token = tonumber(ARGV[2])}))
return cjson.encode({row = n, token = tonumber(ARGV[2])})
"""


async def open_redis_worker(spec: Spec, *, scheduler: str, cluster: bool) -> Opened:
    """Open the run's keys (``spec["prefix"]`` at ``spec["url"]``) with ``scheduler`` ("set" or
    "stream"), on one server or a cluster, and a ledger list under each workflow's hash tag."""
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

    from . import LuaEffect, RedisCheckpointer, RedisSetScheduler, RedisStreamScheduler

    timeout = float(spec.get("timeout", 5))
    client: Any
    if spec.get("sentinels"):  # a replicated store: every connection asks where the primary is
        from redis.asyncio.sentinel import Sentinel

        untyped: Any = Sentinel  # redis-py leaves its constructor unannotated
        sentinel = untyped(
            [(str(h), int(p)) for h, p in spec["sentinels"]],
            socket_timeout=timeout,
            sentinel_kwargs={"socket_timeout": timeout, "socket_connect_timeout": timeout},
        )
        client = sentinel.master_for(spec["service"], socket_timeout=timeout, socket_connect_timeout=timeout)
    else:
        opener: Any = RedisCluster if cluster else Redis
        client = opener.from_url(spec["url"], socket_timeout=timeout, socket_connect_timeout=timeout)
    prefix = spec["prefix"]
    namespace = spec.get("namespace", "default")
    options: dict[str, Any] = {"prefix": prefix}
    if spec.get("ttl"):  # a scenario's small retention (long-wait)
        options["ttl"] = timedelta(seconds=float(spec["ttl"]))
    if spec.get("wait_replicas"):  # a failover run's WAIT
        options["replicas"] = int(spec["wait_replicas"])
    if spec.get("own_server"):  # a server the harness started: its persistence is the harness's choice
        options["warn_persistence"] = False
    checkpointer = RedisCheckpointer(client, **options)
    sched: Any
    wait_client: Any = None
    if scheduler == "stream" and spec.get("wakeup") and not spec.get("sentinels"):
        # the blocking read on a client of its own (through its own proxy when the run gives one
        # in ``wakeup_url``), with no socket timeout: the scheduler bounds its reads itself
        wait_client = opener.from_url(spec.get("wakeup_url") or spec["url"], socket_connect_timeout=timeout)
    if scheduler == "stream":  # consumer: the worker's identity, where the scenario names it
        sched = RedisStreamScheduler(
            client, prefix=prefix, namespace=namespace, consumer=spec.get("consumer"), wait_client=wait_client
        )
    else:
        sched = RedisSetScheduler(client, prefix=prefix, namespace=namespace)
    durable: SplitDurable[Any] = SplitDurable(checkpointer, sched)

    def ledger_key(workflow: str) -> str:
        return f"{checkpointer.hash_key(workflow)}:ledger"

    def ledger_effect(workflow: str, key: str, token: int, failpoint: Callable[[], None]) -> Any:
        failpoint()  # the script is the commit: the nearest a kill can get is just before it
        return LuaEffect(source=_LEDGER_LUA, keys=(ledger_key(workflow),), args=(key, str(token)))

    async def read_ledger(workflows: list[str]) -> list[dict[str, Any]]:
        rows = []
        for wf in workflows:
            for i, raw in enumerate(await client.lrange(ledger_key(wf), 0, -1), start=1):
                entry = json.loads(raw)
                rows.append({"row": i, "workflow": wf, "key": entry["key"], "token": int(entry["token"])})
        return rows

    def name(raw: object) -> str:
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    async def read_queue() -> dict[str, int]:
        if scheduler != "stream":  # the sorted set: one member per workflow
            return {name(m): 1 for m in await client.zrange(sched.key, 0, -1)}
        # the stream: its entries per workflow (field w), or 1 for a workflow with only a timer
        counts: dict[str, int] = {}
        for _id, fields in await client.xrange(sched.stream_key, "-", "+"):
            wf = name(fields.get(b"w", fields.get("w")))
            counts[wf] = counts.get(wf, 0) + 1
        for m in await client.zrange(sched.timers_key, 0, -1):
            counts.setdefault(name(m), 1)
        return counts

    async def close() -> None:
        await client.aclose()
        if wait_client is not None:
            await wait_client.aclose()

    opened = Opened(durable, close, ledger_effect, read_ledger, read_queue=read_queue)
    if wait_client is not None:  # spec["wakeup"]: idle workers block on the stream
        opened.wakeup = sched
    return opened


REDIS_MUTATE_PLAN = MutatePlan(
    scripts="without_durability_redis",
    script_reader="without_durability_redis._scripts:_file",
    equivalents="without_durability_redis:equivalent.toml",
    tests=(
        "tests/test_conformance.py",
        "tests/test_redis.py",
        "tests/test_redis_answer_and_take.py",
        "tests/test_redis_coalesce.py",
        "tests/test_receipt_numbers.py",
    ),
    stores=("redis-set", "redis-stream"),
    name="redis",
    server_env=REDIS_SERVER.env,
    scenarios=("lease-stall", "append-storm"),
    # the checkpointer's scripts are one code path under either scheduler: run them once
    narrow=(
        ("lua:set_", ("redis-set",)),
        ("lua:stream", ("redis-stream",)),
        ("lua:_stream", ("redis-stream",)),
        ("lua:", ("redis-set",)),
    ),
    # the decisions around the scripts: replies read, fences raised, takes (wd-chaos mutate --python)
    python=("src/without_durability_redis/checkpointer.py", "src/without_durability_redis/schedulers.py"),
)
"""What ``wd-chaos mutate --store redis`` (or either single-server kit's name) mutates and runs."""


class RedisKit(StoreKit):
    """The Redis checkpointer with one of its schedulers, on one server or a cluster."""

    mutant_modules = ("without_durability_redis.mutants",)
    recipe: ServerRecipe

    def __init__(
        self,
        name: str,
        scheduler: str,
        recipe: ServerRecipe,
        description: str,
        aliases: tuple[str, ...] = (),
        *,
        failover: bool = False,
    ) -> None:
        self.name = name
        self.description = description
        self.aliases = aliases
        self.scheduler = scheduler
        self.recipe = recipe
        self.cluster = recipe is REDIS_CLUSTER_SERVER
        # a cluster's nodes answer with their own addresses, so one proxy cannot stand in for them,
        # and restarting one node is not restarting the store
        self.provides = frozenset({"workers"} if self.cluster else {"workers", "restart", "proxy", "power-loss"})
        if failover:  # a replicated deployment is one primary under Sentinel, never a cluster
            self.provides |= {"failover"}
        self.server_binary = None if self.cluster else "redis-server"
        self.server_key = recipe.kind  # the set and stream kits share one server per session
        if not self.cluster:  # one plan for both schedulers: the scripts are one package
            self.mutate_plan = REDIS_MUTATE_PLAN

    def unavailable(self) -> str | None:
        """Why this kit cannot run here (driver or server missing), or None."""
        return _driver_missing() or why_unavailable(self.recipe)

    def server(
        self,
        *,
        restartable: bool = False,
        env: dict[str, str] | None = None,
        datadir: Path | None = None,
        relaxed: bool = False,
    ) -> contextlib.AbstractContextManager[Server]:
        """A redis-server (``restartable``: with an fsync per write, the one setting under which
        an acknowledged write survives a SIGKILL), or a cluster. ``datadir``: a private one whose
        append-only log is there, fsynced per write, or once a second when ``relaxed``
        (``appendfsync everysec``, Redis's default for the log)."""
        extra: dict[str, Any] = {} if env is None else {"env": env}
        if env is not None and self.cluster:
            raise ServerUnavailable(f"{self.name}: a cluster's nodes cannot be started on one stepped clock")
        if (datadir is not None or relaxed) and not self.cluster:
            policy = "everysec" if relaxed else "always"
            return provide(self.recipe, private=True, datadir=datadir, appendfsync=policy, **extra)
        if restartable and not self.cluster:
            return provide(self.recipe, private=True, fsync_always=True, **extra)
        if extra:
            return provide(self.recipe, **extra)
        return provide(self.recipe)

    def open(self, server: Server) -> Any:
        """A fresh key prefix on ``server``, deleted afterwards."""
        return _opener(self.name, self.scheduler, self.cluster)(server)

    def replicated(self, *, synchronous: bool) -> contextlib.AbstractContextManager[Replicated]:
        """A private primary with two replicas under three Sentinels (see ``replicated.py``).
        Redis replication is always asynchronous: ``synchronous`` is carried by ``wait_replicas``
        in the spec (``WAIT``), not by the deployment."""
        return replicated_redis()

    def replication_unavailable(self) -> str | None:
        """Which of redis-server and redis-sentinel is missing, or None."""
        if "failover" not in self.provides:
            return super().replication_unavailable()
        return replication_unavailable()

    def worker_spec(self, server: Server | Replicated, run_dir: Path, tag: str) -> Spec:
        """The server's URL and the run's own key prefix; for a replicated deployment, its
        Sentinels and service too, so every connection asks where the primary is."""
        spec: Spec = {"url": server.url, "prefix": f"{tag}:"}
        if self.scheduler == "stream":  # the consumer name: host and pid unless a run names it
            spec["consumer"] = None
        # a server this run started itself (not a user's, named by a URL variable): no warning
        # that its writes may not survive a crash, which the run chose (issue 30)
        spec["own_server"] = getattr(server, "source", "replicated") != "env"
        if isinstance(server, RedisReplicated):
            spec["sentinels"] = [list(s) for s in server.sentinels]
            spec["service"] = server.service
        return spec

    async def open_worker(self, spec: Spec) -> Opened:
        """Open the run's keys (see ``open_redis_worker``)."""
        return await open_redis_worker(spec, scheduler=self.scheduler, cluster=self.cluster)

    async def cleanup(self, spec: Spec) -> str | None:
        """Delete every key under the run's prefix (``delete_prefix``; a cluster's nodes each
        scanned) and say how many."""
        from redis.asyncio import Redis
        from redis.asyncio.cluster import RedisCluster

        from ._scripts import where as _where
        from .errors import boundary

        prefix = str(spec["prefix"])
        if not prefix.endswith(":") or len(prefix) < 2:  # never a pattern wider than one run's keys
            raise ValueError(f"refusing to delete keys under {prefix!r}: not a run's own prefix")
        if spec.get("sentinels"):  # a replicated deployment is always a private one, removed with the run
            return None
        client: Any = (RedisCluster if self.cluster else Redis).from_url(spec["url"])
        try:
            with boundary(client, f"delete the run's keys under {prefix!r}"):
                deleted = await delete_prefix(client, prefix)
            where = _where(client)
        finally:
            await client.aclose()
        return f"deleted {deleted} key(s) under {prefix!r} on {where}"


REDIS_SET = RedisKit(
    "redis-set",
    "set",
    REDIS_SERVER,
    "RedisCheckpointer + RedisSetScheduler on one redis-server",
    aliases=("redis",),
    failover=True,
)
REDIS_STREAM = RedisKit(
    "redis-stream", "stream", REDIS_SERVER, "RedisCheckpointer + RedisStreamScheduler on one redis-server"
)
REDIS_CLUSTER = RedisKit(
    "redis-cluster",
    "set",
    REDIS_CLUSTER_SERVER,
    "RedisCheckpointer + RedisSetScheduler on a 3-node Redis Cluster",
)
REDIS_CLUSTER_STREAM = RedisKit(
    "redis-cluster-stream",
    "stream",
    REDIS_CLUSTER_SERVER,
    "RedisCheckpointer + RedisStreamScheduler on a 3-node Redis Cluster",
)
