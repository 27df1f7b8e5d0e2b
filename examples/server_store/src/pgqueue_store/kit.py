"""The ``pgqueue`` kit: ``PgQueueScheduler`` beside ``PostgresCheckpointer``, built on the Postgres
kit without-durability ships. ``PostgresKit`` brings the servers (``WD_POSTGRES_URL``, a container,
or a private server from the binaries on PATH), a fresh schema per conformance test, one schema per
wd-chaos run (dropped when the run is over), the ledger every run checks exactly-once against, and
``server_key = "postgres"``; the kit brings its scheduler, as an opener."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from without_durability_postgres.kit import PostgresKit, WorkerStore

from . import PgQueueScheduler, migrate_queue


# --8<-- [start:opener]
@asynccontextmanager
async def open_pgqueue(store: WorkerStore) -> AsyncIterator[PgQueueScheduler]:
    """The scheduler on the pool the process opened, its table created first when asked."""
    if store.prepare:  # once per run before any worker, and for each test's fresh schema
        await migrate_queue(store.pool)
    yield PgQueueScheduler(store.pool, queue=store.namespace)
    # nothing to close: the pool is the kit's, closed after this


KIT = PostgresKit(
    "pgqueue",
    scheduler=open_pgqueue,
    description="PostgresCheckpointer + PgQueueScheduler (one queue table) on PostgreSQL",
)
# --8<-- [end:opener]
