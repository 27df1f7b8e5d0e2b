"""A test kit for workflow authors: crash a workflow body at every point, resume it, and say which
effects can run more than once and whether the body replays deterministically.

``check_workflow(body)`` runs ``body`` once without faults (its result and the order of the keys it
asks are the reference), then once more per crash point: before each operation (a step boundary),
after the body returns, and inside each ``step`` after its effect and before its record (inside each
``transact`` after its effect and before its commit, where the store's effect is a plain callable).
Each crashed pass is followed by fresh passes over the same store until the body finishes. Every
run opens a fresh store from the kit registry (``memory`` by default) on a clock that moves only
when a sleep is due, so a sleep of a week costs nothing. The body's own wall clock is the store's:
while a run goes on, ``datetime.now``, ``date.today``, ``time.time`` and the rest of the wall-clock
functions read the store's clock, frozen within a pass (``time-machine`` patches them), so a pass
after a sleep reads the day and hour the store woke it at, as a process would.

Nothing here changes the body: it receives a ``Run`` that watches its operations and raises a
crash (a ``BaseException``) where one is due, and the store underneath is the real one.

What a ``WorkflowReport`` says per step, and what it refuses:

- a ``transact`` ran exactly once in every crash scenario (more means the store did not keep its
  record: the report says no);
- a ``step`` ran at most ``most_runs`` times (2 when a crash fell between its effect and its record);
- a step recorded before a crash never ran again (if it did, the report says no);
- the body is deterministic: a resumed pass that was handed the same values as the reference asks
  the same keys in the same order and returns the same result. A step key chosen by ``random()``
  outside any step breaks that, and so does one taken from the wall clock (the date, the hour)
  outside any step when a sleep moves the clock across it; the problem names the key and the crash
  point. A crashed pass is resumed at the same instant, so a time read with no sleep to move it is
  not caught; nor are the monotonic clocks, a set's order or anything outside the process (the
  tutorial ``test-your-workflow`` lists what is caught and what is not).

``check_upgrade(new, old)`` runs ``old`` to each of its step boundaries and resumes with ``new``:
it says no when ``new`` performs an effect under a key where ``old`` recorded another one that
``new`` never reads (a renamed or reordered step: an in-flight run would repeat that effect), or
when ``new``'s parser refuses a value ``old`` recorded.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar, cast

from ..errors import InvalidInput
from ..run import Blocked, Finished, Run, Sleeping, resume
from .harness import ManualTestClock, StoreUnderTest
from .kit import KitError, find_kit

T = TypeVar("T")

Body = Callable[[Run[Any]], Awaitable[object]]
"""A workflow body: ``async def body(run: Run) -> object``."""

OpenStore = Callable[[], AbstractAsyncContextManager[StoreUnderTest[Any]]]
"""Opens one fresh store on a clock the kit can move (``ManualTestClock``)."""

Kind = Literal["step", "transact", "sleep", "awaiting"]

WORKFLOW = "workflow-under-test"
"""The workflow id every run uses (each run has a store of its own)."""

MAX_PASSES = 200
"""Passes one run may take before the kit calls the body unfinished (a sleep in a loop)."""

_ALIVE = timedelta(minutes=1)
_BUDGET = timedelta(hours=1)


class _Crash(BaseException):
    """The simulated death of the process running a pass: nothing after it in that pass runs."""


class MissingInput(InvalidInput):
    """The body waits (``run.awaiting``) for a key the inputs do not give: give it a value."""


class KitUnusable(InvalidInput):
    """The store asked for cannot be used by the kit (unknown, or its clock cannot be moved)."""


class EffectLedger:
    """Counts effects by name within one run of a body, and keeps the most any run saw.

    The kit counts every ``step`` and ``transact`` effect under its key on its own; call ``note``
    from inside an effect of yours to count something finer (an e-mail sent, a row written) and read
    ``most(name)`` after ``check_workflow``: the most times it happened in any one crash scenario.
    """

    def __init__(self) -> None:
        self.current: dict[str, int] = {}
        """Counts in the run going on now."""
        self.worst: dict[str, int] = {}
        """The most each name was counted in any one run so far."""

    def note(self, name: str, times: int = 1) -> None:
        """Count ``times`` occurrences of ``name`` in the current run."""
        self.current[name] = self.current.get(name, 0) + times
        self.worst[name] = max(self.worst.get(name, 0), self.current[name])

    def count(self, name: str) -> int:
        """How often ``name`` was counted in the current (or last) run."""
        return self.current.get(name, 0)

    def most(self, name: str) -> int:
        """The most times ``name`` was counted in any one run."""
        return self.worst.get(name, 0)

    def start_run(self) -> None:
        """Begin counting a new run (the kit calls this)."""
        self.current = {}


# -- what one run saw ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One operation a pass asked for: its kind, key, and the value the store handed back (None
    when the pass ended there)."""

    kind: Kind
    key: str
    value: object = None
    answered: bool = False


@dataclass(frozen=True)
class CrashPoint:
    """Where a run is crashed: ``before`` operation ``index`` (``index`` = the number of operations:
    after the body returned), or ``inside`` it, after its effect and before its record."""

    where: Literal["before", "inside"]
    index: int

    def describe(self, ops: list[Op]) -> str:
        """The crash point in words, naming the key it falls at."""
        if self.where == "inside":
            op = ops[self.index]
            what = "its record" if op.kind == "step" else "its commit"
            return f"inside {op.kind} {op.key!r} (after its effect, before {what})"
        if self.index == 0:
            return "before the first operation (right after the claim)"
        if self.index >= len(ops):
            return f"after the body returned (after {ops[-1].kind} {ops[-1].key!r})"
        return f"between {ops[self.index - 1].kind} {ops[self.index - 1].key!r} and {ops[self.index].kind} {ops[self.index].key!r}"


@dataclass
class _Pass:
    ops: list[Op] = field(default_factory=list)
    crashed: bool = False
    parse_failed: tuple[str, object, BaseException] | None = None


@dataclass
class RunTrace:
    """Everything one run of a body did: its passes, the effects it performed, how it ended."""

    passes: list[_Pass] = field(default_factory=list)
    effects: dict[str, int] = field(default_factory=dict)
    """How many times each key's effect was performed (started)."""
    commits: dict[str, int] = field(default_factory=dict)
    """How many times each transact key's effect was let commit."""
    runs_at: dict[int, int] = field(default_factory=dict)
    """How many times the effect of the operation at each position ran (a transact: committed):
    by position, since a key may depend on a value an effect handed back."""
    performed: list[str] = field(default_factory=list)
    """Keys whose effects ran, in order, with repeats."""
    result: object = None
    raised: BaseException | None = None
    crashed_at: int | None = None
    """The pass that crashed (index into ``passes``), if the crash point was reached."""
    recorded_at_crash: list[str] = field(default_factory=list)
    """The keys the store held when the crash fell (the body's own keys, in record order)."""
    performed_at_crash: int = 0
    """How many effects had been performed when the crash fell."""
    finished: bool = False

    @property
    def final_ops(self) -> list[Op]:
        """The operations of the pass that finished the run."""
        return self.passes[-1].ops if self.passes else []


class _Watch:
    """The crash plan of one run and what its passes did."""

    def __init__(self, crash: CrashPoint | None, ledger: EffectLedger, trace: RunTrace) -> None:
        self.crash = crash
        self.fired = False
        self.ledger = ledger
        self.trace = trace

    def due(self, where: str, index: int) -> bool:
        crash = self.crash
        if crash is None or self.fired or crash.where != where or crash.index != index:
            return False
        self.fired = True
        return True


class _WatchedRun:
    """What the body receives instead of its ``Run``: the same operations, each observed, with a
    crash raised where one is due. Everything else is the real ``Run``'s."""

    def __init__(self, run: Run[Any], watch: _Watch, pass_: _Pass) -> None:
        self._run = run
        self._watch = watch
        self._pass = pass_
        self._dead = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._run, name)

    def _begin(self, kind: Kind, key: str) -> int:
        if self._dead:
            raise _Crash("this process died")
        index = len(self._pass.ops)
        self._pass.ops.append(Op(kind, key))
        if self._watch.due("before", index):
            self._die()
        return index

    def _die(self) -> None:
        self._dead = True
        self._pass.crashed = True
        raise _Crash("crashed by the workflow kit")

    def _answer(self, index: int, value: object) -> None:
        op = self._pass.ops[index]
        self._pass.ops[index] = Op(op.kind, op.key, value, True)

    def _parser(self, index: int, key: str, parse: Callable[[object], T]) -> Callable[[object], T]:
        def watched(value: object) -> T:
            self._answer(index, value)
            try:
                return parse(value)
            except Exception as exc:
                self._pass.parse_failed = (key, value, exc)
                raise

        return watched

    def _count(self, key: str, index: int | None = None) -> None:
        trace = self._watch.trace
        if index is not None:
            trace.runs_at[index] = trace.runs_at.get(index, 0) + 1
        trace.effects[key] = trace.effects.get(key, 0) + 1
        trace.performed.append(key)
        self._watch.ledger.note(key)

    async def step(
        self, key: str, effect: Callable[[], Awaitable[object]], parse: Callable[[object], T]
    ) -> T:
        """``Run.step``, watched."""
        index = self._begin("step", key)

        async def watched() -> object:
            if self._dead:
                raise _Crash("this process died")
            self._count(key, index)
            value = await effect()
            if self._watch.due("inside", index):
                self._die()
            return value

        return await self._run.step(key, watched, self._parser(index, key, parse))

    async def transact(self, key: str, effect: Any, parse: Callable[[object], T]) -> T:
        """``Run.transact``, watched; a callable effect is counted and can be crashed inside."""
        index = self._begin("transact", key)
        crashed: list[bool] = []
        ran: list[bool] = []
        if callable(effect):
            inner = effect

            def watched(*args: Any) -> Any:
                self._count(key)
                ran.append(True)
                result = inner(*args)
                if inspect.isawaitable(result):
                    return self._after_async(result, index, crashed)
                if self._watch.due("inside", index):
                    crashed.append(True)
                    self._die()
                return result

            effect = watched
        value = await self._run.transact(key, effect, self._parser(index, key, parse))
        if ran and not crashed:  # the effect ran and the store let it commit
            trace = self._watch.trace
            trace.commits[key] = trace.commits.get(key, 0) + 1
            trace.runs_at[index] = trace.runs_at.get(index, 0) + 1
        return value

    async def _after_async(self, result: Awaitable[Any], index: int, crashed: list[bool]) -> Any:
        value = await result
        if self._watch.due("inside", index):
            crashed.append(True)
            self._die()
        return value

    async def awaiting(self, key: str, parse: Callable[[object], T]) -> T:
        """``Run.awaiting``, watched."""
        index = self._begin("awaiting", key)
        return await self._run.awaiting(key, self._parser(index, key, parse))

    async def sleep(self, key: str, until: datetime | timedelta) -> datetime:
        """``Run.sleep``, watched."""
        index = self._begin("sleep", key)
        deadline = await self._run.sleep(key, until)
        self._answer(index, deadline.isoformat())
        return deadline


def _contains_crash(exc: BaseException) -> bool:
    if isinstance(exc, _Crash):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_contains_crash(e) for e in exc.exceptions)
    return False


def _note_crash(trace: RunTrace) -> None:
    """Note what the run had recorded (as its passes saw it: a store that forgets a record must
    not hide the loss) and performed when its crash fell."""
    trace.crashed_at = len(trace.passes) - 1
    answered = (op.key for this in trace.passes for op in this.ops if op.answered)
    trace.recorded_at_crash = list(dict.fromkeys(answered))
    trace.performed_at_crash = len(trace.performed)


@contextlib.contextmanager
def _body_clock(start: datetime) -> Iterator[Any]:
    """The body's wall clock (``datetime.now``, ``date.today``, ``time.time``, ``time.localtime``...)
    on the store's, frozen between moves (``time-machine`` patches them process-wide, for one run).
    The monotonic clocks stay real: the event loop times its waits on them."""
    try:
        import time_machine
    except ImportError as exc:  # the testing extra's
        raise ImportError(
            "the workflow kit sets the body's clock with time-machine: "
            "pip install 'without-durability[testing]'"
        ) from exc

    with time_machine.travel(start, tick=False) as traveller:
        yield traveller


async def _drive(
    open_store: OpenStore,
    bodies: tuple[Body, Body],
    inputs: Mapping[str, object],
    crash: CrashPoint | None,
    ledger: EffectLedger,
) -> RunTrace:
    """One run: passes of ``bodies[0]`` until the crash falls, then of ``bodies[1]``, each on a
    fresh claim, until the body finishes or raises."""
    trace = RunTrace()
    watch = _Watch(crash, ledger, trace)
    ledger.start_run()
    async with open_store() as store:
        clock = store.clock
        if clock.real or not isinstance(clock, ManualTestClock):
            raise KitUnusable(
                f"store {store.name!r} keeps time on a server's clock, which the workflow kit "
                "cannot move: use --store memory or --store sqlite"
            )
        durable = store.durable
        # the body's clock is the store's: a pass after a sleep reads the time the store woke it at
        with _body_clock(clock.clock()) as body_clock:
            for _ in range(MAX_PASSES):
                body_clock.move_to(clock.clock())
                body = bodies[1] if watch.fired else bodies[0]
                this = _Pass()
                trace.passes.append(this)
                pass_ = await durable.checkpointer.claim(WORKFLOW, alive=_ALIVE, budget=_BUDGET)

                async def watched(run: Run[Any], body: Body = body, this: _Pass = this) -> object:
                    observed = _WatchedRun(run, watch, this)
                    value = await body(cast(Run[Any], observed))
                    if watch.due("before", len(this.ops)):
                        observed._die()
                    return value

                try:
                    outcome = await resume(durable, pass_, watched)
                except BaseException as exc:
                    if not _contains_crash(exc) and not this.crashed:
                        if not isinstance(exc, Exception):
                            raise
                        trace.raised = exc
                        await durable.checkpointer.release(pass_)
                        return trace
                    # the process died: its claim lapses (released here, so no virtual time passes)
                    _note_crash(trace)
                    await durable.checkpointer.release(pass_)
                    continue
                await durable.checkpointer.release(pass_)
                if this.crashed:  # the body caught the crash and returned: the process was dead anyway
                    _note_crash(trace)
                    continue
                if isinstance(outcome, Finished):
                    trace.result = outcome.value
                    trace.finished = True
                    return trace
                if isinstance(outcome, Sleeping):
                    now = await store.now()
                    if outcome.until > now:
                        await clock.advance(outcome.until - now)
                    continue
                assert isinstance(outcome, Blocked)
                missing = [k for k in outcome.waits if k not in inputs]
                if missing:
                    raise MissingInput(
                        f"the body waits for {', '.join(map(repr, missing))} (run.awaiting), which the "
                        f"inputs do not give: give each a value (inputs={{{missing[0]!r}: ...}}, or on the "
                        f"command line --input '{{\"{missing[0]}\": ...}}')"
                    )
                for key in outcome.waits:
                    await durable.arrive(WORKFLOW, key, inputs[key])
            return trace


# -- the report ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepReport:
    """One operation of the body, and how often its effect can run when a process dies."""

    key: str
    kind: Kind
    most_runs: int
    """The most times its effect ran in any one run (a transact: committed; 0 for sleeps and waits)."""

    @property
    def effect(self) -> str:
        """How often the effect can run, in words."""
        if self.kind == "transact":
            return "exactly once"
        if self.kind == "step":
            if self.most_runs <= 1:
                return "once (no crash repeated it)"
            return f"at most {self.most_runs} times (repeats if the process dies between effect and record)"
        return "no effect"


@dataclass(frozen=True)
class Problem:
    """Something that makes the body unsafe to run, named by key and crash point."""

    kind: Literal["nondeterministic", "repeated", "failed", "unfinished", "renamed", "shape"]
    key: str
    crash: str
    message: str

    def as_dict(self) -> dict[str, str]:
        """The problem as JSON-ready fields."""
        return {"kind": self.kind, "key": self.key, "crash": self.crash, "message": self.message}


@dataclass
class WorkflowReport:
    """What ``check_workflow`` (and ``check_upgrade``) found: ``valid`` is True only when no
    problem was found."""

    result: object
    steps: list[StepReport]
    runs: int
    problems: list[Problem]
    notes: list[str] = field(default_factory=list)
    replayed: int = 0
    """In-flight runs of an old version resumed on this one (``check_upgrade``)."""

    @property
    def valid(self) -> bool:
        """No problem found."""
        return not self.problems

    def explain(self) -> str:
        """Every problem on a line of its own (empty when valid)."""
        return "\n".join(f"{p.kind}: {p.message}" for p in self.problems)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "valid": self.valid,
            "result": self.result,
            "runs": self.runs,
            "replayed": self.replayed,
            "steps": [
                {"key": s.key, "kind": s.kind, "most_runs": s.most_runs, "effect": s.effect}
                for s in self.steps
            ],
            "problems": [p.as_dict() for p in self.problems],
            "notes": list(self.notes),
        }


def _describe_exc(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _compare(ref: RunTrace, trace: RunTrace, where: str) -> Problem | None:
    """The first place a pass of ``trace`` departs from the reference while it was handed the
    reference's own values, or ends differently after being handed all of them."""
    ref_ops = ref.final_ops
    for this in trace.passes:
        same = True
        for j, op in enumerate(this.ops):
            if j >= len(ref_ops):
                return Problem(
                    "nondeterministic",
                    op.key,
                    where,
                    f"crashed {where}, a resumed pass asked {op.kind} {op.key!r} after the reference "
                    f"had finished (the reference asked {len(ref_ops)} keys)",
                )
            want = ref_ops[j]
            if (op.kind, op.key) != (want.kind, want.key):
                return Problem(
                    "nondeterministic",
                    op.key,
                    where,
                    f"crashed {where}, a resumed pass asked {op.kind} {op.key!r} where the reference "
                    f"asked {want.kind} {want.key!r} (operation {j + 1}): a key or an order chosen "
                    "outside any step (random(), the wall clock, a dict or set order, a global)",
                )
            if not op.answered or op.value != want.value:
                same = False  # an effect that ran again may hand back another value: legitimately
                break
        last = this is trace.passes[-1] and trace.finished and len(this.ops) == len(ref_ops)
        if same and last and trace.result != ref.result:
            return Problem(
                "nondeterministic",
                ref_ops[-1].key if ref_ops else "",
                where,
                f"crashed {where}, the resumed run was handed every value the reference was and "
                f"returned {trace.result!r}, where the reference returned {ref.result!r}",
            )
    return None


def _store_opener(store: str | OpenStore) -> OpenStore:
    if not isinstance(store, str):
        return store
    try:
        kit = find_kit(store)
    except KitError as exc:
        raise KitUnusable(str(exc)) from exc

    @contextlib.asynccontextmanager
    async def open_one() -> AsyncIterator[StoreUnderTest[Any]]:
        with kit.server() as server:
            async with kit.open(server) as opened:
                yield opened

    return open_one


def _crash_points(ops: list[Op]) -> list[CrashPoint]:
    points = [CrashPoint("before", i) for i in range(len(ops) + 1)]
    for i, op in enumerate(ops):
        if op.kind in ("step", "transact"):
            points.append(CrashPoint("inside", i))
    return sorted(points, key=lambda p: (p.index, p.where == "inside"))


async def _reference(
    open_store: OpenStore, body: Body, inputs: Mapping[str, object], ledger: EffectLedger, label: str
) -> tuple[RunTrace, list[Problem]]:
    ref = await _drive(open_store, (body, body), inputs, None, ledger)
    problems: list[Problem] = []
    if ref.raised is not None:
        last = ref.passes[-1].ops[-1] if ref.passes and ref.passes[-1].ops else None
        hint = (
            " (a transact effect is written in its store's language: is this the store it was written for?)"
            if last is not None and last.kind == "transact" and not last.answered
            else ""
        )
        problems.append(
            Problem(
                "failed",
                last.key if last is not None else "",
                "no crash",
                f"{label} raised {_describe_exc(ref.raised)} without any fault: fix that first{hint}",
            )
        )
    elif [k for k, n in ref.effects.items() if n > 1]:
        key = next(k for k, n in ref.effects.items() if n > 1)
        problems.append(
            Problem(
                "repeated",
                key,
                "no crash",
                f"without any fault, the effect of {key!r} ran {ref.effects[key]} times: a pass "
                "after a wait did not find its record (the store lost it, or the key changed)",
            )
        )
    elif not ref.finished:
        problems.append(
            Problem("unfinished", "", "no crash", f"{label} did not finish in {MAX_PASSES} passes")
        )
    else:
        # passes before the last replay a prefix of the last one, or the body changed its mind
        for this in ref.passes[:-1]:
            for j, op in enumerate(this.ops):
                want = ref.final_ops[j] if j < len(ref.final_ops) else None
                if want is None or (op.kind, op.key) != (want.kind, want.key):
                    asked = f"{want.kind} {want.key!r}" if want else "nothing"
                    problems.append(
                        Problem(
                            "nondeterministic",
                            op.key,
                            "no crash",
                            f"without any fault, one pass asked {op.kind} {op.key!r} where the pass "
                            f"after its wait asked {asked} (operation {j + 1}): a key or an order "
                            "chosen outside any step",
                        )
                    )
                    break
            if problems:
                break
    return ref, problems


async def check_workflow(
    body: Body,
    *,
    store: str | OpenStore = "memory",
    inputs: Mapping[str, object] | None = None,
    ledger: EffectLedger | None = None,
) -> WorkflowReport:
    """Crash ``body`` at every step boundary and inside every step, resume it on fresh passes, and
    report how often each effect can run and whether the body replays deterministically.

    ``store`` is a kit name (``memory``, ``sqlite``; the body's ``transact`` effects must be in
    that store's language) or a function opening a fresh ``StoreUnderTest`` on a ``ManualTestClock``.
    ``inputs`` are the values the body awaits (``run.awaiting``), supplied when it blocks on them.
    ``ledger`` collects the counts (the kit's per key, and whatever the body's effects ``note``).

    Raises ``MissingInput`` when the body waits for a key ``inputs`` lacks and ``KitUnusable`` for
    a store the kit cannot use; every finding about the body itself is in the report.
    """
    opener = _store_opener(store)
    ledger = ledger if ledger is not None else EffectLedger()
    given = dict(inputs or {})
    ref, problems = await _reference(opener, body, given, ledger, "the body")
    ops = ref.final_ops
    most: dict[int, int] = dict(ref.runs_at)
    runs = 1
    if not problems:
        for point in _crash_points(ops):
            where = point.describe(ops)
            trace = await _drive(opener, (body, body), given, point, ledger)
            runs += 1
            for index, n in trace.runs_at.items():
                most[index] = max(most.get(index, 0), n)
            found = _judge(ref, trace, point, where)
            if found is not None:
                problems.append(found)
                break
    # by position: a transact's count is its commits (a crash inside it rolls its effect back)
    steps = [
        StepReport(op.key, op.kind, most.get(i, 0) if op.kind in ("step", "transact") else 0)
        for i, op in enumerate(ops)
    ]
    return WorkflowReport(ref.result, steps, runs, problems)


def _judge(ref: RunTrace, trace: RunTrace, point: CrashPoint, where: str) -> Problem | None:
    """The first problem one crashed run shows."""
    if trace.raised is not None:
        failed = trace.passes[-1].parse_failed
        return Problem(
            "failed",
            failed[0] if failed else (trace.final_ops[-1].key if trace.final_ops else ""),
            where,
            f"crashed {where}, the resumed run raised {_describe_exc(trace.raised)}, where the "
            "reference finished",
        )
    if not trace.finished:
        return Problem(
            "unfinished", "", where, f"crashed {where}, the run did not finish in {MAX_PASSES} passes"
        )
    found = _compare(ref, trace, where)
    if found is not None:
        return found
    kinds = {op.key: op.kind for this in trace.passes for op in this.ops}
    for key, n in trace.commits.items():
        if n > 1:
            return Problem(
                "repeated",
                key,
                where,
                f"crashed {where}, transact {key!r} committed {n} times: the store did not keep its record",
            )
    crashed_inside = ref.final_ops[point.index].key if point.where == "inside" else None
    for key in trace.recorded_at_crash:
        if kinds.get(key) == "step" and trace.effects.get(key, 0) > 1 and key != crashed_inside:
            return Problem(
                "repeated",
                key,
                where,
                f"crashed {where}, step {key!r} was recorded before the crash and its effect ran "
                f"{trace.effects[key]} times: a recorded step must never run again",
            )
    return None


async def check_upgrade(
    new: Body,
    old: Body,
    *,
    store: str | OpenStore = "memory",
    inputs: Mapping[str, object] | None = None,
) -> WorkflowReport:
    """Run ``old`` to each of its step boundaries, resume each such in-flight run with ``new``, and
    say whether every one can finish on it.

    A problem is reported (``valid`` False) when ``new`` performs an effect while a key ``old``
    recorded is never read by ``new`` (``renamed``: a renamed or reordered step, whose effect an
    in-flight run would perform again; both keys are named), when ``new``'s parser refuses a value
    ``old`` recorded (``shape``), or when ``new`` raises or does not finish (``failed``).
    """
    opener = _store_opener(store)
    given = dict(inputs or {})
    ledger = EffectLedger()
    ref, problems = await _reference(opener, old, given, ledger, "the old version")
    runs = 1
    if problems:
        return WorkflowReport(ref.result, [], runs, problems)
    ops = ref.final_ops
    replayed = 0
    notes: list[str] = []
    for i in range(len(ops) + 1):
        point = CrashPoint("before", i)
        where = point.describe(ops)
        trace = await _drive(opener, (old, new), given, point, ledger)
        runs += 1
        if trace.crashed_at is None:
            continue  # the old version never reached this point (it finished first)
        replayed += 1
        found = _judge_upgrade(trace, where, {op.key for op in ops})
        if found is not None:
            problems.append(found)
            break
        asked = {op.key for this in trace.passes[trace.crashed_at + 1 :] for op in this.ops}
        for key in trace.recorded_at_crash:
            if key not in asked:
                note = f"the new version never reads {key!r}, which the old version recorded"
                if note not in notes:
                    notes.append(note)
    return WorkflowReport(ref.result, [], runs, problems, notes, replayed)


def _judge_upgrade(trace: RunTrace, where: str, old_keys: set[str]) -> Problem | None:
    assert trace.crashed_at is not None
    resumed = trace.passes[trace.crashed_at + 1 :]
    for this in resumed:
        if this.parse_failed is not None:
            key, value, exc = this.parse_failed
            return Problem(
                "shape",
                key,
                where,
                f"an old run stopped {where} recorded {value!r} under {key!r}, and the new version's "
                f"parser refuses it ({_describe_exc(exc)}): give the new shape a new key, or parse both",
            )
    if trace.raised is not None:
        return Problem(
            "failed",
            "",
            where,
            f"an old run stopped {where} raised {_describe_exc(trace.raised)} when the new version resumed it",
        )
    if not trace.finished:
        return Problem(
            "unfinished", "", where, f"an old run stopped {where} did not finish on the new version"
        )
    asked = {op.key for this in resumed for op in this.ops}
    orphans = [k for k in trace.recorded_at_crash if k not in asked]
    recorded = set(trace.recorded_at_crash)
    # effects the new version performed under a key the old version never uses: a step the old
    # one goes on to (a removed step's successor) is not a rename
    performed = dict.fromkeys(trace.performed[trace.performed_at_crash :])
    fresh = [k for k in performed if k not in recorded and k not in old_keys]
    if orphans and fresh:
        return Problem(
            "renamed",
            orphans[0],
            where,
            f"an old run stopped {where} recorded {orphans[0]!r}, which the new version never reads, "
            f"and the new version performed {fresh[0]!r}: a renamed or reordered step, whose effect "
            f"an in-flight run would perform again (keep the key {orphans[0]!r}, or read it first)",
        )
    return None


class WorkflowKit:
    """``check_workflow`` and ``check_upgrade`` with one ``EffectLedger`` kept across calls: what
    the ``wd_workflow`` pytest fixture hands a test."""

    def __init__(self, store: str | OpenStore = "memory") -> None:
        self.store = store
        """The store every check runs on unless told otherwise."""
        self.ledger = EffectLedger()
        """Counts every effect by key, and whatever the body's effects ``note``."""

    async def check(
        self, body: Body, *, inputs: Mapping[str, object] | None = None, store: str | OpenStore | None = None
    ) -> WorkflowReport:
        """``check_workflow(body)`` on this kit's store and ledger."""
        chosen = self.store if store is None else store
        return await check_workflow(body, store=chosen, inputs=inputs, ledger=self.ledger)

    async def check_upgrade(
        self,
        new: Body,
        old: Body,
        *,
        inputs: Mapping[str, object] | None = None,
        store: str | OpenStore | None = None,
    ) -> WorkflowReport:
        """``check_upgrade(new, old)`` on this kit's store."""
        chosen = self.store if store is None else store
        return await check_upgrade(new, old, store=chosen, inputs=inputs)
