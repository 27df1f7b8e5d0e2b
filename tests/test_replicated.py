"""Replicated servers (the store kits' ``replicated``) and what the stores keep across a
failover on them: a Postgres standby promoted with ``pg_ctl promote``, a Redis replica elected by
Sentinel, clients that follow the primary, and the Redis checkpointer's ``replicas`` (WAIT)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta

import pytest

from without_durability_postgres.replicated import replicated_postgres
from without_durability_redis.replicated import RedisReplicated, replicated_redis

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def redis_pair() -> Iterator[RedisReplicated]:
    with replicated_redis() as pair:
        yield pair


def _sentinel_client(pair: RedisReplicated) -> object:
    from redis.asyncio.sentinel import Sentinel

    return Sentinel(pair.sentinels, socket_timeout=2).master_for(pair.service, socket_timeout=2)


def _on_replicas(pair: RedisReplicated, key: str) -> list[dict[bytes, bytes]]:
    import redis

    return [
        dict(redis.Redis(host=r.host, port=r.port, socket_timeout=5).hgetall(key))  # type: ignore[arg-type]
        for r in pair.replicas
    ]


def test_a_write_that_waited_for_the_replica_is_on_it_and_one_that_could_not_is_not_acknowledged(
    redis_pair: RedisReplicated,
) -> None:
    from without_durability_redis import NotReplicated, RedisCheckpointer

    async def main() -> None:
        client = _sentinel_client(redis_pair)
        waiting = RedisCheckpointer(
            client, prefix="wait:", replicas=1, replica_timeout=timedelta(milliseconds=300)
        )  # type: ignore[arg-type]
        plain = RedisCheckpointer(client, prefix="plain:")  # type: ignore[arg-type]
        await waiting.supply("w1", "k", 1)
        assert any(_on_replicas(redis_pair, waiting.hash_key("w1"))), "WAIT returned before a replica had it"
        redis_pair.stall_standby()
        try:
            # the replica takes nothing while stopped: a waiting write cannot be acknowledged ...
            with pytest.raises(NotReplicated) as caught:
                await waiting.supply("w2", "k", 2)
            assert caught.value.acked == 0
            # ... while a plain write is acknowledged all the same: asynchronous replication
            assert (await plain.supply("w3", "k", 3)).won
        finally:
            redis_pair.resume_standby()
        await client.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())


def test_a_sentinel_client_follows_the_elected_replica(redis_pair: RedisReplicated) -> None:
    from without_durability.errors import StoreUnavailable
    from without_durability_redis import RedisCheckpointer

    async def main() -> None:
        client = _sentinel_client(redis_pair)
        cp = RedisCheckpointer(client, prefix="follow:", replicas=1)  # type: ignore[arg-type]
        assert (await cp.supply("w", "before", 1)).won
        old = redis_pair.kill_primary()
        await asyncio.to_thread(redis_pair.promote, 30)
        for _ in range(100):  # the client fails until it asks the Sentinels again
            try:
                loaded = await cp.load("w")
                break
            except StoreUnavailable:
                await asyncio.sleep(0.1)
        assert loaded == {"before": 1}, loaded
        assert (await cp.supply("w", "after", 2)).won is True
        assert redis_pair.standby.pid != old and redis_pair.standby in redis_pair.replicas
        await client.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())


def test_postgres_standby_is_promoted_and_a_multi_host_client_follows() -> None:
    """Synchronous only: the asynchronous form is the chaos gate's failover-async run."""
    import psycopg

    with replicated_postgres(synchronous=True) as pair:
        with psycopg.connect(pair.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (x int)")
            conn.execute("INSERT INTO t VALUES (1)")
            assert conn.info.port == pair.primary.port
        # a synchronous commit returned only once the standby had it, so the kill loses nothing
        pair.kill_primary()
        pair.promote(30)
        with psycopg.connect(pair.url, autocommit=True) as conn:
            assert conn.info.port == pair.standby.port
            rows = conn.execute("SELECT x FROM t").fetchall()
            conn.execute("INSERT INTO t VALUES (2)")
        assert rows == [(1,)]


def test_replicas_is_refused_where_wait_cannot_keep_its_promise() -> None:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

    from without_durability.errors import InvalidInput
    from without_durability_redis import RedisCheckpointer

    with pytest.raises(InvalidInput, match="replicas must be an int >= 0"):
        RedisCheckpointer(Redis(), replicas=-1)
    with pytest.raises(InvalidInput, match="replica_timeout must be a timedelta"):
        RedisCheckpointer(Redis(), replicas=1, replica_timeout=timedelta(0))
    cluster = RedisCluster.__new__(RedisCluster)  # the type is what is judged; nothing connects
    with pytest.raises(InvalidInput, match="WAIT is per connection"):
        RedisCheckpointer(cluster, replicas=1)
