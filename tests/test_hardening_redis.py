"""The Redis store says out loud whether an acknowledged write survives a crash of the server: it
reads the server's persistence settings when it first reaches it, exposes them as
``RedisCheckpointer.persistence`` and logs a warning when ``durable`` is not True. Each test starts
its own private redis-server, configured the way it names."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta

import pytest

from without_durability.testing import servers
from without_durability_redis.local_server import local_redis

redis = pytest.importorskip("redis.asyncio")
from without_durability_redis import RedisCheckpointer  # noqa: E402

pytestmark = pytest.mark.asyncio
LOGGER = "without_durability_redis"


@contextmanager
def private_redis(*, fsync_always: bool = False) -> Iterator[servers.Server]:
    try:
        servers.find_binary("redis-server")
    except servers.ServerUnavailable as exc:
        pytest.fail(f"needs a private redis-server (bash scripts/install-servers installs it): {exc}")
    with local_redis(fsync_always=fsync_always) as server:
        yield server


@asynccontextmanager
async def checkpointer(url: str, **options: object) -> AsyncIterator[RedisCheckpointer]:
    client = redis.Redis.from_url(url, **options)
    try:
        yield RedisCheckpointer(client, prefix="persist:")
    finally:
        await client.aclose()


async def test_no_persistence_is_reported_and_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with private_redis() as server:
        async with checkpointer(server.url) as cp:
            assert cp.persistence is None, "nothing was read before the server was reached"
            await cp.supply("w", "k", 1)
            await cp.claim("w", alive=timedelta(seconds=5), budget=timedelta(seconds=5))
            assert cp.persistence is not None and cp.persistence.durable is False, cp.persistence
            assert cp.persistence.appendonly == "no", cp.persistence
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1, f"expected one warning, got {[r.getMessage() for r in warnings]}"
    assert "may not survive" in warnings[0].getMessage() and "appendfsync always" in warnings[0].getMessage()


async def test_rdb_snapshots_and_everysec_are_not_durable(caplog: pytest.LogCaptureFixture) -> None:
    with private_redis() as server:
        admin = redis.Redis.from_url(server.url)
        try:
            await admin.config_set("save", "3600 1 300 100 60 10000")  # Redis's own default
            async with checkpointer(server.url) as cp:
                found = await cp.read_persistence()
                assert found.durable is False and "snapshot" in found.detail, found
            await admin.config_set("appendonly", "yes")
            await admin.config_set("appendfsync", "everysec")
            async with checkpointer(server.url) as cp:
                found = await cp.read_persistence()
                assert found.durable is False and "every second" in found.detail, found
        finally:  # back to nothing to write, so the server stops at once
            await admin.config_set("save", "")
            await admin.config_set("appendonly", "no")
            await admin.aclose()


async def test_an_fsync_on_every_write_is_durable_and_silent(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with private_redis(fsync_always=True) as server:
        async with checkpointer(server.url) as cp:
            await cp.load("w")
            assert cp.persistence is not None and cp.persistence.durable is True, cp.persistence
    assert not [r for r in caplog.records if r.name == LOGGER], "warned about a durable server"


async def test_a_server_that_refuses_config_is_unknown_not_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with private_redis() as server:
        admin = redis.Redis.from_url(server.url)
        try:  # a user without CONFIG, as a managed service hands out
            await admin.execute_command("ACL", "SETUSER", "app", "on", ">secret", "~*", "+@all", "-config")
        finally:
            await admin.aclose()
        async with checkpointer(server.url, username="app", password="secret") as cp:
            assert (await cp.supply("w", "k", 1)).won
            assert cp.persistence is not None and cp.persistence.durable is None, cp.persistence
            assert "unknown" in cp.persistence.detail
    assert any("may not survive" in r.getMessage() for r in caplog.records if r.name == LOGGER)
