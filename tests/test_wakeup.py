"""The Worker's wakeup path on Postgres (LISTEN/NOTIFY): it takes latency off the poll floor, and a
lost notification costs only latency, never the workflow (polling is the safety net).

Run with ``--wd-store postgres`` (and ``--wd-store redis-stream`` for the stream's blocking read).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import timedelta
from typing import Any

import pytest

from without_durability import Run, Worker
from without_durability.testing.harness import StoreUnderTest
from without_durability_postgres import PostgresDurable, PostgresScheduler, PostgresWakeup

pytestmark = [pytest.mark.asyncio]
POSTGRES = pytest.mark.wd_store("postgres")

Store = StoreUnderTest[Any]
LONG = timedelta(hours=1)
_ids = itertools.count()


class CountingScheduler:
    """A scheduler with its empty takes counted, so a test can wait until the worker is idle."""

    def __init__(self, inner: PostgresScheduler) -> None:
        self.inner = inner
        self.empty_takes = 0
        self.changed = asyncio.Condition()

    async def take(self, visibility: timedelta) -> Any:
        got = await self.inner.take(visibility)
        if got is None:
            async with self.changed:
                self.empty_takes += 1
                self.changed.notify_all()
        return got

    async def idle(self, within: float = 10.0) -> None:
        """Wait until the worker has found the queue empty at least once."""
        async with asyncio.timeout(within), self.changed:
            await self.changed.wait_for(lambda: self.empty_takes > 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Bundle:
    def __init__(self, durable: PostgresDurable) -> None:
        self.inner = durable
        self.checkpointer = durable.checkpointer
        self.scheduler = CountingScheduler(durable.scheduler)


async def pickup(wd_store: Store, *, poll: timedelta, kill_listener: bool) -> tuple[float, PostgresWakeup,
                                                                                  PostgresScheduler]:
    """Seconds from ``arrive`` to the body starting, for a Worker idling on a PostgresWakeup."""
    pool = wd_store.extra["pool"]
    namespace = f"wake-{next(_ids)}-{wd_store.extra['schema']}"
    scheduler = PostgresScheduler(pool, namespace=namespace, notify=True)
    durable = PostgresDurable(wd_store.checkpointer, scheduler)
    bundle = Bundle(durable)
    started: list[float] = []

    async def body(run: Run[Any]) -> object:
        started.append(time.monotonic())
        return None

    wakeup = PostgresWakeup(pool, namespace=namespace, reconnect_after=LONG)
    await wakeup.start()
    if kill_listener:
        async with pool.connection() as conn:
            await conn.execute("SELECT pg_terminate_backend(%s)", (wakeup.backend_pid,))
    work = Worker(bundle, body, alive=LONG, budget=LONG, visibility=LONG, poll_interval=poll,
                  wakeup=wakeup)  # type: ignore[arg-type]
    task = asyncio.create_task(work.run(until=lambda: bool(started)))
    try:
        await bundle.scheduler.idle()
        arrived = time.monotonic()
        await durable.arrive(f"wf-{namespace}", "go", True)
        async with asyncio.timeout(poll.total_seconds() + 20):
            await task
    finally:
        work.stop()
        await asyncio.gather(task, return_exceptions=True)
        await wakeup.close()
    assert scheduler.notifier is not None
    await scheduler.notifier.flush()
    return started[0] - arrived, wakeup, scheduler


@POSTGRES
async def test_a_notification_wakes_an_idle_worker_long_before_its_poll_interval(wd_store: Store) -> None:
    latency, wakeup, _ = await pickup(wd_store, poll=timedelta(seconds=30), kill_listener=False)
    assert wakeup.received >= 1, "the listener never heard the NOTIFY sent after the arrive's commit"
    assert latency < 5.0, f"pickup took {latency:.3f}s with a 30s poll interval: the wakeup did not fire"


@POSTGRES
async def test_a_lost_notification_costs_latency_not_the_workflow(wd_store: Store) -> None:
    # The listener's backend is killed before the arrive (and it will not reconnect for an hour),
    # so the NOTIFY the arrive sends reaches nobody: the worker must still run the workflow, by
    # polling, within about one poll interval.
    poll = timedelta(milliseconds=500)
    latency, wakeup, scheduler = await pickup(wd_store, poll=poll, kill_listener=True)
    assert scheduler.notifier is not None and scheduler.notifier.sent >= 1, "no NOTIFY was sent"
    assert wakeup.received == 0, "the killed listener still heard the notification"
    assert latency < poll.total_seconds() + 5.0, f"pickup took {latency:.3f}s after a lost notification"


@POSTGRES
async def test_a_wakeup_that_fails_falls_back_to_polling(wd_store: Store) -> None:
    called = asyncio.Event()

    class Broken:
        async def wait(self, at_most: timedelta) -> None:
            called.set()
            raise RuntimeError("listener exploded")

    w = f"broken-{next(_ids)}"
    done: list[bool] = []

    async def body(run: Run[Any]) -> object:
        done.append(True)
        return None

    work = Worker(wd_store.durable, body, alive=LONG, budget=LONG, visibility=LONG,
                  poll_interval=timedelta(milliseconds=50), wakeup=Broken())
    task = asyncio.create_task(work.run(until=lambda: bool(done)))
    async with asyncio.timeout(20):
        await called.wait()  # the worker idled on the broken wakeup at least once
        await wd_store.scheduler.schedule(w)
        await task
    assert done == [True]


@pytest.mark.wd_store(["redis-stream"])
async def test_a_worker_idling_on_the_stream_wakes_for_an_arrival_before_its_poll(wd_store: Store) -> None:
    # RedisStreamScheduler.wait is a Wakeup: the Worker blocks on the stream, not on its poll.
    started: list[float] = []

    async def body(run: Run[Any]) -> object:
        started.append(time.monotonic())
        return None

    takes = CountingScheduler(wd_store.scheduler)

    class Bundle:
        checkpointer = wd_store.checkpointer
        scheduler = takes

    work = Worker(Bundle(), body, alive=LONG, budget=LONG, visibility=LONG,  # type: ignore[arg-type]
                  poll_interval=timedelta(seconds=30), wakeup=wd_store.scheduler)
    task = asyncio.create_task(work.run(until=lambda: bool(started)))
    try:
        await takes.idle()
        arrived = time.monotonic()
        await wd_store.durable.arrive(f"stream-{next(_ids)}", "go", True)
        async with asyncio.timeout(50):
            await task
    finally:
        work.stop()
        await asyncio.gather(task, return_exceptions=True)
    assert started[0] - arrived < 5.0, f"pickup took {started[0] - arrived:.3f}s with a 30s poll interval"
