"""What the examples share: a store to run on, the stock that lives in it, and stand-ins for the
services outside it (a payment gateway, a hotel, a carrier).

Stock lives in the same store as the workflow's records, so reserving it is a ``transact``: the
store moves the stock and records the result in one commit, written in the store's own language
(SQL over a cursor on SQLite and Postgres, a Lua script on Redis). The services are outside the
store, so they are ``step``s, and each takes an idempotency key: a step runs again if its pass dies
between the call and the record, and the key is what makes the second call harmless.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sqlite3
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from without_durability import Durable, SplitDurable

# -- SQL (SQLite and Postgres; {p} is the driver's placeholder) --------------------------------

CREATE_STOCK = """
CREATE TABLE IF NOT EXISTS shop_stock (
    sku TEXT PRIMARY KEY,
    on_hand INTEGER NOT NULL,
    reserved INTEGER NOT NULL DEFAULT 0
)
"""
CREATE_HOLDS = """
CREATE TABLE IF NOT EXISTS shop_holds (
    workflow TEXT NOT NULL,
    sku TEXT NOT NULL,
    qty INTEGER NOT NULL,
    PRIMARY KEY (workflow, sku)
)
"""
STOCK_IN = "INSERT INTO shop_stock (sku, on_hand) VALUES ({p}, {p}) ON CONFLICT (sku) DO NOTHING"
# One statement decides and moves: it reserves only if enough is free.
RESERVE = """
UPDATE shop_stock SET reserved = reserved + {p}
 WHERE sku = {p} AND on_hand - reserved >= {p}
RETURNING sku
"""
HOLD = """
INSERT INTO shop_holds (workflow, sku, qty) VALUES ({p}, {p}, {p})
ON CONFLICT (workflow, sku) DO UPDATE SET qty = shop_holds.qty + excluded.qty
RETURNING qty
"""
UNRESERVE = "UPDATE shop_stock SET reserved = reserved - {p} WHERE sku = {p}"
UNHOLD = "UPDATE shop_holds SET qty = qty - {p} WHERE workflow = {p} AND sku = {p} RETURNING qty"
HELD = "SELECT qty FROM shop_holds WHERE workflow = {p} AND sku = {p}"

# -- Lua (Redis): KEYS[1] is the order's holds hash, under the workflow's own hash tag ----------

LUA_HOLD = """
return cjson.encode({reserved = true,
                     held = redis.call('HINCRBY', KEYS[1], ARGV[1], tonumber(ARGV[2]))})
"""
LUA_UNHOLD = """
return cjson.encode({held = redis.call('HINCRBY', KEYS[1], ARGV[1], -tonumber(ARGV[2]))})
"""


@dataclass
class Shop:
    """A store, and stock effects in that store's own language."""

    name: str
    durable: Durable[Any]
    reserve: Callable[[str, str, int], Any]
    """``reserve(workflow, sku, qty)``: a transact effect returning ``{"reserved": bool,
    "held": int}`` (what the order now holds of ``sku``)."""
    unreserve: Callable[[str, str, int], Any]
    """``unreserve(workflow, sku, qty)``: a transact effect returning ``{"held": int}``."""
    held: Callable[[str, str], Awaitable[int]]
    """``held(workflow, sku)``: how much the order holds now, read outside any pass."""
    stock_in: Callable[[str, int], Awaitable[None]]
    """``stock_in(sku, qty)``: put ``qty`` on hand if the sku is new."""


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--sqlite", metavar="PATH", help="SQLite file (default: a temporary one)")
    where.add_argument("--postgres", metavar="URL", help="run on Postgres at URL")
    where.add_argument("--redis", metavar="URL", help="run on Redis at URL")
    return parser.parse_args()


@contextlib.asynccontextmanager
async def open_shop(args: argparse.Namespace) -> AsyncIterator[Shop]:
    """The store the command line asks for, with the shop's data created in it."""
    if args.postgres:
        async with _postgres_shop(args.postgres) as shop:
            yield shop
    elif args.redis:
        async with _redis_shop(args.redis) as shop:
            yield shop
    else:
        with contextlib.ExitStack() as stack:
            path = args.sqlite or str(
                Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="wd-example-")))
                / "shop.db"
            )
            async with _sqlite_shop(path) as shop:
                yield shop


@contextlib.asynccontextmanager
async def _sqlite_shop(path: str) -> AsyncIterator[Shop]:
    from without_durability.sqlite import SqliteDurable

    durable = await SqliteDurable.open(path)
    conn = durable.conn

    def create(cur: sqlite3.Cursor) -> None:
        cur.execute(CREATE_STOCK)
        cur.execute(CREATE_HOLDS)

    await conn.write(create)

    def reserve(workflow: str, sku: str, qty: int) -> Callable[[sqlite3.Cursor], object]:
        def effect(cur: sqlite3.Cursor) -> object:
            if cur.execute(RESERVE.format(p="?"), (qty, sku, qty)).fetchone() is None:
                return {"reserved": False, "held": 0}
            held = cur.execute(HOLD.format(p="?"), (workflow, sku, qty)).fetchone()[0]
            return {"reserved": True, "held": held}

        return effect

    def unreserve(workflow: str, sku: str, qty: int) -> Callable[[sqlite3.Cursor], object]:
        def effect(cur: sqlite3.Cursor) -> object:
            cur.execute(UNRESERVE.format(p="?"), (qty, sku))
            return {"held": cur.execute(UNHOLD.format(p="?"), (qty, workflow, sku)).fetchone()[0]}

        return effect

    async def held(workflow: str, sku: str) -> int:
        row = await conn.read(
            lambda cur: cur.execute(HELD.format(p="?"), (workflow, sku)).fetchone()
        )
        return 0 if row is None else int(row[0])

    async def stock_in(sku: str, qty: int) -> None:
        await conn.write(lambda cur: cur.execute(STOCK_IN.format(p="?"), (sku, qty)))

    try:
        yield Shop(f"SQLite ({path})", durable, reserve, unreserve, held, stock_in)
    finally:
        await durable.close()


@contextlib.asynccontextmanager
async def _postgres_shop(url: str) -> AsyncIterator[Shop]:
    try:
        from without_durability_postgres import (  # type: ignore[import-not-found,unused-ignore]
            PostgresCheckpointer,
            PostgresDurable,
            PostgresScheduler,
            migrate,
        )
    except ImportError as exc:
        raise SystemExit(
            f"--postgres needs the Postgres store and psycopg ({exc}); "
            "pip install 'without-durability[postgres]'"
        ) from exc
    from psycopg_pool import AsyncConnectionPool  # installed with the Postgres store

    pool: Any = AsyncConnectionPool(url, open=False)
    await pool.open(wait=True)
    try:
        await migrate(pool)
        async with pool.connection() as conn:
            await conn.execute(CREATE_STOCK)
            await conn.execute(CREATE_HOLDS)
        durable = PostgresDurable(PostgresCheckpointer(pool=pool), PostgresScheduler(pool=pool))

        def reserve(workflow: str, sku: str, qty: int) -> Callable[[Any], Awaitable[object]]:
            async def effect(cur: Any) -> object:
                await cur.execute(RESERVE.format(p="%s"), (qty, sku, qty))
                if await cur.fetchone() is None:
                    return {"reserved": False, "held": 0}
                await cur.execute(HOLD.format(p="%s"), (workflow, sku, qty))
                return {"reserved": True, "held": (await cur.fetchone())[0]}

            return effect

        def unreserve(workflow: str, sku: str, qty: int) -> Callable[[Any], Awaitable[object]]:
            async def effect(cur: Any) -> object:
                await cur.execute(UNRESERVE.format(p="%s"), (qty, sku))
                await cur.execute(UNHOLD.format(p="%s"), (qty, workflow, sku))
                return {"held": (await cur.fetchone())[0]}

            return effect

        async def held(workflow: str, sku: str) -> int:
            async with pool.connection() as conn:
                row = await (await conn.execute(HELD.format(p="%s"), (workflow, sku))).fetchone()
            return 0 if row is None else int(row[0])

        async def stock_in(sku: str, qty: int) -> None:
            async with pool.connection() as conn:
                await conn.execute(STOCK_IN.format(p="%s"), (sku, qty))

        yield Shop(f"Postgres ({url})", durable, reserve, unreserve, held, stock_in)
    finally:
        await pool.close()


@contextlib.asynccontextmanager
async def _redis_shop(url: str) -> AsyncIterator[Shop]:
    try:
        from without_durability_redis import (  # type: ignore[import-not-found,unused-ignore]
            LuaEffect,
            RedisCheckpointer,
            RedisSetScheduler,
        )
    except ImportError as exc:
        raise SystemExit(
            f"--redis needs the Redis store and redis-py ({exc}); "
            "pip install 'without-durability[redis]'"
        ) from exc
    from redis.asyncio import Redis  # installed with the Redis store

    client: Any = Redis.from_url(url)
    checkpointer = RedisCheckpointer(client, prefix="wd-example:")
    durable: SplitDurable[Any] = SplitDurable(
        checkpointer, RedisSetScheduler(client, prefix="wd-example:")
    )

    # One script cannot commit across two Redis Cluster slots, so an effect may only touch keys
    # under its workflow's own hash tag: the order's holds live there, and a stock count shared by
    # every order cannot be in the same commit (on SQL stores it is).
    def holds_key(workflow: str) -> str:
        return f"{checkpointer.hash_key(workflow)}:holds"

    def reserve(workflow: str, sku: str, qty: int) -> Any:
        return LuaEffect(LUA_HOLD, (holds_key(workflow),), (sku, qty))

    def unreserve(workflow: str, sku: str, qty: int) -> Any:
        return LuaEffect(LUA_UNHOLD, (holds_key(workflow),), (sku, qty))

    async def held(workflow: str, sku: str) -> int:
        value = await client.hget(holds_key(workflow), sku)
        return 0 if value is None else int(value)

    async def stock_in(sku: str, qty: int) -> None:
        del sku, qty  # no shared count on Redis (see above)

    try:
        yield Shop(f"Redis ({url})", durable, reserve, unreserve, held, stock_in)
    finally:
        await client.aclose()


@dataclass
class Service:
    """A service outside the store that honours idempotency keys, like a payment API does: a
    repeated call with a key it has seen returns the first answer and does nothing new."""

    name: str
    fail_with: str | None = None
    calls: int = 0
    done: dict[str, dict[str, Any]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def call(self, idempotency_key: str, **request: Any) -> dict[str, Any]:
        self.calls += 1
        if idempotency_key not in self.done:
            if self.fail_with:
                raise ServiceDeclined(f"{self.name}: {self.fail_with}")
            self.done[idempotency_key] = {"id": f"{self.name}_{next(self._ids)}", **request}
        return self.done[idempotency_key]

    @property
    def performed(self) -> int:
        """How many distinct requests this service actually carried out."""
        return len(self.done)


class ServiceDeclined(Exception):
    """A service said no (a declined card, a full hotel): an ordinary failure a saga compensates."""


def as_dict(value: object) -> dict[str, Any]:
    """Parse a recorded value that must be a JSON object."""
    if not isinstance(value, dict):
        raise TypeError(f"expected a JSON object, got {value!r}")
    return value
