"""The ``procrastinate`` kit: ``ProcrastinateScheduler`` beside ``PostgresCheckpointer``, built on
the Postgres kit without-durability ships (servers, a fresh schema per conformance test, one
schema per wd-chaos run dropped at its end, the ledger). The kit adds procrastinate's schema, a
registered procrastinate worker per process, and the queue reader ``queue-bounded`` judges."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress

from without_durability.testing.kit import Opened, Spec
from without_durability_postgres.kit import PostgresKit, WorkerStore

from . import ProcrastinateScheduler, apply_schema, open_app

# A workflow's entries: its jobs that wait (todo) or run (doing); ended jobs are history.
READ_QUEUE = """
SELECT args->>'workflow', count(*) FROM procrastinate_jobs
 WHERE queue_name = %s AND status IN ('todo', 'doing')
 GROUP BY 1
"""


@asynccontextmanager
async def open_procrastinate(
    store: WorkerStore, *, literal: bool = False
) -> AsyncIterator[ProcrastinateScheduler]:
    """procrastinate on the pool the process opened: its schema applied first when asked, a
    worker registered (``register_worker``) for ``fetch_job`` to record, unregistered at close."""
    app = await open_app(store.pool)
    if store.prepare:
        await apply_schema(app)
    worker_id = await app.job_manager.register_worker()
    try:
        yield ProcrastinateScheduler(
            app, store.pool, queue=store.namespace, worker_id=worker_id, literal=literal
        )
    finally:
        with suppress(Exception):  # the server may be gone at close; nothing to undo
            await app.job_manager.unregister_worker(worker_id)
        await app.close_async()  # the pool was set from outside: procrastinate leaves it open


def open_procrastinate_recipe(store: WorkerStore) -> AbstractAsyncContextManager[ProcrastinateScheduler]:
    """The same, with ``literal=True``: a retry the queueing lock refuses stays refused."""
    return open_procrastinate(store, literal=True)


class ProcrastinateKit(PostgresKit):
    """``PostgresKit`` with procrastinate as the scheduler, and a queue reader over its jobs."""

    async def open_worker(self, spec: Spec) -> Opened:
        opened = await super().open_worker(spec)
        scheduler = opened.durable.scheduler
        assert isinstance(scheduler, ProcrastinateScheduler), scheduler

        async def read_queue() -> dict[str, int]:
            async with scheduler.pool.connection() as conn:
                cur = await conn.execute(READ_QUEUE, (scheduler.queue,))
                return {str(w): int(n) for w, n in await cur.fetchall()}

        opened.read_queue = read_queue
        return opened


KIT = ProcrastinateKit(
    "procrastinate",
    scheduler=open_procrastinate,
    description="PostgresCheckpointer + procrastinate 3.x's job queue (examples/peers/procrastinate)",
)

RECIPE_KIT = ProcrastinateKit(
    "procrastinate-recipe",
    scheduler=open_procrastinate_recipe,
    description="procrastinate as its 'Retry stalled jobs' recipe and worker leave a refused retry (issues #1446, #1543)",
)
