"""What the examples share: a store to run on, the stock table that lives in it, and stand-ins for
the services outside it (a payment gateway, a hotel, a carrier).

The stock table is in the same database as the workflow's records, so reserving stock is a
``transact``: the store performs it and records its result in one commit. The services are outside
the store, so they are ``step``s, and each takes an idempotency key: a step runs again if its pass
dies between the call and the record, and the key is what makes the second call harmless.
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

from without_durability import Durable

CREATE_STOCK = """
CREATE TABLE IF NOT EXISTS shop_stock (
    sku TEXT PRIMARY KEY,
    on_hand INTEGER NOT NULL,
    reserved INTEGER NOT NULL DEFAULT 0
)
"""
SEED_STOCK = "INSERT INTO shop_stock (sku, on_hand) VALUES ({p}, {p}) ON CONFLICT (sku) DO NOTHING"
# One statement decides and moves: it reserves only if enough is free, and says what is left.
RESERVE = """
UPDATE shop_stock SET reserved = reserved + {p}
 WHERE sku = {p} AND on_hand - reserved >= {p}
RETURNING on_hand - reserved
"""
UNRESERVE = "UPDATE shop_stock SET reserved = reserved - {p} WHERE sku = {p} RETURNING reserved"
READ_STOCK = "SELECT on_hand, reserved FROM shop_stock WHERE sku = {p}"


@dataclass
class Shop:
    """A store, and stock effects in that store's own language."""

    name: str
    durable: Durable[Any]
    reserve: Callable[[str, int], Any]
    """``reserve(sku, qty)``: a transact effect returning ``{"reserved": bool, "left": int}``."""
    unreserve: Callable[[str, int], Any]
    """``unreserve(sku, qty)``: a transact effect returning ``{"reserved": int}``."""
    stock: Callable[[str], Awaitable[dict[str, int]]]
    """``stock(sku)``: what the table holds now, read outside any pass."""
    stock_in: Callable[[str, int], Awaitable[None]]
    """``stock_in(sku, qty)``: put ``qty`` on hand if the sku is new."""


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--sqlite", metavar="PATH", help="SQLite file (default: a temporary one)")
    where.add_argument("--postgres", metavar="URL", help="run on Postgres at URL")
    return parser.parse_args()


@contextlib.asynccontextmanager
async def open_shop(args: argparse.Namespace) -> AsyncIterator[Shop]:
    """The store the command line asks for, with the stock table created in it."""
    if args.postgres:
        async with _postgres_shop(args.postgres) as shop:
            yield shop
        return
    with contextlib.ExitStack() as stack:
        path = args.sqlite or str(
            Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="wd-example-"))) / "shop.db"
        )
        async with _sqlite_shop(path) as shop:
            yield shop


@contextlib.asynccontextmanager
async def _sqlite_shop(path: str) -> AsyncIterator[Shop]:
    from without_durability.sqlite import SqliteDurable

    durable = await SqliteDurable.open(path)
    conn = durable.conn
    await conn.write(lambda cur: cur.execute(CREATE_STOCK))

    def reserve(sku: str, qty: int) -> Callable[[sqlite3.Cursor], object]:
        def effect(cur: sqlite3.Cursor) -> object:
            row = cur.execute(RESERVE.format(p="?"), (qty, sku, qty)).fetchone()
            return {"reserved": row is not None, "left": row[0] if row else 0}

        return effect

    def unreserve(sku: str, qty: int) -> Callable[[sqlite3.Cursor], object]:
        def effect(cur: sqlite3.Cursor) -> object:
            return {"reserved": cur.execute(UNRESERVE.format(p="?"), (qty, sku)).fetchone()[0]}

        return effect

    async def stock(sku: str) -> dict[str, int]:
        row = await conn.read(lambda cur: cur.execute(READ_STOCK.format(p="?"), (sku,)).fetchone())
        return {"on_hand": row[0], "reserved": row[1]}

    async def stock_in(sku: str, qty: int) -> None:
        await conn.write(lambda cur: cur.execute(SEED_STOCK.format(p="?"), (sku, qty)))

    try:
        yield Shop(f"SQLite ({path})", durable, reserve, unreserve, stock, stock_in)
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
        durable = PostgresDurable(PostgresCheckpointer(pool=pool), PostgresScheduler(pool=pool))

        def reserve(sku: str, qty: int) -> Callable[[Any], Awaitable[object]]:
            async def effect(cur: Any) -> object:
                await cur.execute(RESERVE.format(p="%s"), (qty, sku, qty))
                row = await cur.fetchone()
                return {"reserved": row is not None, "left": row[0] if row else 0}

            return effect

        def unreserve(sku: str, qty: int) -> Callable[[Any], Awaitable[object]]:
            async def effect(cur: Any) -> object:
                await cur.execute(UNRESERVE.format(p="%s"), (qty, sku))
                return {"reserved": (await cur.fetchone())[0]}

            return effect

        async def stock(sku: str) -> dict[str, int]:
            async with pool.connection() as conn:
                cur = await conn.execute(READ_STOCK.format(p="%s"), (sku,))
                row = await cur.fetchone()
            return {"on_hand": row[0], "reserved": row[1]}

        async def stock_in(sku: str, qty: int) -> None:
            async with pool.connection() as conn:
                await conn.execute(SEED_STOCK.format(p="%s"), (sku, qty))

        yield Shop(f"Postgres ({url})", durable, reserve, unreserve, stock, stock_in)
    finally:
        await pool.close()


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
