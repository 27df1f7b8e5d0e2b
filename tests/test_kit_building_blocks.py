"""The public building blocks a kit over Postgres or Redis is made of, on real servers: the driver
errors classified as the stores classify them, a worker opened with a scheduler of the author's
choice, and the cleanup that removes what a run created on a user's server."""

from __future__ import annotations

import contextlib
import socket
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from without_durability.errors import InvalidInput, InvalidValue, StoreError, StoreUnavailable

LONG = timedelta(seconds=30)


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- Postgres: errors ------------------------------------------------------------------------------


@pytest.mark.wd_store(["postgres"])
async def test_postgres_classify_tells_unreachable_from_refused_from_failed(wd_factory: Any) -> None:
    import psycopg

    from without_durability_postgres.errors import boundary, classify

    _, server = wd_factory
    with pytest.raises(psycopg.OperationalError) as down:
        await psycopg.AsyncConnection.connect(f"postgresql://postgres@127.0.0.1:{_closed_port()}/x", connect_timeout=2)
    unavailable = classify(down.value, "take from my_queue")
    assert isinstance(unavailable, StoreUnavailable), f"expected StoreUnavailable, got {unavailable!r}"
    assert "take from my_queue" in str(unavailable), unavailable

    async with await psycopg.AsyncConnection.connect(server.url, autocommit=True) as conn:
        # the server reached, the input refused: not unavailable, and the workflow and key named
        with pytest.raises(InvalidValue) as refused, boundary("record", workflow="wf-1", key="k"):
            await conn.execute("SELECT %s::jsonb", ("{not json",))
        assert "wf-1" in str(refused.value) and "'k'" in str(refused.value), refused.value
        assert isinstance(refused.value.__cause__, psycopg.Error), "the driver's error must stay as __cause__"
        # a cancelled statement was rolled back, the server is up: StoreError, never unavailable
        await conn.execute("SET statement_timeout = '50ms'")
        with pytest.raises(StoreError) as cancelled, boundary("a slow take"):
            await conn.execute("SELECT pg_sleep(2)")
        assert not isinstance(cancelled.value, StoreUnavailable), cancelled.value
        await conn.execute("SET statement_timeout = 0")
        with pytest.raises(StoreError) as failed, boundary("select from nowhere"):
            await conn.execute("SELECT * FROM no_such_table_here")
        assert type(failed.value) is StoreError, failed.value
        # an error of the caller's own passes through untouched
        with pytest.raises(KeyError), boundary("anything"):
            raise KeyError("mine")
    with pytest.raises(TypeError):
        classify(ValueError("not the driver's"), "x")  # type: ignore[arg-type]


# -- Postgres: a worker with the author's scheduler, and cleanup ----------------------------------


class CountingScheduler:
    """Stands for an author's scheduler (our PostgresScheduler in another namespace, wrapped), so
    the test can tell the durable holds the scheduler the opener yielded."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.wd_store(["postgres"])
async def test_a_postgres_worker_opens_with_the_authors_scheduler_and_cleanup_drops_its_schema(
    wd_factory: Any, tmp_path: Path
) -> None:
    import psycopg

    from without_durability.durable import SplitDurable
    from without_durability_postgres import PostgresCheckpointer, PostgresScheduler
    from without_durability_postgres.kit import PostgresKit, WorkerStore

    _, server = wd_factory
    seen: list[tuple[str, bool, str]] = []

    @contextlib.asynccontextmanager
    async def my_scheduler(store: WorkerStore) -> AsyncIterator[Any]:
        seen.append(("enter", store.prepare, store.schema))
        if store.prepare:  # the author's own table, in the run's schema
            async with store.pool.connection() as conn:
                await conn.execute("CREATE TABLE IF NOT EXISTS my_queue_marker (x int)")
        yield CountingScheduler(PostgresScheduler(pool=store.pool, namespace=f"mine-{store.namespace}"))
        seen.append(("exit", store.prepare, store.schema))

    kit = PostgresKit("my-queue", scheduler=my_scheduler)
    assert kit.server_key == "postgres" and kit.mutant_modules == () and kit.mutate_plan is None, kit
    assert "workers" in kit.provides and "failover" not in kit.provides, kit.provides
    spec = {"store": kit.name, "namespace": "chaos", **kit.worker_spec(server, tmp_path, f"chaos_{uuid.uuid4().hex[:8]}")}
    schema = spec["schema"]

    prepared = await kit.open_worker({**spec, "prepare": True})
    await prepared.close()
    opened = await kit.open_worker(spec)
    try:
        durable = opened.durable
        assert isinstance(durable, SplitDurable), durable
        assert isinstance(durable.checkpointer, PostgresCheckpointer)
        assert isinstance(durable.scheduler, CountingScheduler), durable.scheduler
        assert opened.sweep is None, "the sweep reads our queue table: not offered beside another scheduler"
        await durable.scheduler.schedule("wf-a")
        delivery = await durable.scheduler.take(LONG)
        assert delivery is not None and delivery.workflow == "wf-a", delivery
        held = await durable.checkpointer.claim("wf-a", alive=LONG, budget=LONG)
        recorded = await durable.checkpointer.transact(held, "t1", opened.ledger_effect("wf-a", "t1", held.token, lambda: None))
        assert recorded.won, recorded
        rows = await opened.read_ledger(["wf-a"])
        assert [(r["workflow"], r["key"], r["token"]) for r in rows] == [("wf-a", "t1", held.token)], rows
    finally:
        await opened.close()
    assert seen == [("enter", True, schema), ("exit", True, schema), ("enter", False, schema), ("exit", False, schema)], seen

    async def schema_exists() -> bool:
        async with await psycopg.AsyncConnection.connect(server.url) as conn:
            row = await (await conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))).fetchone()
        return row is not None

    assert await schema_exists(), "the run's schema should exist before cleanup"
    said = await kit.cleanup(spec)
    assert said is not None and "dropped" in said and schema in said, said
    assert not await schema_exists(), f"cleanup said {said!r} but schema {schema} is still there"
    again = await kit.cleanup(spec)
    assert again is not None and "nothing to drop" in again, again


@pytest.mark.wd_store(["postgres"])
async def test_drop_schema_refuses_a_schema_no_run_made(wd_factory: Any) -> None:
    from without_durability_postgres.kit import drop_schema

    _, server = wd_factory
    for name in ("public", "pg_catalog", "information_schema"):
        with pytest.raises(InvalidInput):
            await drop_schema(server.url, name)


@pytest.mark.wd_store(["postgres"])
async def test_the_authors_kit_opens_a_fresh_schema_per_conformance_test(wd_factory: Any) -> None:
    from without_durability_postgres import PostgresScheduler
    from without_durability_postgres.kit import PostgresKit, WorkerStore

    _, server = wd_factory
    prepared: list[bool] = []

    @contextlib.asynccontextmanager
    async def my_scheduler(store: WorkerStore) -> AsyncIterator[Any]:
        prepared.append(store.prepare)
        yield PostgresScheduler(pool=store.pool, namespace=store.namespace)

    kit = PostgresKit("my-queue", scheduler=my_scheduler)
    async with kit.open(server) as first, kit.open(server) as second:
        assert first.name == "my-queue", first.name
        assert first.extra["schema"] != second.extra["schema"], "each test needs a schema of its own"
        await first.scheduler.schedule("wf")
        assert await second.scheduler.take(LONG) is None, "two tests' stores share a queue"
        assert (await first.scheduler.take(LONG)) is not None
    assert prepared == [True, True], prepared


# -- Redis: errors and cleanup ---------------------------------------------------------------------


@pytest.mark.wd_store(["redis-set"])
async def test_redis_classify_tells_unreachable_from_failed(wd_factory: Any) -> None:
    import redis.exceptions
    from redis.asyncio import Redis

    from without_durability_redis.errors import boundary, classify

    _, server = wd_factory
    down = Redis(host="127.0.0.1", port=_closed_port(), socket_connect_timeout=2)
    try:
        with pytest.raises(StoreUnavailable) as unreachable, boundary(down, "take from my_queue"):
            await down.zpopmin("q")
        assert "take from my_queue" in str(unreachable.value), unreachable.value
        assert isinstance(unreachable.value.__cause__, redis.exceptions.ConnectionError), unreachable.value.__cause__
    finally:
        await down.aclose()
    client = Redis.from_url(server.url)
    key = f"wdtest-{uuid.uuid4().hex[:8]}:str"
    try:
        await client.set(key, "x")
        with pytest.raises(StoreError) as wrong, boundary(client, "pop"):
            await client.zpopmin(key)  # WRONGTYPE: the server answered and refused
        assert not isinstance(wrong.value, StoreUnavailable), wrong.value
        assert isinstance(classify(redis.exceptions.TimeoutError("slow"), "x"), StoreUnavailable)
        with pytest.raises(TypeError):
            classify(ValueError("not the driver's"), "x")
    finally:
        await client.delete(key)
        await client.aclose()


@pytest.mark.wd_store(["redis-set"])
async def test_redis_cleanup_deletes_the_runs_keys_and_nothing_else(wd_factory: Any, tmp_path: Path) -> None:
    from redis.asyncio import Redis

    from without_durability.testing.kit import find_kit

    _, server = wd_factory
    kit = find_kit("redis-set")
    spec = {"store": kit.name, "namespace": "chaos", **kit.worker_spec(server, tmp_path, f"chaos_{uuid.uuid4().hex[:8]}")}
    opened = await kit.open_worker({**spec, "prepare": True})
    client = Redis.from_url(server.url)
    # a neighbour whose name starts like the run's prefix but is not under it
    neighbour = spec["prefix"].rstrip(":") + "x:keep"
    try:
        await client.set(neighbour, "keep")
        for i in range(3):
            await opened.durable.arrive(f"wf-{i}", "k", i)
        assert [k async for k in client.scan_iter(match=spec["prefix"] + "*")], "the run wrote nothing"
        said = await kit.cleanup(spec)
        assert said is not None and "deleted" in said, said
        left = [k async for k in client.scan_iter(match=spec["prefix"] + "*")]
        assert left == [], f"cleanup said {said!r}, and left {left}"
        assert await client.get(neighbour) == b"keep", "cleanup deleted a key outside the run's prefix"
        with pytest.raises(ValueError):
            await kit.cleanup({**spec, "prefix": ""})
    finally:
        await opened.close()
        await client.delete(neighbour)
        await client.aclose()


# -- a run removes what it created on a user's server, or says why it kept it ---------------------


@pytest.mark.wd_store(["postgres"])
def test_a_runs_cleanup_drops_its_schema_on_a_users_server_and_says_why_when_it_keeps_it(
    wd_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    import dataclasses

    import psycopg

    from wd_chaos.control.services import KEEP_STORE_ENV, Services, clean_up
    from without_durability.testing.kit import find_kit

    _, server = wd_factory
    users = dataclasses.replace(server, source="env")  # as a server named by WD_POSTGRES_URL is
    kit = find_kit("postgres")

    def prepared() -> Services:
        spec = {"store": "postgres", "namespace": "chaos", **kit.worker_spec(users, tmp_path, f"chaos_{uuid.uuid4().hex[:8]}")}

        async def prepare() -> None:
            opened = await kit.open_worker({**spec, "prepare": True})
            await opened.close()

        asyncio.run(prepare())
        return Services(spec, users)

    def exists(schema: str) -> bool:
        with psycopg.connect(server.url) as conn:
            return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is not None

    svc = prepared()
    schema = svc.spec["schema"]
    monkeypatch.setenv(KEEP_STORE_ENV, "1")
    kept = clean_up(svc)
    assert [(e["namespace"], e["outcome"]) for e in kept] == [(schema, "kept")], kept
    assert KEEP_STORE_ENV in kept[0]["detail"] and exists(schema), kept
    monkeypatch.delenv(KEEP_STORE_ENV)
    removed = clean_up(svc)
    assert [(e["namespace"], e["outcome"]) for e in removed] == [(schema, "removed")], removed
    assert not exists(schema), f"clean_up said {removed} and schema {schema} is still there"

    # a server that is gone: the verdict stands, the schema is named as kept, with the error
    gone = Services({**svc.spec, "url": f"postgresql://postgres@127.0.0.1:{_closed_port()}/postgres"}, users)
    failed = clean_up(gone)
    assert failed[0]["outcome"] == "kept" and "removing it failed" in failed[0]["detail"], failed
    # a private server goes with the run: nothing is sent to it
    private = clean_up(Services(svc.spec, dataclasses.replace(server, source="local")))
    assert private[0]["outcome"] == "nothing" and "private" in private[0]["detail"], private
