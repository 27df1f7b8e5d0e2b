"""What a workflow body is written against: ``Run``, and ``resume``, which runs a body once.

A pass loads the workflow's records once, then replays the body against them: a step already
recorded hands back its recorded value, parsed, instead of running again. Every value a step hands
back is what the store holds, on the pass that ran it as on every later one, so each step names the
parser that proves its type.

A wait (``awaiting`` a value not yet supplied, ``sleep`` until a time not yet reached) writes
itself onto the Run and raises ``Suspended``. ``resume`` turns that into ``Sleeping`` or
``Blocked``, naming every wait the body reached, and refuses (``Swallowed``) a body that returned
after reaching one.

Once a pass has reached a wait, it can only end: a later ``step`` or ``transact`` in that pass
raises ``Swallowed`` before its effect runs (the body, or a branch of it, carried on past a
``Suspended`` it should have let go), and once any write of the pass was ``Fenced``, every later
operation raises ``Fenced`` and ``resume`` raises it too, whatever the body did with the first one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Generic, Never, TypeVar

from typing_extensions import TypeVar as TypeVarX

from ._values import Pass, Recorded
from .errors import Fenced, InvalidInput, InvalidValue, Suspended, Swallowed
from .lifecycle import WorkflowFailed, status_of
from .protocols import Durable
from .rules import INBOX_PREFIX, check_key

T = TypeVar("T")
X = TypeVar("X", bound=BaseException)
E = TypeVarX("E", default=Never)


@dataclass(frozen=True, slots=True)
class Finished:
    """The body returned ``value`` without reaching a wait: the workflow is done."""

    value: object


@dataclass(frozen=True, slots=True)
class Sleeping:
    """The body reached at least one ``sleep`` that has not elapsed: run it again at ``until`` (the
    earliest such deadline), or sooner if a value it awaits arrives. ``waits`` names every wait the
    pass reached, sleeps and awaited keys alike, in the order reached."""

    until: datetime
    waits: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Blocked:
    """The body reached only waits for values from outside (``awaiting``): nothing is due until one
    arrives (``Durable.arrive`` makes the workflow runnable). ``waits`` names every one reached."""

    waits: tuple[str, ...]


Outcome = Finished | Sleeping | Blocked
"""What one pass of a body comes to."""


class _Closed(Suspended):
    """Raised into an operation that starts after its pass has ended (a stray branch of a fan-out):
    it stops that branch and performs nothing."""


class Run(Generic[E]):
    """One pass of one workflow: the records loaded at its start, and the operations a body uses.

    Built by ``resume``; a body receives it and never constructs one. Operations on keys already
    recorded cost no round trip; each new record is one write under the pass's fence, so a pass that
    has been superseded stops with ``Fenced`` at its first write.
    """

    def __init__(self, durable: Durable[E], pass_: Pass, records: dict[str, object]) -> None:
        self._durable = durable
        self._pass = pass_
        self._records = records
        self._waits: dict[str, datetime | None] = {}
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        self._fenced: Fenced | None = None

    @property
    def workflow(self) -> str:
        """The workflow this pass runs."""
        return self._pass.workflow

    @property
    def pass_(self) -> Pass:
        """The claim this pass writes under."""
        return self._pass

    @property
    def durable(self) -> Durable[E]:
        """The store this pass runs against (for ``arrive``/``deliver`` to other workflows)."""
        return self._durable

    # -- bookkeeping shared by every operation ---------------------------------------------

    def _enter(self) -> None:
        if self._closed:
            raise _Closed(f"workflow {self.workflow!r}: this pass has ended")
        if self._fenced is not None:  # the body caught a Fenced and carried on: stop it again
            raise Fenced(self.workflow, self._pass.token, "an earlier write of this pass was refused")
        self._inflight += 1
        self._idle.clear()

    def _leave(self) -> None:
        self._inflight -= 1
        if self._inflight == 0:
            self._idle.set()

    def _unwaited(self, key: str) -> None:
        """Refuse an effect once the pass has reached a wait: the body (or a branch of it) went on
        past a ``Suspended``, and whatever it does now would run on a pass that is ending."""
        if self._waits:
            raise Swallowed(self.workflow, list(self._waits), before=key)

    async def _write(self, write: Awaitable[Recorded]) -> Recorded:
        """A write of this pass; a refusal is remembered, so the pass never ends as anything else."""
        try:
            return await write
        except Fenced as exc:
            self._fenced = exc
            raise

    def _wait(self, key: str, until: datetime | None) -> Never:
        # Written onto the Run before raising, so a Suspended that gather() or asyncio.wait turns
        # into a value is still seen by resume, and a fan-out reports every wait it reached.
        self._waits.setdefault(key, until)
        raise Suspended(key)

    async def _checkpoint(
        self, key: str, effect: Callable[[], Awaitable[object]]
    ) -> tuple[object, Recorded | None]:
        """The recorded value under ``key``; if none, run ``effect`` and record its result. Returns
        the effect's own result (``None`` when nothing ran) alongside the store's answer."""
        check_key(self.workflow, key)
        self._enter()
        try:
            if key in self._records:
                return None, None
            self._unwaited(key)
            produced = await effect()
            recorded = await self._write(self._durable.checkpointer.record(self._pass, key, produced))
            self._records[key] = recorded.value
            return produced, recorded
        finally:
            self._leave()

    # -- what a body calls -----------------------------------------------------------------

    async def step(
        self, key: str, effect: Callable[[], Awaitable[object]], parse: Callable[[object], T]
    ) -> T:
        """Run ``effect`` once and record its result under ``key``; return ``parse`` of what the
        store holds.

        At least once: if the pass dies after the effect and before the record, the next pass runs
        it again, so an effect that leaves the store needs an idempotency key (derive it from the
        workflow and ``key``). The result is what the store holds even on the pass that ran the
        effect (a tuple comes back a list under ``JsonCodec``), and if another pass recorded first,
        its value is the one handed back. Called after the pass reached a wait (a swallowed
        ``Suspended``), it raises ``Swallowed`` and runs nothing.
        """
        await self._checkpoint(key, effect)
        return parse(self._records[key])

    async def transact(self, key: str, effect: E, parse: Callable[[object], T]) -> T:
        """Exactly once: the store performs ``effect`` and records its result under ``key`` in one
        commit (``Checkpointer.transact``); return ``parse`` of what it holds. ``effect`` is in the
        store's own language (a SQLite/Postgres callback over a cursor, a Redis ``LuaEffect``).
        Called after the pass reached a wait, it raises ``Swallowed`` and performs nothing."""
        check_key(self.workflow, key)
        self._enter()
        try:
            if key not in self._records:
                self._unwaited(key)
                recorded = await self._write(self._durable.checkpointer.transact(self._pass, key, effect))
                self._records[key] = recorded.value
        finally:
            self._leave()
        return parse(self._records[key])

    async def awaiting(self, key: str, parse: Callable[[object], T]) -> T:
        """The value supplied under ``key`` from outside (``Durable.arrive``), parsed; if none has
        arrived, this is a wait: the pass ends ``Blocked`` (or ``Sleeping``) naming ``key``."""
        check_key(self.workflow, key)
        self._enter()
        try:
            if key not in self._records:
                self._wait(key, None)
        finally:
            self._leave()
        return parse(self._records[key])

    async def sleep(self, key: str, until: datetime | timedelta) -> datetime:
        """Wait until a moment on the store's clock, and return it.

        The deadline is recorded under ``key`` as ISO-8601 text the first time (a ``timedelta`` is
        measured from the store's now at that moment) and read back as a timezone-aware UTC
        datetime ever after, so a replay sleeps until the same moment. If the store's clock has not
        reached it, this is a wait: the pass ends ``Sleeping`` until then.
        """
        check_key(self.workflow, key)
        if isinstance(until, datetime) and until.tzinfo is None:
            raise InvalidInput(
                f"workflow {self.workflow!r}, key {key!r}: sleep needs a timezone-aware datetime "
                f"or a timedelta, got naive {until!r}"
            )
        if not isinstance(until, datetime | timedelta):
            raise InvalidInput(
                f"workflow {self.workflow!r}, key {key!r}: sleep takes a datetime or a timedelta, "
                f"got {until!r}"
            )
        self._enter()
        try:
            now: datetime | None = None
            if key not in self._records:
                if isinstance(until, timedelta):
                    now = await self._durable.scheduler.now()
                    until = now + until
                text = until.astimezone(UTC).isoformat()
                # No _unwaited here: a deadline is no effect, and a fan-out racing a reply against a
                # timeout must record its sleep after the other branch's wait to report both.
                recorded = await self._write(self._durable.checkpointer.record(self._pass, key, text))
                self._records[key] = recorded.value
            deadline = self._deadline(key)
            if now is None or now < deadline:  # the clock moved during the record: ask again
                now = await self._durable.scheduler.now()
            if now < deadline:
                self._wait(key, deadline)
        finally:
            self._leave()
        return deadline

    def _deadline(self, key: str) -> datetime:
        text = self._records[key]
        try:
            if not isinstance(text, str):
                raise TypeError(f"expected ISO text, found {type(text).__name__}")
            deadline = datetime.fromisoformat(text)
            if deadline.tzinfo is None:
                raise ValueError("it has no timezone")
        except (TypeError, ValueError) as exc:
            raise InvalidValue(
                f"workflow {self.workflow!r}, key {key!r}: sleep found {text!r} recorded there, "
                f"which is not an aware ISO-8601 time ({exc}); a sleep key must not share its "
                "name with another record"
            ) from exc
        return deadline.astimezone(UTC)

    def inbox(self) -> list[tuple[str, object]]:
        """Every message appended to this workflow (``Durable.deliver``) as of the pass's load, as
        ``(key, value)`` pairs in append order. Nothing is consumed: the same messages are here on
        every later pass, so record how far you have handled them (a step, or a key per message)."""
        return [(k, v) for k, v in self._records.items() if k.startswith(INBOX_PREFIX)]

    def recorded(self, key: str) -> bool:
        """Whether ``key`` holds a record as far as this pass knows (loaded, or written by it)."""
        return key in self._records


async def resume(
    durable: Durable[E], pass_: Pass, body: Callable[[Run[E]], Awaitable[object]]
) -> Finished | Sleeping | Blocked:
    """Run ``body`` once, as the pass ``pass_``, against the workflow's records, loaded once here.

    Returns ``Finished`` if the body returned without reaching a wait, else ``Sleeping`` (some
    sleep is pending; wake at its ``until``) or ``Blocked`` (only awaited values are missing), each
    naming every wait the body reached. Raises ``Swallowed`` if the body returned after reaching a
    wait (something turned its ``Suspended`` into a value). ``Fenced`` and the body's own errors
    propagate: a fenced pass must stop, and nothing here retries. A pass any of whose writes was
    ``Fenced`` raises ``Fenced`` however the body ended (it may have caught the first one). A ``TaskGroup`` fan-out's
    exception group counts as a suspension when it holds only waits, and as ``Fenced`` (raised
    bare, so ``except Fenced`` works) when it holds a fence.

    A workflow whose records say it finished (``wd/finished``) returns ``Finished`` with the
    recorded result, and one that failed raises ``WorkflowFailed``; neither runs the body. Writing
    those records is the Worker's part (``without_durability.lifecycle``).

    A fan-out's branches still inside a Run operation when the body ends are waited for, so every
    wait they reach is reported; any operation started after that stops its branch and does nothing.
    """
    records = await durable.checkpointer.load(pass_.workflow)
    status = status_of(records)
    if status.state == "finished":
        return Finished(status.result)
    if status.state == "failed":
        raise WorkflowFailed(pass_.workflow, status.failure)
    return await run_loaded(durable, pass_, records, body)


async def run_loaded(
    durable: Durable[E],
    pass_: Pass,
    records: dict[str, object],
    body: Callable[[Run[E]], Awaitable[object]],
) -> Finished | Sleeping | Blocked:
    """``resume`` on records already loaded for ``pass_``, with no lifecycle check: for a caller
    (the Worker) that read the lifecycle from the same load."""
    run = Run(durable, pass_, records)
    try:
        value = await body(run)
    except Suspended:
        # Let branches that are mid-operation (a sleep reading the clock) reach their own wait.
        await _settle(run)
        _raise_if_fenced(run)
        return _suspended(run)
    except BaseExceptionGroup as group:  # a TaskGroup fan-out: its waits, a fence, or failures
        fenced = _first(group, Fenced)
        if fenced is not None:
            run._closed = True
            raise fenced from group
        if group.subgroup(lambda e: not isinstance(e, BaseExceptionGroup) and not _a_wait(e)) is None:
            await _settle(run)
            _raise_if_fenced(run)
            return _suspended(run)
        run._closed = True
        _raise_if_fenced(run, group)
        raise
    except Fenced:
        run._closed = True
        raise
    except BaseException as exc:
        run._closed = True
        _raise_if_fenced(run, exc)
        raise
    await _settle(run)
    _raise_if_fenced(run)
    if run._waits:
        raise Swallowed(pass_.workflow, list(run._waits))
    return Finished(value)


def _a_wait(exc: BaseException) -> bool:
    """Whether ``exc`` is a wait, or a step refused because a sibling branch had already reached
    one (the branch that let its ``Suspended`` propagate is what ends the pass)."""
    return isinstance(exc, Suspended) or (isinstance(exc, Swallowed) and exc.before is not None)


def _raise_if_fenced(run: Run[E], cause: BaseException | None = None) -> None:
    """A pass that met ``Fenced`` ends fenced, even if the body caught it and went on."""
    if run._fenced is not None:
        raise run._fenced from cause


def _first(group: BaseExceptionGroup[BaseException], kind: type[X]) -> X | None:
    """The first leaf of ``group`` that is a ``kind``, depth first."""
    for exc in group.exceptions:
        if isinstance(exc, kind):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _first(exc, kind)
            if found is not None:
                return found
    return None


async def _settle(run: Run[E]) -> None:
    run._closed = True
    await run._idle.wait()


def _suspended(run: Run[E]) -> Sleeping | Blocked:
    waits = tuple(run._waits)
    deadlines = [d for d in run._waits.values() if d is not None]
    if deadlines:
        return Sleeping(min(deadlines), waits)
    if not waits:
        # Only a Run operation raises Suspended with a wait written down; anything else is a bug in
        # the body (raising Suspended itself), and reporting it as Blocked would park it forever.
        raise InvalidInput(
            f"workflow {run.workflow!r}: the body raised Suspended without reaching a wait; only "
            "Run operations may raise it"
        )
    return Blocked(waits)
