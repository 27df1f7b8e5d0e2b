"""What the locustfiles share: a bridge from locust's greenlets to the library's asyncio, and the
stores, opened from the environment the runner (``benchmarks.load``) sets.

Locust runs users as gevent greenlets; the library is asyncio. Locust is started with
``LOCUST_SKIP_MONKEY_PATCH=1`` (so psycopg and redis keep their real sockets), every store call runs
on one asyncio loop in a real thread, and a user waits for its call through gevent's native
threadpool, which yields to the other users meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Coroutine
from typing import Any

import gevent

ENV_STORE = "WD_BENCH_STORE"
ENV_URL = "WD_BENCH_URL"
ENV_RESULT = "WD_BENCH_RESULT"


class Bridge:
    """One asyncio loop in a real thread; ``call`` runs a coroutine there and waits cooperatively.
    The thread starts at the first call: a distributed run's master imports the locustfile too,
    monkey-patched (its messaging to the workers needs that), and never calls."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None

    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, name="wd-asyncio", daemon=True).start()
            gevent.get_hub().threadpool.maxsize = 64
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return gevent.get_hub().threadpool.apply(future.result)


def fire(environment: Any, name: str, start: float, exc: BaseException | None) -> None:
    """Report one call to locust's stats."""
    environment.events.request.fire(request_type="wd", name=name,
                                    response_time=(time.perf_counter() - start) * 1000,
                                    response_length=0, exception=exc, context={})


async def open_durable() -> tuple[Any, Any]:
    """(durable, closer) for the store named in the environment."""
    kind, url = os.environ[ENV_STORE], os.environ[ENV_URL]
    if kind == "postgres":
        from psycopg_pool import AsyncConnectionPool

        from without_durability_postgres import PostgresCheckpointer, PostgresDurable, PostgresScheduler

        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(url, min_size=8, max_size=32, open=False)
        await pool.open(wait=True)
        return PostgresDurable(PostgresCheckpointer(pool=pool), PostgresScheduler(pool=pool)), pool.close
    from redis.asyncio import Redis

    from without_durability import SplitDurable
    from without_durability_redis import RedisCheckpointer, RedisSetScheduler, RedisStreamScheduler

    client = Redis.from_url(url, max_connections=64)
    cls = RedisStreamScheduler if kind == "redis-stream" else RedisSetScheduler
    return SplitDurable(RedisCheckpointer(client), cls(client)), client.aclose
