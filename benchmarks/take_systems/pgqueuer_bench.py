"""PgQueuer draining the same number of jobs, on its own database (batch 1 and its default 10)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

from .._common import check_exactly_once


def acknowledger(done: list[str], stamps: list[float]) -> Callable[[Any], Awaitable[None]]:
    """A PgQueuer entrypoint that only notes the job and when (returning acknowledges it)."""
    from pgqueuer.models import Job

    async def job(j: Job) -> None:
        done.append(str(j.id))
        stamps.append(time.perf_counter())

    return job


async def pgqueuer_runs(url: str, n: int, counts: Sequence[int], batch: int) -> list[dict[str, Any]]:
    """PgQueuer (its QueueManager, drain mode) on its own database: ``w`` managers, each on its own
    connection, dequeue ``batch`` at a time and acknowledge ``n`` jobs."""
    import psycopg
    from pgqueuer import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    base = url.rsplit("/", 1)[0]
    dburl = f"{base}/pgqueuer_bench"
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        exists = await (
            await admin.execute("SELECT 1 FROM pg_database WHERE datname = 'pgqueuer_bench'")
        ).fetchone()
        if not exists:
            await admin.execute("CREATE DATABASE pgqueuer_bench")
    async with await psycopg.AsyncConnection.connect(dburl, autocommit=True) as conn:
        q = Queries.from_psycopg_connection(conn)
        if not await q.schema_is_installed():
            await q.install()
    rows = []
    for w in counts:
        async with await psycopg.AsyncConnection.connect(dburl, autocommit=True) as conn:
            await conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
            q = Queries.from_psycopg_connection(conn)
            ids: list[int] = []
            for start in range(0, n, 1000):
                k = min(1000, n - start)
                ids += [int(i) for i in await q.enqueue(["bench"] * k, [b"x"] * k, [0] * k)]
        done: list[str] = []
        stamps: list[float] = []
        conns = [await psycopg.AsyncConnection.connect(dburl, autocommit=True) for _ in range(w)]
        try:
            managers = []
            for c in conns:
                qm = QueueManager(Queries.from_psycopg_connection(c))
                qm.entrypoint("bench")(acknowledger(done, stamps))
                managers.append(qm)
            start = time.perf_counter()
            await asyncio.wait_for(
                asyncio.gather(
                    *(
                        qm.run(
                            mode=QueueExecutionMode.drain,
                            batch_size=batch,
                            dequeue_timeout=timedelta(seconds=1),
                            log_aggregation_interval=timedelta(0),
                        )
                        for qm in managers
                    )
                ),
                600,
            )
            seconds = time.perf_counter() - start
        finally:
            for c in conns:
                await c.close()
        async with await psycopg.AsyncConnection.connect(dburl, autocommit=True) as conn:
            left = (await (await conn.execute("SELECT count(*) FROM pgqueuer")).fetchone() or [0])[0]
        check = check_exactly_once("pgq", [str(i) for i in ids], done)
        # A QueueManager spends a few fixed seconds starting and draining (about 5 s here whatever
        # the job count), so the rate is taken over the jobs themselves: first handled to last.
        busy = max(stamps) - min(stamps) if len(stamps) > 1 else seconds
        rows.append(
            {
                "system": f"pgqueuer-b{batch}",
                "workers": w,
                "n": n,
                "seconds": busy,
                "wall_seconds_with_start_and_drain": seconds,
                "rate": (len(done) - 1) / busy,
                **check,
                "left_in_queue": left,
            }
        )
    return rows
