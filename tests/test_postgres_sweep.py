"""The sweep's fence (``SWEEP_FENCE``): a swept workflow is discarded, so a pass still holding
its claim row's token must be refused afterwards, even when the token sequence is behind the
row (a restore, or a sequence set back by hand), as test_postgres's token-raise test shows for
the claim, the take that claims and a discard.

Run with ``--wd-store postgres``.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from without_durability import Fenced, Pass
from without_durability.rules import lifecycle_writes
from without_durability.testing.harness import StoreUnderTest
from without_durability_postgres import sweep

pytestmark = [pytest.mark.asyncio, pytest.mark.wd_store("postgres")]

LONG = timedelta(hours=1)


async def test_a_sweeps_fence_outranks_its_row_when_the_sequence_is_behind(
    wd_store: StoreUnderTest[Any],
) -> None:
    cp, pool = wd_store.checkpointer, wd_store.extra["pool"]
    w = f"pg-sweep-behind-{uuid.uuid4().hex[:8]}"
    held = await cp.claim(w, alive=LONG, budget=LONG)
    await cp.record(held, "step", 1)
    with lifecycle_writes():
        await cp.record(held, "wd/finished", 1)
    await cp.release(held)  # lapsed: the sweep may take it
    ahead = 10**12
    async with pool.connection() as conn:  # aged as two hours would; the row's token past the sequence
        await conn.execute(
            "UPDATE workflow_checkpoint SET written_at = written_at - interval '2 hours' WHERE workflow = %s",
            (w,),
        )
        await conn.execute("UPDATE workflow_claim SET token = %s WHERE workflow = %s", (ahead, w))
    assert await sweep(pool, LONG) >= 1
    assert await cp.load(w) == {}, "the finished workflow was not swept"
    async with pool.connection() as conn:
        row = await (
            await conn.execute("SELECT token FROM workflow_claim WHERE workflow = %s", (w,))
        ).fetchone()
    assert row is None or row[0] > ahead, f"the sweep's fence went back to the sequence: {row}"
    with pytest.raises(Fenced):  # a pass holding the row's token writes after the sweep
        await cp.record(Pass(w, ahead), "late", 1)
    assert await cp.load(w) == {}, "a write landed on a swept workflow"
