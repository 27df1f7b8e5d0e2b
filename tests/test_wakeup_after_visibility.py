"""A wakeup that arrives after a delivery's visibility ran out, while nobody has taken it again, must
survive that delivery's ``wake_at(None)``: DESIGN says a wakeup that arrived since the take stands.

The built-in schedulers once kept one time per workflow and took ``min(queued, now)`` on a wakeup:
once ``now`` was past the delivery's hiding time (a pass slower than its visibility, or a wall
clock stepped forward), the wakeup left the entry as the take set it, the receipt still matched,
and ``wake_at(None)`` deleted the workflow with the arrival unanswered (wd-chaos saw it as a
liveness failure of lease-stall on SQLite). Each now counts wakeups per entry; the conformance
suite holds every store to this too (``test_a_wakeup_after_the_visibility_ran_out_survives_the_answer``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from without_durability.testing.harness import StoreUnderTest

pytestmark = pytest.mark.asyncio


async def test_a_wakeup_after_the_visibility_ran_out_survives_wake_at_none(
    wd_store: StoreUnderTest[Any],
) -> None:
    scheduler = wd_store.scheduler
    await scheduler.schedule("wf-late-wakeup")
    delivery = await scheduler.take(timedelta(seconds=1))
    assert delivery is not None and delivery.workflow == "wf-late-wakeup"
    await wd_store.clock.advance(timedelta(seconds=1.5))  # slower than its visibility; nobody took it
    await scheduler.schedule("wf-late-wakeup")  # an arrival's wakeup, after the take
    await scheduler.wake_at(delivery, None)  # the pass ends, waiting for nothing it saw
    again = await scheduler.take(timedelta(seconds=1))
    assert again is not None and again.workflow == "wf-late-wakeup", (
        f"the wakeup that arrived after the take was dropped: take gave {again!r}"
    )
