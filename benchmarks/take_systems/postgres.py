"""PostgresScheduler through this library (``answer_and_take``, ``take`` + ``wake_at``, the
``take_many``/``finish_many`` batching option), the same take without SKIP LOCKED, and its
statements through psycopg alone (the driver's share of the gap to pgbench)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from .._common import check_exactly_once, timed_on
from .drain import NAMESPACE, VISIBILITY, drain, drain_chained, workflow_ids

PREFILL = """
INSERT INTO workflow_queue (namespace, workflow, visibility)
SELECT %(namespace)s, 'wf-' || lpad(i::text, 8, '0'),
       now() - interval '1 hour' + i * interval '1 microsecond'
  FROM generate_series(0, %(n)s - 1) AS i
"""


# PostgresScheduler.TAKE without SKIP LOCKED, written out in full rather than edited from the
# store's text (no benchmark rewrites our SQL): a second taker queues behind the row the first
# holds, then finds it no longer due and comes back empty. If TAKE changes, change this beside it.
NAIVE_TAKE = """
WITH next AS (
    SELECT workflow FROM workflow_queue
     WHERE namespace = %(namespace)s AND visibility <= now()
     ORDER BY visibility, workflow
     LIMIT 1
     FOR UPDATE
)
UPDATE workflow_queue AS q
   SET visibility = now() + %(visibility)s
  FROM next
 WHERE q.namespace = %(namespace)s AND q.workflow = next.workflow
RETURNING q.workflow, q.visibility
"""


async def postgres_ours(
    url: str, n: int, counts: Sequence[int], naive: bool, chain: bool = False
) -> list[dict[str, Any]]:
    from without_durability_postgres import PostgresScheduler
    from without_durability_postgres.kit import fresh_schema

    class NaiveScheduler(PostgresScheduler):
        TAKE = NAIVE_TAKE

    cls = NaiveScheduler if naive else PostgresScheduler
    rows = []
    for w in counts:
        async with fresh_schema(url, min_size=w, max_size=w) as (pool, _):
            async with pool.connection() as conn:
                await conn.execute(PREFILL, {"namespace": NAMESPACE, "n": n})
            sched = cls(pool, namespace=NAMESPACE)
            if chain:
                r = await drain_chained(sched, n, w)
            else:
                r = await drain(
                    lambda s=sched: s.take(VISIBILITY), lambda d, s=sched: s.wake_at(d, None), n, w
                )
            async with pool.connection() as conn:
                left = (await (await conn.execute("SELECT count(*) FROM workflow_queue")).fetchone() or [0])[
                    0
                ]
        check = check_exactly_once("pg", workflow_ids(n), r.pop("taken"))
        system = "postgres-naive" if naive else "postgres" if chain else "postgres-two-calls"
        rows.append({"system": system, "workers": w, "n": n, **r, **check, "left_in_queue": left})
    return rows


async def postgres_batched(url: str, n: int, counts: Sequence[int], batch: int) -> list[dict[str, Any]]:
    """The batching option: each worker loops take_many(batch) -> finish_many(those)."""
    from without_durability_postgres import PostgresScheduler
    from without_durability_postgres.kit import fresh_schema

    rows = []
    for w in counts:
        async with fresh_schema(url, min_size=w, max_size=w) as (pool, _):
            async with pool.connection() as conn:
                await conn.execute(PREFILL, {"namespace": NAMESPACE, "n": n})
            sched = PostgresScheduler(pool, namespace=NAMESPACE)
            got: list[str] = []

            async def one(s: PostgresScheduler = sched, out: list[str] = got) -> None:
                while ds := await s.take_many(VISIBILITY, batch):
                    out.extend(d.workflow for d in ds)
                    await s.finish_many(ds)

            start = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(w)))
            seconds = time.perf_counter() - start
            async with pool.connection() as conn:
                left = (await (await conn.execute("SELECT count(*) FROM workflow_queue")).fetchone() or [0])[
                    0
                ]
        check = check_exactly_once("pg-batch", workflow_ids(n), got)
        rows.append(
            {
                "system": f"postgres-batch{batch}",
                "workers": w,
                "n": n,
                "seconds": seconds,
                "rate": len(got) / seconds,
                **check,
                "left_in_queue": left,
            }
        )
    return rows


async def psycopg_raw(url: str, n: int, counts: Sequence[int], chain: bool) -> list[dict[str, Any]]:
    """The same statements through psycopg directly (one autocommit connection per worker, no pool,
    none of this library's code): what the Python driver alone reaches, so the gap to pgbench can
    be split into the driver's share and ours. ``chain``: FINISH_AND_TAKE, else TAKE then FINISH."""
    import psycopg

    from without_durability_postgres import PostgresScheduler
    from without_durability_postgres.kit import fresh_schema

    rows = []
    for w in counts:
        async with fresh_schema(url, min_size=1, max_size=1) as (pool, schema):
            async with pool.connection() as conn:
                await conn.execute(PREFILL, {"namespace": NAMESPACE, "n": n})
            conns = [
                await psycopg.AsyncConnection.connect(
                    url, autocommit=True, options=f"-c search_path={schema}"
                )
                for _ in range(w)
            ]
            got: list[str] = []

            async def one(c: psycopg.AsyncConnection[Any], out: list[str] = got) -> None:
                params: dict[str, Any] = {"namespace": NAMESPACE, "visibility": VISIBILITY}
                if chain:
                    last = {**params, "workflow": "", "receipt": None}
                    while row := await (await c.execute(PostgresScheduler.FINISH_AND_TAKE, last)).fetchone():
                        out.append(row[0])
                        last = {**params, "workflow": row[0], "receipt": row[1]}
                    return
                while row := await (await c.execute(PostgresScheduler.TAKE, params)).fetchone():
                    out.append(row[0])
                    await c.execute(
                        PostgresScheduler.FINISH,
                        {"namespace": NAMESPACE, "workflow": row[0], "receipt": row[1]},
                    )

            seconds = await timed_on(conns, one)
            async with pool.connection() as conn:
                left = (await (await conn.execute("SELECT count(*) FROM workflow_queue")).fetchone() or [0])[
                    0
                ]
        check = check_exactly_once("raw", workflow_ids(n), got)
        rows.append(
            {
                "system": "psycopg-raw" if chain else "psycopg-raw-two-statements",
                "workers": w,
                "n": n,
                "seconds": seconds,
                "rate": len(got) / seconds,
                **check,
                "left_in_queue": left,
            }
        )
    return rows
