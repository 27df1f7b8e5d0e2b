"""Clocks for the stores whose clock is the process's (Memory, SQLite).

Such a store reads two clocks. Record times (``written_at``) and queue times are wall-clock
moments a caller can compare with a datetime of its own. Leases are durations, and a lease measured
on the wall clock breaks when that clock steps (NTP correcting it, an operator setting it, a virtual
machine resumed from a snapshot): a step forward lapses a live pass early and lets a second pass
claim while the first still runs; a step back keeps a dead pass holding. So under the system clock
leases are measured on the machine's monotonic clock, which every process on one machine shares
and nothing steps. An injected clock (a test's) drives both, so a test that moves it moves leases,
unless the store is also handed a ``lease_clock`` of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

Clock = Callable[[], datetime]
"""A function returning the current time as a timezone-aware UTC datetime."""

LeaseClock = Callable[[], int]
"""A function returning microseconds on the clock a store measures leases by. Only differences
between two readings mean anything."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def system_clock() -> datetime:
    """The process's wall clock, in UTC."""
    return datetime.now(UTC)


def epoch_micros(at: datetime) -> int:
    """``at`` as whole microseconds since the Unix epoch (exact, unlike a float timestamp)."""
    return (at - _EPOCH) // _MICRO


def monotonic_micros() -> int:
    """The machine's monotonic clock in microseconds: the same reading in every process on the
    machine, never stepped, restarted from a small number at boot."""
    return time.monotonic_ns() // 1000


def lease_clock_for(clock: Clock) -> LeaseClock:
    """The clock a store given only ``clock`` measures leases on: ``monotonic_micros`` when
    ``clock`` is ``system_clock`` (see the module docstring), otherwise ``clock`` itself in
    microseconds since the Unix epoch, so an injected clock moves leases and record times together."""
    if clock is system_clock:
        return monotonic_micros
    return lambda: epoch_micros(clock())


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
