"""A worker process for the process tests: one Worker on a SQLite file, serving until SIGTERM.

Its workflow body runs one slow step. The step prints ``started <workflow> <token>`` when its
effect begins and ``effect-done <workflow>`` when it ends; the body prints ``finished <workflow>``
after the step is recorded.

Usage: ``python step_worker.py STORE ALIVE_SECONDS STEP_SECONDS`` where STORE is ``sqlite|PATH``,
``postgres|SCHEMA|URL`` (the schema goes on the connections' search_path), or
``redis-set|PREFIX|URL`` / ``redis-stream|PREFIX|URL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from without_durability import Durable, Run, SplitDurable, Worker
from without_durability.sqlite import SqliteDurable


def say(line: str) -> None:
    print(line, flush=True)


@contextlib.asynccontextmanager
async def open_store(spec: str) -> AsyncIterator[Durable[Any]]:
    kind, *args = spec.split("|")
    if kind == "sqlite":
        durable = await SqliteDurable.open(args[0])
        try:
            yield durable
        finally:
            await durable.close()
    elif kind == "postgres":
        from without_durability_postgres import (
            PostgresCheckpointer,
            PostgresDurable,
            PostgresScheduler,
        )

        schema, url = args
        from psycopg_pool import AsyncConnectionPool

        pool: Any = AsyncConnectionPool(
            url, min_size=2, open=False, kwargs={"options": f"-c search_path={schema}"}
        )
        await pool.open(wait=True)
        try:
            yield PostgresDurable(PostgresCheckpointer(pool=pool), PostgresScheduler(pool=pool))
        finally:
            await pool.close()
    elif kind in ("redis-set", "redis-stream"):
        from without_durability_redis import (
            RedisCheckpointer,
            RedisSetScheduler,
            RedisStreamScheduler,
        )

        prefix, url = args
        from redis.asyncio import Redis

        client: Any = Redis.from_url(url)
        scheduler: Any = (
            RedisSetScheduler(client, prefix=prefix)
            if kind == "redis-set"
            else RedisStreamScheduler(client, prefix=prefix)
        )
        try:
            yield SplitDurable(RedisCheckpointer(client, prefix=prefix), scheduler)
        finally:
            await client.aclose()
    else:
        raise SystemExit(f"unknown store {spec!r}")


async def main(spec: str, alive: float, step_seconds: float) -> None:
    async with open_store(spec) as durable:
        await serve(durable, alive, step_seconds)
    say("exited")


async def serve(durable: Durable[Any], alive: float, step_seconds: float) -> None:
    async def body(run: Run[Any]) -> object:
        async def slow() -> object:
            say(f"started {run.workflow} {run.pass_.token}")
            await asyncio.sleep(step_seconds)
            say(f"effect-done {run.workflow}")
            return f"worker token {run.pass_.token}"

        await run.step("slow", slow, str)
        say(f"finished {run.workflow}")
        return None

    worker = Worker(
        durable,
        body,
        alive=timedelta(seconds=alive),
        budget=timedelta(minutes=5),
        visibility=timedelta(minutes=10),
        poll_interval=timedelta(milliseconds=50),
    )
    say("ready")
    await worker.serve()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    with contextlib.suppress(ImportError):  # under the mutant gate, this process meets the mutant too
        from wd_chaos.mutants import install_from_env

        install_from_env()
    asyncio.run(main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3])))
