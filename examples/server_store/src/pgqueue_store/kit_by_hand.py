"""The ``pgqueue`` kit written out from ``StoreKit``, one method per thing the tools ask, from the
building blocks ``PostgresKit`` itself is made of. Write your kit this way when your store is not
built on ``PostgresCheckpointer`` (swap in your own checkpointer and ledger) or your servers are not
the plain Postgres ones."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from without_durability import SplitDurable
from without_durability.testing import RealTestClock, StoreUnderTest
from without_durability.testing.kit import Opened, Spec, StoreKit
from without_durability.testing.servers import Server, provide, why_unavailable
from without_durability_postgres import PostgresCheckpointer, migrate
from without_durability_postgres.kit import (
    CREATE_LEDGER,
    chaos_opened,
    create_chaos_ledger,
    drop_schema,
    fresh_schema,
    open_schema_pool,
    postgres_effects,
)
from without_durability_postgres.local_server import POSTGRES_SERVER

from . import PgQueueScheduler, migrate_queue


class PgQueueKit(StoreKit):
    """PgQueueScheduler beside PostgresCheckpointer, every piece spelled out."""

    # --8<-- [start:declared]
    name = "pgqueue-by-hand"
    description = "PostgresCheckpointer + PgQueueScheduler, the kit written out by hand"
    # which scenarios it can run: processes share one store (workers), its private server can be
    # killed and started again on the same data (restart), it is one TCP address a proxy can stand
    # in for (proxy), and its ledger effect waits inside transact's open transaction (transact-pause)
    provides = frozenset({"workers", "restart", "proxy", "transact-pause"})
    # kits with one server_key share one server per test session: this kit and the built-in
    # postgres kit run their tests on the same server, each test in a schema of its own
    server_key = "postgres"
    # where the server comes from (WD_POSTGRES_URL, a container, the binaries on PATH), for
    # `wd-chaos run --check`; and the program a clock-step run starts under a stepped clock
    recipe = POSTGRES_SERVER
    server_binary = "postgres"
    # --8<-- [end:declared]

    def unavailable(self) -> str | None:
        """Why no Postgres can be had here (no URL, no Docker, no binaries), with what to do."""
        return why_unavailable(POSTGRES_SERVER)

    # --8<-- [start:server]
    def server(
        self,
        *,
        restartable: bool = False,
        env: dict[str, str] | None = None,
        datadir: Path | None = None,
        relaxed: bool = False,
    ) -> AbstractContextManager[Server]:
        """A server for a session or a run: WD_POSTGRES_URL's, else a container, else a private
        one started from the binaries on PATH and removed on exit. A server the run restarts
        (``restartable``) is never a container; one whose clock it steps (``env``) is private."""
        if env is not None:
            return provide(POSTGRES_SERVER, env=env)
        return provide(POSTGRES_SERVER, private=restartable)

    # --8<-- [end:server]

    # --8<-- [start:open]
    def open(self, server: Server) -> Any:
        """A fresh store for one conformance test: a new schema, dropped on exit."""

        @asynccontextmanager
        async def fresh() -> AsyncIterator[StoreUnderTest[Any]]:
            async with fresh_schema(server.url) as (pool, schema):
                await migrate_queue(pool)
                async with pool.connection() as conn:
                    await conn.execute(CREATE_LEDGER)  # the table the exactly-once tests move
                durable = SplitDurable(PostgresCheckpointer(pool=pool), PgQueueScheduler(pool))
                yield StoreUnderTest(self.name, durable, RealTestClock(), postgres_effects(pool), {"schema": schema})

        return fresh()

    # --8<-- [end:open]

    # --8<-- [start:worker]
    def worker_spec(self, server: Server, run_dir: Path, tag: str) -> Spec:
        """What every process of one run opens the store with: JSON only, it crosses processes.
        The harness adds "store", "namespace" and, once before any worker starts, "prepare"."""
        return {"url": server.url, "schema": tag}

    async def open_worker(self, spec: Spec) -> Opened:
        """Open the run's schema in this process (creating everything when ``spec["prepare"]``)."""
        pool = await open_schema_pool(spec)  # the schema created first when "prepare" says so
        if spec.get("prepare"):
            await migrate(pool)
            await create_chaos_ledger(pool)
            await migrate_queue(pool)
        durable = SplitDurable(PostgresCheckpointer(pool=pool), PgQueueScheduler(pool, queue=spec["namespace"]))
        return chaos_opened(pool, durable, pool.close, url=spec["url"], schema=spec["schema"], sweep=False)

    async def cleanup(self, spec: Spec) -> str | None:
        """After the run: drop its schema, so a run on your own server leaves nothing behind."""
        if await drop_schema(spec["url"], spec["schema"]):
            return f"dropped schema {spec['schema']!r}"
        return f"schema {spec['schema']!r} was not there: nothing to drop"

    # --8<-- [end:worker]


KIT = PgQueueKit()
