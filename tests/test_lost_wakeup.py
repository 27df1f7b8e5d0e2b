"""An arrival while a pass runs is never lost, even once the pass has outlived its take's
visibility (a pass slower than its visibility, or a store clock stepped ahead, as the chaos
``clock-step`` fault steps it): the pass's answer must not delete the wakeup the arrival asked
for. Every store."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from without_durability.testing import StoreUnderTest

pytestmark = pytest.mark.asyncio

VISIBILITY = timedelta(milliseconds=400)


async def test_an_arrival_after_the_visibility_ran_out_survives_the_passs_answer(
    wd_store: StoreUnderTest[Any],
) -> None:
    sch = wd_store.scheduler
    await sch.schedule("w")
    delivery = await sch.take(VISIBILITY)
    assert delivery is not None and delivery.workflow == "w", delivery
    await wd_store.clock.advance(3 * VISIBILITY)  # the take's receipt is now in the past
    await sch.schedule("w")  # an arrival while the pass still runs
    await sch.wake_at(delivery, None)  # the pass answers as it saw the workflow: nothing to do
    again = await sch.take(VISIBILITY)
    assert again is not None and again.workflow == "w", "the arrival's wakeup was lost with the answer"
