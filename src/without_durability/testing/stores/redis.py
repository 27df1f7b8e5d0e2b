"""The Redis store's factories: ``redis-set`` and ``redis-stream`` on one server, and
``redis-cluster`` and ``redis-cluster-stream`` (the checkpointer with either scheduler) on a private
3-node Redis Cluster.

Each test gets its own key prefix and deletes exactly its own keys afterwards (a server named by
``WD_REDIS_URL`` may hold other data; nothing here flushes it). Time is the server's, so the suite's
clock is a real one.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from ..._values import Pass
from ...durable import SplitDurable
from ..harness import EffectFailed, EffectKit, RealTestClock, StoreFactory, StoreUnderTest, register
from ..servers import Server, provide, why_unavailable


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


async def delete_prefix(client: Any, prefix: str) -> None:
    """Delete every key under ``prefix`` (one key at a time, so a cluster's slots never mix)."""
    keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=500)]
    for key in keys:
        await client.unlink(key)


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


def _unavailable(kind: str) -> Callable[[], str | None]:
    return lambda: _driver_missing() or why_unavailable(kind)


def _standalone() -> contextlib.AbstractContextManager[Server]:
    """The standalone server recipe. The set and stream factories pass this one function, and the
    plugin keeps one server per recipe, so both run against the same redis-server."""
    return provide("redis")


def _cluster() -> contextlib.AbstractContextManager[Server]:
    """The cluster recipe, shared the same way by both cluster factories."""
    return provide("redis-cluster")


REDIS_SET = register(
    StoreFactory(
        "redis-set",
        _opener("redis-set", "set", cluster=False),
        _standalone,
        _unavailable("redis"),
        "RedisCheckpointer + RedisSetScheduler on one redis-server",
    )
)
REDIS_STREAM = register(
    StoreFactory(
        "redis-stream",
        _opener("redis-stream", "stream", cluster=False),
        _standalone,
        _unavailable("redis"),
        "RedisCheckpointer + RedisStreamScheduler on one redis-server",
    )
)
REDIS_CLUSTER = register(
    StoreFactory(
        "redis-cluster",
        _opener("redis-cluster", "set", cluster=True),
        _cluster,
        _unavailable("redis-cluster"),
        "RedisCheckpointer + RedisSetScheduler on a 3-node Redis Cluster",
    )
)
REDIS_CLUSTER_STREAM = register(
    StoreFactory(
        "redis-cluster-stream",
        _opener("redis-cluster-stream", "stream", cluster=True),
        _cluster,
        _unavailable("redis-cluster"),
        "RedisCheckpointer + RedisStreamScheduler on a 3-node Redis Cluster",
    )
)
