"""Fast failover's documented trade, shared by the checkers that judge exclusive holding.

With fast failover a store hands a held workflow (a live claim, a hidden delivery) to another
worker at once when the server has ended its holder: the holder's process was struck by a fault
(a kill, a partition, a failpoint), or a fault ended every session the server had (a restart, a
failover, a power cut). Inside such a window a second holder is the design, not a breach; with no
such fault it is still one. ``fencing`` (claims) and ``take-exclusive`` (takes) excuse the same
windows, by these helpers."""

from __future__ import annotations

from dataclasses import dataclass

from ..history import Op
from ..rundir import FinalState, FinalUnread


def faulted_pids(ops: list[Op]) -> dict[int, float]:
    """Each worker process's first fault: a kill or partition aimed at it (``target_pid``), or a
    failpoint at which it killed itself (its own fault line), by pid, as a monotonic time."""
    first: dict[int, float] = {}
    for o in ops:
        if o.get("type") != "fault" or o.get("phase") != "start":
            continue
        pid = o.get("target_pid", o.get("pid") if o.get("process") != "controller" else None)
        if isinstance(pid, int):
            first[pid] = min(first.get(pid, float("inf")), float(o["mono"]))
    return first


def sessions_ended(ops: list[Op]) -> list[float]:
    """When a fault ended every session the store server had (its line says ``ends_sessions``), as
    monotonic times. Fast failover reads a session the server ended as its holder gone."""
    return [float(o["mono"]) for o in ops if o.get("type") == "fault" and o.get("ends_sessions") is True]


@dataclass(frozen=True)
class Takeovers:
    """Which windows fast failover excuses in one run. Empty (excusing nothing) when the run's
    final state does not say fast failover was on, or was never read."""

    faulted: dict[int, float]
    ended: list[float]

    @classmethod
    def of(cls, ops: list[Op], final: FinalState) -> Takeovers:
        """The run's takeover windows, or none when fast failover was off (or unread)."""
        try:
            on = bool(final.get("fast_failover"))
        except FinalUnread:  # a partial analysis never read it: judged strictly
            on = False
        if not on:
            return cls({}, [])
        return cls(faulted_pids(ops), sessions_ended(ops))

    def excuses(self, holder_pid: object, lo: float, hi: float) -> bool:
        """True when a second holder inside ``(lo, hi)`` (monotonic ns) is fast failover's design:
        the first holder's process was struck by ``hi``, or a fault ended the server's sessions
        inside the window."""
        struck = self.faulted.get(holder_pid, float("inf")) if isinstance(holder_pid, int) else float("inf")
        return struck <= hi or any(lo <= at <= hi for at in self.ended)
