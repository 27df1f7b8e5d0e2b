"""The simulated machine and wire one ``Sim`` run drives: its constants and fault rates, virtual
clocks and process ids (``World``), history lines kept in memory (``SimHistory``), a run's
``Result``, and the store as a simulated process reaches it (``SimScheduler``, ``SimDurable``,
``SimRecorder``: latencies, lost replies, deliveries handed out twice). ``wd_chaos.sim.world``
runs the processes on them."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import types
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from without_durability import Delivery
from without_durability.errors import StoreUnavailable
from without_durability.protocols import Durable, Scheduler

from ..checks import Verdict
from ..client.recorder import receipt_text
from ..client.workload import Recorder, classify, error_fields
from ..history import HistoryWriter, Op
from . import SIM_CHECKS as _SIM_CHECKS
from .loop import SimLoop

T = TypeVar("T")

START_WALL = datetime(2030, 1, 1, tzinfo=UTC)
"""The virtual wall clock at a run's start (before any step)."""

BOOT_UPTIME_US = 3_000_000
"""The lease clock's reading just after a (re)boot, in microseconds: small, as a machine's is."""

SIM_CHECKS = _SIM_CHECKS

LANDING = ("append", "record", "supply")

POLL_FLOOR = 1.0
"""The least poll interval (seconds) of a sim worker: idle takes are most of a run's calls and say
little; a scenario's shorter interval is raised to this."""

READ_FLOOR = 1.0

READ_BACK = 0.3
"""The share of a writer's acknowledged writes it reads back at once (read your writes)."""
"""The least pause (seconds) between two reads of the sim's reader."""


@dataclass(frozen=True)
class Rates:
    """How often each fault happens; ``Rates()`` is what ``wd-chaos sim`` uses."""

    latency: float = 0.004
    """The most a request or a reply spends on the wire (seconds; each a seeded fraction)."""
    lost_reply: float = 0.01
    """The chance a call's reply is lost after the store applied it."""
    duplicate: float = 0.03
    """The chance a delivery ``take`` hands out is handed out once more, to the next take."""
    timeout: float = 0.3
    """The chance a writer's call is given a short timeout (a cancel at one of its awaits)."""
    nemesis_every: float = 1.5
    """The mean virtual seconds between two nemesis events (each a fault kind's simulated form,
    drawn by its share: ``faults.base.SimulatedForm``)."""


@dataclass
class Result:
    """One run: its history lines (in the order written), final state, verdicts and overall verdict."""

    seed: int
    scenario: str
    mutant: str | None
    lines: list[Op]
    final: dict[str, Any]
    verdicts: list[Verdict]
    valid: bool | str
    steps: int
    stats: dict[str, int] = field(default_factory=dict)
    fired: list[str] = field(default_factory=list)
    """The ids of the faults the run injected, in order (its fault plan, as ``--faults`` takes it)."""
    coverage: dict[str, int] = field(default_factory=dict)
    """How often the run entered each coverage window its scenario names (``checks.coverage``):
    counted, never judged (sim draws its faults anew for each seed)."""
    bites: dict[str, bool] = field(default_factory=dict)
    """The bite checks of the kinds whose simulated form fired, replayed on the run: whether each
    bit (counted, never judged)."""
    probes: dict[str, str] = field(default_factory=dict)
    """Each probe the run made after its workload and how it ended (``retake``: ``answered``,
    ``not-taken``, or ``error: <type>``); counted in a sweep's summary, never judged."""

    def history_bytes(self) -> bytes:
        """The history as ``history.jsonl`` holds it (one sorted-key JSON line each, then the
        ``end`` line with their count and SHA-256): what a replay must reproduce byte for byte."""
        body = b"".join((json.dumps(line, sort_keys=True) + "\n").encode() for line in self.lines)
        end = {"type": "end", "lines": len(self.lines), "sha256": hashlib.sha256(body).hexdigest()}
        return body + (json.dumps(end, sort_keys=True) + "\n").encode()

    def failing(self) -> list[str]:
        """The checkers that said no."""
        return [v.name for v in self.verdicts if v.valid is False]


# -- the world's clocks and history ------------------------------------------------------------------


class World:
    """The shared state of one run: its loop, RNG, clocks, history lines and fault rates."""

    def __init__(
        self, loop: SimLoop, rng: random.Random, rates: Rates, plan: frozenset[str] | None = None
    ) -> None:
        self.loop = loop
        self.rng = rng
        self.rates = rates
        self.plan = plan
        """The faults this run may inject (ids such as ``kill-3``, ``lost-reply-2``), or None for
        every fault the seed draws: a shrunk run's plan."""
        self.fired: list[str] = []
        """The ids of the faults injected so far, in order (each one the plan permitted)."""
        self._drawn: dict[str, int] = {}
        self.lines: list[Op] = []
        self.wall_offset = 0.0
        self.boot_at = loop.time()
        self.uptime_us = rng.randrange(10**11, 10**12)
        """The lease clock at the run's start: a machine up for days (a reboot restarts it small)."""
        self._t0 = loop.time()
        self._last_mono = 0
        self._pids = 100
        self.stash: Delivery | None = None
        self.redelivered: list[str] = []
        """The receipt of each delivery the wire handed out a second time, as the history records
        it (the final state's ``redelivered_receipts``: ``receipts-distinct`` excuses these)."""
        self.rebooted = False
        self.closed = False
        self.stats: dict[str, int] = {}
        self._wall_key: tuple[float, float] | None = None
        self._wall_text = ""
        self._second_key: tuple[int, int] | None = None
        self._second_text = ""

    def next_id(self, kind: str) -> str:
        """The id of this run's next drawn fault of ``kind`` (``lost-reply-1``, ``lost-reply-2``...):
        the n-th time the seed chose that fault, whether or not the plan lets it happen."""
        drawn = self._drawn[kind] = self._drawn.get(kind, 0) + 1
        return f"{kind}-{drawn}"

    def permits(self, fault: str) -> bool:
        """Whether the drawn fault ``fault`` happens: always without a plan, else when the plan
        names it. A fault that happens is listed in ``fired``. A fault left out changes nothing
        else the seed draws at that moment, so the run stays as close to the seed's as it can."""
        if self.plan is not None and fault not in self.plan:
            return False
        self.fired.append(fault)
        return True

    def count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    def pid(self) -> int:
        """A fresh simulated process id."""
        self._pids += 1
        return self._pids

    def elapsed(self) -> float:
        """Virtual seconds since the run began."""
        return self.loop.time() - self._t0

    def wall(self) -> datetime:
        """The virtual wall clock (steps move it; nothing else does but time)."""
        return START_WALL + timedelta(seconds=round(self.elapsed() + self.wall_offset, 6))

    def wall_text(self) -> str:
        """``wall().isoformat()``, computed once per virtual instant (one callback writes several
        lines at the same instant)."""
        now = self.loop._now
        key = (now, self.wall_offset)
        if key != self._wall_key:
            self._wall_key = key
            # wall() to the microsecond, formatted from a cached whole second: the same text as
            # wall().isoformat() ("...T00:00:05.123456+00:00", no fraction when it is zero)
            since = timedelta(seconds=round(now - self._t0 + self.wall_offset, 6))
            second = (since.days, since.seconds)
            if second != self._second_key:
                self._second_key = second
                whole = timedelta(days=since.days, seconds=since.seconds)
                self._second_text = (START_WALL + whole).isoformat()
            text = self._second_text
            micros = since.microseconds
            self._wall_text = f"{text[:19]}.{micros:06d}{text[19:]}" if micros else text
        return self._wall_text

    def lease_micros(self) -> int:
        """The virtual machine's monotonic clock in microseconds: restarts small at a reboot."""
        return self.uptime_us + int((self.loop.time() - self.boot_at) * 1_000_000)

    def reboot(self) -> None:
        """Restart the lease clock from a small number, as a machine's monotonic clock does."""
        self.boot_at = self.loop.time()
        self.uptime_us = BOOT_UPTIME_US
        self.rebooted = True

    def mono_ns(self) -> int:
        """The observer's monotonic clock for history lines: never restarts, strictly increasing."""
        now = int(self.elapsed() * 1e9) + 1_000_000_000
        self._last_mono = max(now, self._last_mono + 1)
        return self._last_mono

    def latency(self) -> Awaitable[None]:
        """A request or a reply on the wire, to await at once: an await where a cancel can land.
        Most are a bare yield (another task may run first: ``asyncio.sleep(0)`` without its two
        frames); a quarter take virtual time (a timeout may fire)."""
        draw = self.rng.random()
        if draw < 0.75:
            return _yield()
        return asyncio.sleep((draw - 0.75) * 4 * self.rates.latency)


@types.coroutine
def _yield() -> Generator[None, None, None]:
    """What ``asyncio.sleep(0)`` awaits: one bare yield, so the task is scheduled again."""
    yield


class SimHistory(HistoryWriter):
    """A ``HistoryWriter`` for one simulated process: lines go to the world's list, stamped with
    virtual clocks (no file, no real clock)."""

    def __init__(self, world: World, process: str, pid: int) -> None:  # no super(): no file
        self.world = world
        self.process = process
        self.pid = pid
        self._counter = 0
        self._proc = f"{process}#{pid}"

    def close(self) -> None:
        pass

    def write(self, line: Op) -> Op:
        line.setdefault("process", self.process)
        line.setdefault("pid", self.pid)
        world = self.world
        loop = world.loop
        if world.closed or self._proc in loop._dead:
            return line  # a vanished task's finally, run as the loop is torn down
        # world.mono_ns(), inlined (a run writes thousands of lines)
        mono = int((loop._now - world._t0) * 1e9) + 1_000_000_000
        last = world._last_mono
        world._last_mono = mono = mono if mono > last else last + 1
        line["mono"] = mono
        line["wall"] = world.wall_text()
        if "value" in line:
            line["value"] = _jsonable(line["value"])
        if "result" in line:
            line["result"] = _jsonable(line["result"])
        world.lines.append(line)
        return line


def _jsonable(value: object) -> object:
    """``value`` as its JSON round trip gives it back (a fresh copy), or its ``repr`` when it has
    none. Plain values (str, int, float, bool, None, and lists, tuples and str-keyed dicts of
    them) are copied directly, to the same result; anything else takes the round trip itself."""
    try:
        return _plain(value, 0)
    except _NotPlain:
        pass
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)


class _NotPlain(Exception):
    pass


def _plain(value: object, depth: int) -> object:
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        # json writes float('inf') as Infinity and reads it back; -0.0 and nan likewise
        return value
    if depth > 50:
        raise _NotPlain
    if kind is list or kind is tuple:
        return [_plain(item, depth + 1) for item in value]  # type: ignore[attr-defined]
    if kind is dict:
        out: dict[str, object] = {}
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str:
                raise _NotPlain  # json turns 1, True, None keys into strings: let it
            out[key] = _plain(item, depth + 1)
        return out
    raise _NotPlain


# -- the wire ------------------------------------------------------------------------------------------


class SimScheduler:
    """The scheduler as the wire delivers it: now and then a delivery handed out twice."""

    def __init__(self, world: World, inner: Scheduler) -> None:
        self.world = world
        self.inner = inner
        # the store's own: only take meets the wire
        self.now = inner.now
        self.schedule = inner.schedule
        self.wake_at = inner.wake_at
        self.cancel = inner.cancel

    async def take(self, visibility: timedelta) -> Delivery | None:
        world = self.world
        if world.stash is not None:
            again, world.stash = world.stash, None
            world.count("duplicate")
            world.redelivered.append(str(receipt_text(again.receipt)))
            return again
        got = await self.inner.take(visibility)
        if (
            got is not None
            and world.rng.random() < world.rates.duplicate
            and world.permits(world.next_id("duplicate"))
        ):
            world.stash = got
        return got


class SimDurable:
    """The store as a simulated process reaches it: the checkpointer (a mutant's, if any), the
    scheduler through the wire, ``arrive`` and ``deliver`` as the store's durable does them."""

    def __init__(self, world: World, durable: Durable[Any]) -> None:
        self.durable = durable
        self.checkpointer = durable.checkpointer
        self.scheduler = SimScheduler(world, durable.scheduler)
        # the store's own, unwrapped: only the scheduler meets the wire here
        self.arrive = durable.arrive
        self.deliver = durable.deliver
        self.discard = durable.discard


class SimRecorder(Recorder):
    """The harness's ``Recorder`` with the wire under every call: a request latency (a cancel there
    leaves the call unsent), the store's own call, a reply latency (a cancel there finds it applied),
    and now and then a reply lost after the store applied it."""

    def __init__(
        self,
        world: World,
        durable: SimDurable,
        hist: HistoryWriter,
        peek: Callable[[str, str | None], tuple[int, bool]],
        *,
        faults: bool = True,
    ) -> None:
        super().__init__(durable, hist)
        self.world = world
        self.faults = faults
        """False for the simulator's own calls (seeding the workflows, the final reads): no fault."""
        self.peek = peek
        """The store's ``SimulatedStore.peek``: its records looked at without a step."""

    def _mine(self, f: str, fields: dict[str, Any]) -> tuple[str, str | None] | None:
        """Where a landing call writes: (workflow, key, or None for an append)."""
        workflow = fields.get("workflow")
        if f not in LANDING or not isinstance(workflow, str):
            return None
        return workflow, None if f == "append" else str(fields.get("key"))

    async def _call(  # the wire's form of Recorder._call
        self, f: str, fields: dict[str, Any], call: Callable[[], Awaitable[T]], done: Callable[[T], dict[str, Any]]
    ) -> T:
        world = self.world
        op = self.hist.invoke(f, **fields)
        task = asyncio.current_task()
        cancels = task.cancelling() if task is not None else 0
        mine = self._mine(f, fields)
        before = self.peek(*mine) if mine is not None else None
        stage = "request"
        try:
            await world.latency()
            stage = "store"
            result = await call()
            stage = "reply"
            await world.latency()
            if (
                self.faults
                and world.rng.random() < world.rates.lost_reply
                and world.permits(world.next_id("lost-reply"))
            ):
                world.count("lost_reply")
                raise StoreUnavailable(f"sim: the reply to {f} was lost after the store applied it")
        except asyncio.CancelledError as exc:
            # unsent: cancelled on the way to the store, or inside it with nothing of it applied
            unsent = stage == "request" or (
                stage == "store" and mine is not None and self.peek(*mine) == before
            )
            world.count("cancelled")
            self.hist.complete(op, f, "unknown", cancelled=True, unsent=unsent, **error_fields(exc))
            raise
        except BaseException as exc:
            self.hist.complete(op, f, classify(exc, f), **error_fields(exc))
            raise
        more = done(result)
        if task is not None and task.cancelling() > cancels:
            more["cancel_swallowed"] = True
        self.hist.complete(op, f, "ok", **more)
        return result
