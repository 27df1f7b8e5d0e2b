"""The Postgres store's factory: a fresh schema per test on a real server, a pool whose
connections live in that schema, and ledger effects over a table in it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from ..._values import Pass
from .. import servers
from ..harness import EffectFailed, EffectKit, RealTestClock, StoreFactory, StoreUnderTest, register

if TYPE_CHECKING:
    from psycopg import AsyncCursor
    from psycopg_pool import AsyncConnectionPool

    from without_durability_postgres import PostgresEffect

# The ledger the exactly-once tests move: application data in the same database as the records.
CREATE_LEDGER = "CREATE TABLE wd_ledger (name text PRIMARY KEY, total bigint NOT NULL)"
LEDGER_ADD = """
INSERT INTO wd_ledger AS l (name, total) VALUES (%(name)s, %(amount)s)
ON CONFLICT (name) DO UPDATE SET total = l.total + EXCLUDED.total
RETURNING total
"""
LEDGER_READ = "SELECT total FROM wd_ledger WHERE name = %(name)s"

# A newer claim, committed from another connection while the effect's transaction is still open:
# the token goes up and the claim lapses, as a discard (or a takeover after a lapse) would do.
SUPERSEDE = """
UPDATE workflow_claim
   SET token = token + 1, held_until = LEAST(held_until, now()),
       alive_until = LEAST(alive_until, now())
 WHERE workflow = %(workflow)s
"""


def unavailable() -> str | None:
    """Why the Postgres store cannot run here, or None."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        return f"psycopg is not installed ({exc}); pip install 'without-durability[postgres]'"
    return servers.why_unavailable("postgres")


def postgres_effects(pool: AsyncConnectionPool[Any]) -> EffectKit[PostgresEffect]:
    """Ledger effects over ``wd_ledger`` in the pool's schema."""

    def ledger_add(name: str, amount: int) -> PostgresEffect:
        async def effect(cursor: AsyncCursor[Any]) -> object:
            await cursor.execute(LEDGER_ADD, {"name": name, "amount": amount})
            row = await cursor.fetchone()
            assert row is not None
            return int(row[0])

        return effect

    async def ledger_read(name: str) -> int:
        async with pool.connection() as conn:
            row = await (await conn.execute(LEDGER_READ, {"name": name})).fetchone()
        return 0 if row is None else int(row[0])

    def superseding(pass_: Pass, inner: PostgresEffect) -> PostgresEffect:
        async def effect(cursor: AsyncCursor[Any]) -> object:
            result = await inner(cursor)
            # Another pooled connection commits the newer claim while this transaction is open.
            async with pool.connection() as other:
                await other.execute(SUPERSEDE, {"workflow": pass_.workflow})
            return result

        return effect

    def failing(inner: PostgresEffect) -> PostgresEffect:
        async def effect(cursor: AsyncCursor[Any]) -> object:
            await inner(cursor)
            raise EffectFailed("effect failed after performing its write")

        return effect

    return EffectKit(ledger_add, ledger_read, superseding, failing)


@asynccontextmanager
async def fresh_schema(
    url: str, *, min_size: int = 1, max_size: int = 20
) -> AsyncIterator[tuple[AsyncConnectionPool[Any], str]]:
    """A new, migrated schema with a unique name and an open pool whose connections use it (via
    search_path); the schema is dropped afterwards. ``min_size`` connections are open before it
    yields, so that many callers really run in parallel."""
    import psycopg
    from psycopg_pool import AsyncConnectionPool

    from without_durability_postgres import migrate

    schema = f"wd_test_{uuid.uuid4().hex[:16]}"
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        await admin.execute(f'CREATE SCHEMA "{schema}"')  # a name generated here
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        url,
        min_size=min_size,
        max_size=max(min_size, max_size),
        open=False,
        kwargs={"options": f"-c search_path={schema}"},
    )
    try:
        await pool.open(wait=True)
        await migrate(pool)
        yield pool, schema
    finally:
        await pool.close()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@asynccontextmanager
async def open_postgres(server: servers.Server) -> AsyncIterator[StoreUnderTest[PostgresEffect]]:
    """A fresh Postgres store in its own schema on the session's server."""
    from without_durability_postgres import PostgresCheckpointer, PostgresDurable, PostgresScheduler

    async with fresh_schema(server.url) as (pool, schema):
        async with pool.connection() as conn:
            await conn.execute(CREATE_LEDGER)
        durable = PostgresDurable(PostgresCheckpointer(pool=pool), PostgresScheduler(pool=pool))
        yield StoreUnderTest(
            "postgres",
            durable,
            RealTestClock(),
            postgres_effects(pool),
            extra={"pool": pool, "schema": schema, "url": server.url, "server": server},
        )


POSTGRES = register(
    StoreFactory(
        "postgres",
        open_postgres,
        server=lambda: servers.provide("postgres"),
        unavailable=unavailable,
        description="PostgreSQL via psycopg 3 (a real server)",
    )
)
