"""The Memory store: a test double that does not lie.

It applies its codec like every real store (a tuple comes back a list), keeps the record order and the
write time the way a real store must, mints tokens that survive ``discard``, and reads time from an
injectable clock so tests can move it (under the system clock, claim deadlines are measured on the
monotonic clock, as the SQLite store's are: see ``without_durability.clock``). Every method runs
without yielding to the event loop, so each one is a single atomic step, which is what a real
store's statement or script is.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ._values import Delivery, Entry, Pass, Recorded
from .clock import Clock, LeaseClock, lease_clock_for, system_clock
from .codec import CheckpointCodec, JsonCodec, verify_codec
from .durable import SplitDurable
from .errors import Contended, Fenced, InvalidInput
from .protocols import Checkpointer, Scheduler
from .rules import (
    MAX_VALUE_BYTES,
    check_key,
    check_lease,
    check_pass,
    check_time,
    check_visibility,
    check_workflow,
    encode_value,
    inbox_key,
)

MemoryEffect = Callable[[dict[str, Any]], object]
"""A Memory transact effect: a function over the checkpointer's own ``state`` dict. It runs on a
copy that replaces ``state`` only if the record commits, so a refused effect leaves no trace."""


_MICRO = timedelta(microseconds=1)


@dataclass(slots=True)
class _Claim:
    """Deadlines in microseconds on the checkpointer's lease clock."""

    token: int
    held_until: int
    alive_until: int
    alive_for: int


@dataclass(frozen=True, slots=True)
class _Stored:
    encoded: Any
    written_at: datetime


class MemoryCheckpointer:
    """``Checkpointer[MemoryEffect]`` over process memory. See the module docstring."""

    def __init__(
        self,
        *,
        codec: CheckpointCodec[Any] | None = None,
        clock: Clock = system_clock,
        max_value_bytes: int = MAX_VALUE_BYTES,
        lease_clock: LeaseClock | None = None,
    ) -> None:
        self.codec: CheckpointCodec[Any] = codec if codec is not None else JsonCodec()
        verify_codec(self.codec)
        self.clock = clock
        self.max_value_bytes = max_value_bytes
        self.state: dict[str, Any] = {}
        """Application state that ``transact`` effects read and write (a ledger, stock counts)."""
        self._claims: dict[str, _Claim] = {}
        self._records: dict[str, dict[str, _Stored]] = {}
        self.lease_clock: LeaseClock = lease_clock if lease_clock is not None else lease_clock_for(clock)
        """What claim deadlines are measured on (microseconds); see ``SqliteCheckpointer``."""

    def _now(self) -> datetime:
        return self.clock()

    def _lease_now(self) -> int:
        """Now on the clock claim deadlines are measured by (microseconds)."""
        return self.lease_clock()

    # -- the claim -------------------------------------------------------------------------

    async def claim(self, workflow: str, *, alive: timedelta, budget: timedelta) -> Pass:
        """See ``Checkpointer.claim``."""
        check_workflow(workflow)
        check_lease(workflow, alive, budget)
        now = self._lease_now()
        held = self._claims.get(workflow)
        # a deadline further ahead than its own window could reach predates a clock restart
        if held is not None and now < held.alive_until <= now + held.alive_for:
            raise Contended(workflow)
        token = 1 if held is None else held.token + 1
        alive_for, held_for = alive // _MICRO, budget // _MICRO
        self._claims[workflow] = _Claim(token, now + held_for, now + min(alive_for, held_for), alive_for)
        return Pass(workflow, token)

    def _fence(self, pass_: Pass) -> _Claim:
        held = self._claims.get(pass_.workflow)
        if held is None or held.token != pass_.token:
            raise Fenced(pass_.workflow, pass_.token)
        return held

    def _renew(self, held: _Claim) -> None:
        held.alive_until = min(self._lease_now() + held.alive_for, held.held_until)

    async def renew(self, pass_: Pass) -> None:
        """See ``Checkpointer.renew``."""
        check_pass(pass_)
        self._renew(self._fence(pass_))

    async def release(self, pass_: Pass) -> None:
        """See ``Checkpointer.release``."""
        check_pass(pass_)
        held = self._claims.get(pass_.workflow)
        if held is not None and held.token == pass_.token:
            now = self._lease_now()
            held.held_until = min(held.held_until, now)
            held.alive_until = min(held.alive_until, now)

    async def discard(self, workflow: str) -> None:
        """See ``Checkpointer.discard``."""
        check_workflow(workflow)
        self._records.pop(workflow, None)
        held = self._claims.get(workflow)
        if held is not None:
            now = self._lease_now()
            held.token += 1
            held.held_until = min(held.held_until, now)
            held.alive_until = min(held.alive_until, now)

    # -- records ---------------------------------------------------------------------------

    def _put(self, workflow: str, key: str, encoded: Any) -> Recorded:
        records = self._records.setdefault(workflow, {})
        stored = records.get(key)
        if stored is None:
            # never before the workflow's latest record, so a wall clock stepped back cannot
            # reverse its history
            latest = next(reversed(records.values()), None)
            now = self._now() if latest is None else max(self._now(), latest.written_at)
            stored = records[key] = _Stored(encoded, now)
        return Recorded(self.codec.decode(stored.encoded), stored.encoded == encoded)

    async def record(self, pass_: Pass, key: str, value: object) -> Recorded:
        """See ``Checkpointer.record``."""
        check_pass(pass_)
        check_key(pass_.workflow, key)
        encoded = encode_value(self.codec, pass_.workflow, key, value, self.max_value_bytes)
        held = self._fence(pass_)
        self._renew(held)
        return self._put(pass_.workflow, key, encoded)

    async def supply(self, workflow: str, key: str, value: object) -> Recorded:
        """See ``Checkpointer.supply``."""
        check_workflow(workflow)
        check_key(workflow, key)
        encoded = encode_value(self.codec, workflow, key, value, self.max_value_bytes)
        return self._put(workflow, key, encoded)

    async def append(self, workflow: str, value: object) -> str:
        """See ``Checkpointer.append``: the key's number is the count of the workflow's records,
        which is also the entry's load position."""
        check_workflow(workflow)
        encoded = encode_value(self.codec, workflow, "inbox/", value, self.max_value_bytes)
        key = inbox_key(len(self._records.get(workflow, {})))
        self._put(workflow, key, encoded)
        return key

    async def load(self, workflow: str) -> dict[str, object]:
        """See ``Checkpointer.load``."""
        check_workflow(workflow)
        records = self._records.get(workflow, {})
        return {key: self.codec.decode(stored.encoded) for key, stored in records.items()}

    async def history(self, workflow: str) -> list[Entry]:
        """See ``Checkpointer.history``."""
        check_workflow(workflow)
        records = self._records.get(workflow, {})
        return [Entry(k, self.codec.decode(s.encoded), s.written_at) for k, s in records.items()]

    async def transact(self, pass_: Pass, key: str, effect: MemoryEffect) -> Recorded:
        """See ``Checkpointer.transact``. The effect runs on a deep copy of ``state``; the copy
        replaces ``state`` only when the record commits."""
        check_pass(pass_)
        check_key(pass_.workflow, key)
        stored = self._records.get(pass_.workflow, {}).get(key)
        if stored is not None:
            return Recorded(self.codec.decode(stored.encoded), False)
        self._fence(pass_)
        scratch = copy.deepcopy(self.state)
        result = effect(scratch)
        encoded = encode_value(self.codec, pass_.workflow, key, result, self.max_value_bytes)
        held = self._fence(pass_)  # the effect may have let a newer pass in: refuse, roll back
        self._renew(held)
        self.state = scratch
        return self._put(pass_.workflow, key, encoded)


@dataclass(frozen=True, slots=True)
class _Receipt:
    visible_at: datetime
    took: int


class MemoryScheduler:
    """``Scheduler`` over process memory: one visibility time per workflow. The receipt of a
    delivery is the visibility its take set and the take's number (every take draws a new one), so
    ``wake_at`` can tell its own delivery from a wakeup (which moved the time), a cancel (which
    removed the entry) or a later take that came since, even one that hid it until the same instant."""

    def __init__(self, *, clock: Clock = system_clock, namespace: str = "default") -> None:
        self.clock = clock
        self.namespace = namespace
        self._queue: dict[str, datetime] = {}
        self._took: dict[str, int] = {}  # the number of the take that last hid each entry
        self._takes = 0

    async def now(self) -> datetime:
        """See ``Scheduler.now``."""
        return self.clock()

    async def schedule(self, workflow: str, at: datetime | None = None) -> None:
        """See ``Scheduler.schedule``."""
        check_workflow(workflow)
        check_time("schedule at", at)
        when = at if at is not None else self.clock()
        current = self._queue.get(workflow)
        # always moves, at least a microsecond earlier: a pass whose receipt is already in the past
        # (slower than its visibility) must find it gone, or its answer would drop this wakeup.
        # Except at the earliest instant a datetime holds, which no take hands out as a receipt.
        if current is None:
            self._queue[workflow] = when
        else:
            try:
                earlier = current - _MICRO
            except OverflowError:  # the first microsecond of year 1 in its own zone
                earlier = current
            self._queue[workflow] = min(earlier, when)

    async def take(self, visibility: timedelta) -> Delivery | None:
        """See ``Scheduler.take``: the earliest visible workflow."""
        check_visibility(visibility)
        now = self.clock()
        due = [(at, wf) for wf, at in self._queue.items() if at <= now]
        if not due:
            return None
        _, workflow = min(due)
        hidden = now + visibility
        self._takes += 1
        self._queue[workflow] = hidden
        self._took[workflow] = self._takes
        return Delivery(workflow, _Receipt(hidden, self._takes))

    async def wake_at(self, delivery: Delivery, at: datetime | None) -> None:
        """See ``Scheduler.wake_at``."""
        check_time("wake_at at", at)
        if not isinstance(delivery.receipt, _Receipt):
            raise InvalidInput(f"{delivery!r} was not handed out by a MemoryScheduler")
        current = self._queue.get(delivery.workflow)
        took = self._took.get(delivery.workflow)
        if current is None or current != delivery.receipt.visible_at or took != delivery.receipt.took:
            return  # cancelled since (not reinstated), woken since (that wakeup stands) or taken since
        if at is None:
            del self._queue[delivery.workflow]
            del self._took[delivery.workflow]
        else:
            self._queue[delivery.workflow] = at

    async def cancel(self, workflow: str) -> None:
        """See ``Scheduler.cancel``."""
        check_workflow(workflow)
        self._queue.pop(workflow, None)
        self._took.pop(workflow, None)


class MemoryDurable(SplitDurable[MemoryEffect]):
    """``Durable[MemoryEffect]`` over a Memory checkpointer and scheduler: ``SplitDurable`` (record,
    then schedule) with both halves checked to be Memory's and typed as such. Each half is one
    step, since nothing can run between them in one process."""

    def __init__(self, checkpointer: MemoryCheckpointer, scheduler: MemoryScheduler) -> None:
        if not isinstance(checkpointer, MemoryCheckpointer) or not isinstance(scheduler, MemoryScheduler):
            raise InvalidInput("MemoryDurable takes a MemoryCheckpointer and a MemoryScheduler")
        super().__init__(checkpointer, scheduler)
        self._memory = (checkpointer, scheduler)

    @property
    def checkpointer(self) -> MemoryCheckpointer:
        """The checkpointer half."""
        return self._memory[0]

    @property
    def scheduler(self) -> MemoryScheduler:
        """The scheduler half."""
        return self._memory[1]


def _typecheck() -> None:  # pragma: no cover - mypy proves the Memory store meets the protocols
    c: Checkpointer[MemoryEffect] = MemoryCheckpointer()
    s: Scheduler = MemoryScheduler()
    del c, s
