"""The ``pgqueuer`` kits: ``PgqScheduler`` beside ``PostgresCheckpointer``, built on the Postgres
kit without-durability ships (servers, a fresh schema per conformance test, one schema per wd-chaos
run dropped at its end, the ledger). The kit adds PgQueuer's schema, one queue manager per process,
and the queue reader ``queue-bounded`` judges.

- ``pgqueuer``: no concurrency limit on the entrypoint.
- ``pgqueuer-one``: ``concurrency_limit=1``, a worker runs one job at a time (wd-chaos's ``Worker``
  runs one pass at a time). This is the configuration of PgQueuer's issue #475 (fixed in 0.25.1 by
  PR #474): the kit's slow lane runs it on 0.25.0 and on 0.25.1."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from without_durability.testing.kit import Opened, Spec
from without_durability_postgres.kit import PostgresKit, WorkerStore

from . import PGQUEUER_VERSION, PgqScheduler, install

# A workflow's entries: its live jobs (queued or picked); ended jobs are in PgQueuer's log table.
READ_QUEUE = """
SELECT convert_from(payload, 'UTF8'), count(*) FROM {table}
 WHERE entrypoint = %s AND status IN ('queued', 'picked')
 GROUP BY 1
"""


def opener(concurrency_limit: int) -> Callable[[WorkerStore], AbstractAsyncContextManager[PgqScheduler]]:
    @asynccontextmanager
    async def open_pgqueuer(store: WorkerStore) -> AsyncIterator[PgqScheduler]:
        """PgQueuer on the pool the process opened, its schema installed first when asked."""
        if store.prepare:
            await install(store.pool)
        yield PgqScheduler(store.pool, entrypoint=store.namespace, concurrency_limit=concurrency_limit)

    return open_pgqueuer


class PgqKit(PostgresKit):
    """``PostgresKit`` with PgQueuer as the scheduler, and a queue reader over its jobs."""

    async def open_worker(self, spec: Spec) -> Opened:
        opened = await super().open_worker(spec)
        scheduler = opened.durable.scheduler
        assert isinstance(scheduler, PgqScheduler), scheduler

        async def read_queue() -> dict[str, int]:
            async with scheduler.pool.connection() as conn:
                cur = await conn.execute(
                    READ_QUEUE.format(table=scheduler.table),
                    (scheduler.entrypoint,),
                )
                return {str(w): int(n) for w, n in await cur.fetchall()}

        opened.read_queue = read_queue
        return opened


KIT = PgqKit(
    "pgqueuer",
    scheduler=opener(0),
    description=f"PostgresCheckpointer + PgQueuer {PGQUEUER_VERSION}'s queue (examples/peers/pgqueuer)",
)

ONE_KIT = PgqKit(
    "pgqueuer-one",
    scheduler=opener(1),
    description=f"PgQueuer {PGQUEUER_VERSION}, concurrency_limit=1 per worker (issue #475: stale jobs reclaimed?)",
)
