"""Clocks for the stores whose clock is the process's (Memory, SQLite)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

Clock = Callable[[], datetime]
"""A function returning the current time as a timezone-aware UTC datetime."""


def system_clock() -> datetime:
    """The process's wall clock, in UTC."""
    return datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to, for tests: call it for the time, ``advance`` to move it."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start if start is not None else datetime(2030, 1, 1, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("ManualClock needs a timezone-aware start time")

    def __call__(self) -> datetime:
        return self._now

    def advance(self, by: timedelta) -> None:
        """Move the clock forward by ``by`` (never backward)."""
        if by < timedelta(0):
            raise ValueError(f"a clock does not go backward (asked to advance by {by})")
        self._now += by
