"""pgbench running exactly PostgresScheduler's statements: the C client's ceiling for each way of
taking (FINISH_AND_TAKE; TAKE then FINISH)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .drain import NAMESPACE, VISIBILITY
from .postgres import PREFILL

# A take of at most one row is kept with ``\aset``, not ``\gset``: pgbench aborts a client whose
# ``\gset`` gets no row, and a SKIP LOCKED take can come back empty while rows remain (every one it
# reached was locked). ``\aset`` assigns nothing then, so the variables keep the delivery this
# client answered before (or pgbench -D's ``-``, a workflow no row has), and the next answer finds
# nothing to act on. The statements run as the store ships them, unedited; the empty transactions
# are counted and taken out of the rate (see ``pgbench``).
KEPT = {"workflow": "take_workflow", "receipt": "take_visibility"}
"""The pgbench variables the taken row is kept in (``\\aset take_``), named for the answer's parameters."""


def pgbench_statement(statement: str, rename: dict[str, str] | None = None) -> str:
    """A store statement as pgbench SQL, rendered by the store (``as_pgbench``): its text unchanged
    but for the parameters, ``%(name)s`` to ``:name`` (renamed per ``rename``)."""
    from without_durability_postgres.pgbench import as_pgbench

    return as_pgbench(statement, rename)


def pgbench_script() -> str:
    """One pgbench transaction = one delivery: PostgresScheduler.TAKE (its row kept with \\aset),
    then PostgresScheduler.FINISH with the receipt that take returned."""
    from without_durability_postgres import PostgresScheduler

    take = pgbench_statement(PostgresScheduler.TAKE)
    finish = pgbench_statement(PostgresScheduler.FINISH, KEPT)
    return f"{take}\n\\aset take_\n{finish};\n"


def pgbench_chain_script() -> str:
    """One pgbench transaction = one delivery: PostgresScheduler.FINISH_AND_TAKE answering the
    delivery the client's previous transaction took (kept with \\aset) and taking the next, as
    ``answer_and_take`` does. The first answers nothing (pgbench -D sets a workflow no row has)."""
    from without_durability_postgres import PostgresScheduler

    chain = pgbench_statement(PostgresScheduler.FINISH_AND_TAKE, KEPT)
    return f"{chain}\n\\aset take_\n"


async def pgbench(url: str, n: int, counts: Sequence[int], folder: Path, chain: bool) -> list[dict[str, Any]]:
    """pgbench (prepared statements, -j 2) running ``pgbench_chain_script`` when ``chain``, else
    ``pgbench_script``, ``n / w`` transactions per client."""
    import psycopg

    from without_durability_postgres.kit import fresh_schema

    script = folder / ("pgbench_chain.sql" if chain else "pgbench_take.sql")
    script.write_text(pgbench_chain_script() if chain else pgbench_script())
    m = re.match(r"postgresql://(\w+)@([\d.]+):(\d+)/(\w+)", url)
    assert m, url
    user, host, port, db = m.groups()
    rows = []
    for w in counts:
        async with fresh_schema(url, min_size=1, max_size=2) as (pool, schema):
            async with pool.connection() as conn:
                await conn.execute(PREFILL, {"namespace": NAMESPACE, "n": n})
            per_client = n // w
            env = {**os.environ, "PGOPTIONS": f"-c search_path={schema}"}
            cmd = [
                "pgbench",
                "-n",
                "-M",
                "prepared",
                "-h",
                host,
                "-p",
                port,
                "-U",
                user,
                "-c",
                str(w),
                "-j",
                str(min(w, 2)),
                "-t",
                str(per_client),
                "-D",
                f"namespace={NAMESPACE}",
                "-D",
                f"visibility={int(VISIBILITY.total_seconds())} seconds",
                "-D",
                "take_workflow=-",
                "-D",
                "take_visibility=2000-01-01T00:00:00Z",
                "-f",
                str(script),
                db,
            ]
            out = await asyncio.to_thread(
                subprocess.run, cmd, capture_output=True, text=True, env=env, timeout=600
            )
            tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out.stdout)
            failed = re.search(r"number of failed transactions: (\d+)", out.stdout)
            async with pool.connection() as conn:
                untaken, hidden = await (
                    await conn.execute(
                        "SELECT count(*) FILTER (WHERE visibility <= now()), count(*) FILTER (WHERE visibility > now())"
                        " FROM workflow_queue"
                    )
                ).fetchone() or (0, 0)
        done = per_client * w
        # Every transaction that found nothing left one prefilled row untaken: the deliveries made
        # are done - untaken, and the rate counts only those. A chain leaves each client's last
        # delivery taken and unanswered (pgbench has no last step), so up to w rows stay hidden.
        taken = done - untaken
        aborted = out.returncode != 0 or "aborted" in out.stdout + out.stderr
        rate = float(tps[1]) * taken / done if tps and not aborted else None
        rows.append(
            {
                "system": "pgbench" if chain else "pgbench-two-statements",
                "workers": w,
                "n": done,
                "rate": rate,
                "transactions_per_s": float(tps[1]) if tps else None,
                "empty_takes": untaken,
                "failed": int(failed[1]) if failed else None,
                "left_in_queue": hidden - (w if chain else 0),
                "returncode": out.returncode,
                "stderr": out.stderr.strip()[-500:] if aborted else "",
            }
        )
    del psycopg
    return rows
