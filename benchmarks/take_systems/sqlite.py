"""SqliteScheduler through this library: take then ``wake_at(None)`` per delivery."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from .._common import check_exactly_once
from .drain import NAMESPACE, VISIBILITY, drain, workflow_ids


async def sqlite_runs(n: int, counts: Sequence[int]) -> list[dict[str, Any]]:
    from datetime import UTC, datetime

    from without_durability import SqliteDurable

    async def once(w: int, folder: Path) -> dict[str, Any]:
        durable = await SqliteDurable.open(folder / "bench.db", namespace=NAMESPACE)
        try:
            sched = durable.scheduler
            ids = workflow_ids(n)
            past = datetime.now(UTC) - timedelta(hours=1)
            await durable.conn.write(lambda cur: [sched._schedule_in(cur, x, past) for x in ids])
            r = await drain(lambda: sched.take(VISIBILITY), lambda d: sched.wake_at(d, None), n, w)
        finally:
            await durable.close()
        check = check_exactly_once("sqlite", ids, r.pop("taken"))
        return {"system": "sqlite", "workers": w, "n": n, **r, **check}

    rows = []
    for w in counts:
        with tempfile.TemporaryDirectory(prefix="wd-bench-") as tmp:
            rows.append(await once(w, Path(tmp)))
    return rows
