"""Open a store's Durable from a store spec, in any process of a run (workers, writers, the
controller), and the in-store ledger that ``transact`` effects move.

A spec is a small JSON-ready dict so it can be handed to worker processes on their command line:
``kind`` (sqlite, postgres, redis), where the store is (``path`` or ``url``), a per-run namespace
(a Postgres schema, a Redis key prefix) and optionally ``checkpointer_class`` (``module:Class``):
a class built with the same arguments as the store's own checkpointer and used in its place. That
is the hook for deliberately broken stores: a subclass with one guarantee removed.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

Spec = dict[str, Any]
LEDGER = "chaos_ledger"
WALL_OFFSET = "wall-offset"
"""The file in a run's directory holding the seconds a ``wall-step`` fault has moved the wall clock
of a process-clock store; absent until the first step."""


def stepped_clock(path: str) -> Any:
    """The system clock plus the offset ``path`` holds (0 while it does not exist): the wall clock a
    ``wall-step`` fault moves in every process at once."""
    from datetime import timedelta
    from pathlib import Path

    from without_durability.clock import system_clock

    offset_file = Path(path)

    def clock() -> Any:
        try:
            offset = float(offset_file.read_text())
        except (FileNotFoundError, ValueError):
            offset = 0.0
        return system_clock() + timedelta(seconds=offset)

    return clock


def load_class(path: str) -> Any:
    """``module:Name`` to the object it names, or a ValueError saying what was expected."""
    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"expected module:Class, got {path!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {path!r}: {exc}") from exc


@dataclass
class Opened:
    """A Durable on a store plus what the harness needs around it."""

    durable: Any
    close: Callable[[], Awaitable[None]]
    ledger_effect: Callable[[str, str, int, Callable[[], None]], Any]
    """``(workflow, key, token, failpoint) -> Effect`` moving the ledger once for this key."""
    read_ledger: Callable[[list[str]], Awaitable[list[dict[str, Any]]]]
    """Every ledger row of the given workflows: workflow, key, token, row."""
    pause: Callable[[str, int], Awaitable[None]] | None = None
    """Set by a worker: awaited inside an async (Postgres) ledger effect after its row is written,
    with the transaction open, as ``pause(workflow, token)``; where a stall can land mid-transact."""


async def open_store(spec: Spec) -> Opened:
    """Open the store ``spec`` names (and, with ``mutant``, break it the way that catalogue entry
    says; a generated mutant in ``WD_MUTANT_EDIT`` is put in place in this process first)."""
    from .mutate.patch import apply_from_env

    apply_from_env()
    kind = spec["kind"]
    if kind == "sqlite":
        opened = await _sqlite(spec)
    elif kind == "postgres":
        opened = await _postgres(spec)
    elif kind == "redis":
        opened = await _redis(spec)
    else:
        raise ValueError(f"unknown store kind {kind!r}; expected sqlite, postgres or redis")
    if spec.get("mutant"):
        opened.durable = find_mutant(str(spec["mutant"]), kind).wrap(opened.durable)
    return opened


def find_mutant(name: str, store: str) -> Any:
    """The catalogue entry ``name`` (``wd_chaos.mutants``, plus the modules ``WD_MUTANT_MODULES``
    names), checked to derive from ``store`` (a kind: ``redis`` takes ``redis-set`` mutants)."""
    from .mutants import catalogue, modules_from_env

    found = {m.name: m for m in catalogue(modules_from_env())}
    if name not in found:
        raise ValueError(f"no mutant {name!r}; the catalogue has {sorted(found)}")
    mutant = found[name]
    if mutant.kind != store:
        raise ValueError(f"mutant {name!r} breaks the {mutant.store} store, not {store}")
    return mutant


def store_clocks(spec: Spec, checkpointer: Any) -> dict[str, str]:
    """Which clocks the store's decisions ran on, as the checkers need them. ``store_clock``: whose
    wall clock stamps records and times the queue, ``"local"`` (this machine's: a process-clock
    store, or a server on loopback) or ``"remote"`` (a server elsewhere, whose clock the history
    cannot see). ``lease_clock``: ``"monotonic"`` (a process-clock store on the machine's monotonic
    clock) or ``"wall"`` (that store clock)."""
    from urllib.parse import urlparse

    from without_durability.clock import monotonic_micros

    host = urlparse(str(spec.get("url", ""))).hostname
    local = spec["kind"] == "sqlite" or host in ("127.0.0.1", "localhost", "::1")
    monotonic = getattr(checkpointer, "lease_clock", None) is monotonic_micros
    return {
        "store_clock": "local" if local else "remote",
        "lease_clock": "monotonic" if monotonic else "wall",
    }


async def prepare(spec: Spec) -> None:
    """Create what a run needs in the store before any worker starts (schema, ledger)."""
    opened = await open_store({**spec, "prepare": True})
    await opened.close()


# -- SQLite ---------------------------------------------------------------------------------------


async def _sqlite(spec: Spec) -> Opened:
    import sqlite3

    from without_durability.clock import monotonic_micros, system_clock
    from without_durability.sqlite import (
        SqliteCheckpointer,
        SqliteDurable,
        SqliteScheduler,
        sqlite_connect,
    )

    conn = await sqlite_connect(spec["path"])
    cls = load_class(spec["checkpointer_class"]) if spec.get("checkpointer_class") else (SqliteCheckpointer)
    # the wall clock a wall-step fault moves; claim deadlines stay on the monotonic clock, as the
    # store's own default puts them
    clock = stepped_clock(spec["wall_offset"]) if spec.get("wall_offset") else system_clock
    durable = SqliteDurable(
        cls(conn, clock=clock, lease_clock=monotonic_micros),
        SqliteScheduler(conn, clock=clock, namespace=spec.get("namespace", "default")),
    )
    if spec.get("prepare"):
        await conn.write(
            lambda cur: cur.execute(
                f"CREATE TABLE IF NOT EXISTS {LEDGER} (row INTEGER PRIMARY KEY, "
                "workflow TEXT NOT NULL, key TEXT NOT NULL, token INTEGER NOT NULL)"
            )
        )

    def ledger_effect(
        workflow: str, key: str, token: int, failpoint: Callable[[], None]
    ) -> Callable[[sqlite3.Cursor], object]:
        def effect(cur: sqlite3.Cursor) -> object:
            cur.execute(
                f"INSERT INTO {LEDGER} (workflow, key, token) VALUES (?, ?, ?)",
                (workflow, key, token),
            )
            row = cur.lastrowid
            failpoint()  # a kill here dies with the transaction open: the row must roll back
            return {"row": row, "token": token}

        return effect

    async def read_ledger(workflows: list[str]) -> list[dict[str, Any]]:
        def job(cur: sqlite3.Cursor) -> list[dict[str, Any]]:
            rows = cur.execute(f"SELECT row, workflow, key, token FROM {LEDGER} ORDER BY row")
            return [{"row": r, "workflow": w, "key": k, "token": t} for r, w, k, t in rows]

        wanted = set(workflows)
        return [r for r in await conn.read(job) if r["workflow"] in wanted]

    return Opened(durable, durable.close, ledger_effect, read_ledger)


# -- Postgres -------------------------------------------------------------------------------------


async def _postgres(spec: Spec) -> Opened:
    import psycopg
    from psycopg_pool import AsyncConnectionPool

    from without_durability_postgres import (
        PostgresCheckpointer,
        PostgresDurable,
        PostgresScheduler,
        migrate,
    )

    schema = spec["schema"]
    if spec.get("prepare"):
        async with await psycopg.AsyncConnection.connect(spec["url"], autocommit=True) as c:
            await c.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    pool: Any = AsyncConnectionPool(
        spec["url"],
        open=False,
        min_size=1,
        max_size=int(spec.get("pool_size", 4)),
        kwargs={"options": f"-c search_path={schema}"},
        timeout=float(spec.get("timeout", 5)),
    )
    await pool.open(wait=True, timeout=30)
    cls = load_class(spec["checkpointer_class"]) if spec.get("checkpointer_class") else (PostgresCheckpointer)
    durable = PostgresDurable(
        cls(pool=pool), PostgresScheduler(pool=pool, namespace=spec.get("namespace", "default"))
    )
    if spec.get("prepare"):
        await migrate(pool)
        async with pool.connection() as c:
            await c.execute(
                f"CREATE TABLE IF NOT EXISTS {LEDGER} (row BIGSERIAL PRIMARY KEY, "
                "workflow TEXT NOT NULL, key TEXT NOT NULL, token BIGINT NOT NULL)"
            )

    def ledger_effect(
        workflow: str, key: str, token: int, failpoint: Callable[[], None]
    ) -> Callable[[Any], Awaitable[object]]:
        async def effect(cur: Any) -> object:
            await cur.execute(
                f"INSERT INTO {LEDGER} (workflow, key, token) VALUES (%s, %s, %s) RETURNING row",
                (workflow, key, token),
            )
            row = (await cur.fetchone())[0]
            if opened.pause is not None:
                await opened.pause(workflow, token)
            failpoint()
            return {"row": int(row), "token": token}

        return effect

    async def read_ledger(workflows: list[str]) -> list[dict[str, Any]]:
        async with pool.connection() as c:
            cur = await c.execute(
                f"SELECT row, workflow, key, token FROM {LEDGER} WHERE workflow = ANY(%s) ORDER BY row",
                (workflows,),
            )
            return [
                {"row": int(r), "workflow": w, "key": k, "token": int(t)}
                for r, w, k, t in await cur.fetchall()
            ]

    async def close() -> None:
        await pool.close()

    opened = Opened(durable, close, ledger_effect, read_ledger)
    return opened


# -- Redis ----------------------------------------------------------------------------------------

_LEDGER_LUA = """
-- KEYS[1]: this workflow's ledger list (same hash slot as the workflow)
-- ARGV[1]: the transact key, ARGV[2]: the pass token. Returns the new entry as JSON.
local n = redis.call('RPUSH', KEYS[1], cjson.encode({key = ARGV[1], token = tonumber(ARGV[2])}))
return cjson.encode({row = n, token = tonumber(ARGV[2])})
"""


async def _redis(spec: Spec) -> Opened:
    import redis.asyncio as aioredis

    from without_durability import SplitDurable
    from without_durability_redis import (
        LuaEffect,
        RedisCheckpointer,
        RedisSetScheduler,
    )

    client: Any = aioredis.Redis.from_url(
        spec["url"],
        socket_timeout=float(spec.get("timeout", 5)),
        socket_connect_timeout=float(spec.get("timeout", 5)),
    )
    prefix = spec["prefix"]
    cls = load_class(spec["checkpointer_class"]) if spec.get("checkpointer_class") else (RedisCheckpointer)
    if spec.get("ttl"):  # a scenario's small retention (long-wait)
        checkpointer = cls(client, prefix=prefix, ttl=timedelta(seconds=float(spec["ttl"])))
    else:
        checkpointer = cls(client, prefix=prefix)
    scheduler = RedisSetScheduler(client, prefix=prefix, namespace=spec.get("namespace", "default"))
    durable = SplitDurable(checkpointer, scheduler)

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

    async def close() -> None:
        await client.aclose()

    return Opened(durable, close, ledger_effect, read_ledger)
