"""The values that cross the interface: a claim, a recorded value, a history row, a delivery."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class Pass:
    """A claim on one workflow.

    ``token`` is minted by the store: strictly increasing per workflow and never reused, including
    across ``discard``. Every write made with this pass is refused once a higher token exists.
    """

    workflow: str
    token: int


@dataclass(frozen=True, slots=True)
class Recorded:
    """What the store now holds for a key, decoded, and whether it is this call's own.

    ``won`` is True when the value the store holds is the one this call offered (the store compares
    the two encodings), so a replayed deterministic write also reports True. Only the store can say:
    comparing decoded values is wrong whenever the codec changes a value (a tuple comes back a list).
    """

    value: object
    won: bool


@dataclass(frozen=True, slots=True)
class Entry:
    """One row of ``history``: the key, its decoded value, and the store-clock time of the winning
    write (a losing write never moves it)."""

    key: str
    value: object
    written_at: datetime


@dataclass(frozen=True, slots=True)
class Delivery:
    """What ``Scheduler.take`` hands out: the workflow to run and a receipt that is opaque to callers.

    Hand it back to ``Scheduler.wake_at`` to answer for it; the receipt is how the store tells its own
    delivery from a wakeup or a cancel that arrived since.
    """

    workflow: str
    receipt: object
