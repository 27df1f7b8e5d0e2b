"""The Memory store's own edge cases (the conformance suite judges it with every other store)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from without_durability import MemoryScheduler


@pytest.mark.asyncio
@pytest.mark.parametrize("zone", [UTC, timezone(timedelta(hours=-12))], ids=["utc", "utc-12"])
async def test_a_schedule_after_one_at_the_earliest_datetime_neither_overflows_nor_loses_it(
    zone: timezone,
) -> None:
    """schedule moves a queued time at least a microsecond earlier, which year 1's first
    microsecond cannot go (the fuzz found a later schedule raising OverflowError there)."""
    scheduler = MemoryScheduler()
    await scheduler.schedule("w", datetime.min.replace(tzinfo=zone))
    await scheduler.schedule("w")
    taken = await scheduler.take(timedelta(seconds=5))
    assert taken is not None and taken.workflow == "w"
