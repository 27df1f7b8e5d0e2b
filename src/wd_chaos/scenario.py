"""Scenario files: ``scenarios/NAME.toml``, validated by pydantic, refused with file, field and the
expected form.

A scenario is a workload (workflows, workers, leases, outside writers), a fault schedule (each
fault at a time after the start, for a duration, optionally repeated), the checks to run, the
evidence that the fault bit, and a seed. The seed fixes the workload and the schedule: ``plan``
turns the file into concrete fault events with a seeded ``random.Random``, so the same seed gives
the same schedule.
"""

from __future__ import annotations

import math
import random
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from .clockstep import ClockStepFault
from .clockstep import plan_fields as clockstep_fields

StoreName = Literal["sqlite", "postgres", "redis"]
CheckName = Literal[
    "fencing",
    "first-writer-wins",
    "order",
    "exactly-once",
    "at-least-once",
    "liveness",
    "take-exclusive",
    "monotonic-loads",
    # lifecycle (issue 14): see lifecycle_checks.py
    "ledger-once",
    "no-rerun",
    "nothing-lost",
    "arrivals",
    "attempt-limit",
    "lifecycle-liveness",
]

# Read off the Literal types, so a name is added in one place.
STORES: tuple[StoreName, ...] = get_args(StoreName)
CHECKS: tuple[CheckName, ...] = get_args(CheckName)
BITES = (
    "stall-fenced",
    "kill-between",
    "partition-refused",
    "restart-survived",
    "storm",
    "budget-fenced",
    "long-wait",
    "clock-step",
    "none",
)
FAILPOINTS = ("after-effect-before-record", "inside-transact", "after-claim")


def _all_stores() -> list[StoreName]:
    return list(STORES)


def _default_checks() -> list[CheckName]:
    return [
        "fencing",
        "first-writer-wins",
        "order",
        "exactly-once",
        "at-least-once",
        "liveness",
        "monotonic-loads",
    ]


SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names the file, the field and the form
    expected."""


class OptionError(ValueError):
    """A command-line value outside the bounds a scenario file is held to; the message names the
    option, the limit and the value."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False, description="a number of seconds > 0")]
TimeLimit = Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)]
"""A run's workload phase in seconds: the scenario files' ``time_limit`` and ``--time-limit``."""
WorkerCount = Annotated[int, Field(ge=1, le=64)]
"""Worker processes: the scenario files' ``workload.workers`` and ``--workers``."""
WorkflowCount = Annotated[int, Field(ge=1, le=10000)]
"""Workflows a run seeds: ``workload.workflows``, and what ``--time-limit`` scales it to."""


class Lease(_Strict):
    """The worker's lease settings, in seconds."""

    alive: Seconds = 1.0
    budget: Seconds = 4.0
    visibility: Seconds = 1.5
    poll_interval: Seconds = 0.05

    @model_validator(mode="after")
    def _budget_covers_alive(self) -> Lease:
        if self.budget < self.alive:
            raise ValueError(f"budget ({self.budget}) must be at least alive ({self.alive})")
        return self


class Workload(_Strict):
    """The test workflow and the outside writers."""

    workflows: WorkflowCount = 12
    workers: WorkerCount = 4
    messages: Annotated[int, Field(ge=0, le=100)] = 3
    writers: Annotated[int, Field(ge=1, le=16)] = 2
    step_seconds: Annotated[float, Field(ge=0)] = 0.3
    nap_seconds: Annotated[float, Field(ge=0)] = 0.5
    spread_seconds: Annotated[float, Field(ge=0)] = 8.0
    """Outside writers spread their arrivals over this many seconds from the start."""
    transact_seconds: Annotated[float, Field(ge=0)] = 0.0
    """How long a transact's effect takes inside its open transaction (Postgres only: SQLite
    holds its one write lock there, a Redis effect is a script)."""
    slow_first_seconds: Annotated[float, Field(ge=0)] = 0.0
    """When set, the first pass to run each workflow's ``charge`` step takes this long (longer
    than the budget: renewals must not carry it past the budget)."""
    client: Literal["harness", "worker"] = "harness"
    """Who runs the workflow: the harness's own explicit loop, or the library's ``Worker``."""
    readers: Annotated[int, Field(ge=0, le=16)] = 2
    """Processes that loop load and history on the workflows being written (the monotonic-loads
    checker judges what they saw, each replayed as a consumer walking the inbox with a cursor)."""
    read_pause: Annotated[float, Field(ge=0, le=10)] = 0.02
    """Seconds a reader waits between reads."""
    approve_after: Annotated[float, Field(ge=0)] = 1.0
    """Seconds after a workflow's start before the writers' approvals arrive (its wait)."""


class Lifecycle(_Strict):
    """Retention and retries, set small so waits outlast them (``long-wait``): the Redis
    checkpointer's ``ttl``, a background sweeper (Postgres ``sweep``) run every ``sweep_every``
    with ``older_than = sweep_age``, and ``failing`` workflows whose body always raises, retried
    by a ``RetryPolicy`` of ``max_attempts`` starting at ``retry_initial`` seconds."""

    ttl: Annotated[float, Field(ge=1, description="seconds >= 1 (Redis counts whole ms from 1 s)")] = 1.5
    sweep_age: Seconds = 1.0
    sweep_every: Seconds = 0.5
    failing: Annotated[int, Field(ge=0, le=1000)] = 2
    max_attempts: Annotated[int, Field(ge=1, le=100)] = 3
    retry_initial: Seconds = 0.3


class _Fault(_Strict):
    at: Annotated[float, Field(ge=0, description="seconds after the start")]
    every: Annotated[float | None, Field(gt=0)] = None
    count: Annotated[int, Field(ge=1, le=1000)] = 1
    jitter: Annotated[float, Field(ge=0)] = 0.0


class StallFault(_Fault):
    """SIGSTOP a worker that is inside a step's effect, for ``duration`` seconds (or ``over`` the
    lease: alive or budget plus ``margin``), then SIGCONT."""

    kind: Literal["stall"]
    inside: Literal["step", "transact"] = "step"
    """Which effect the stalled worker must be inside: a step's, or a transact's (Postgres)."""
    duration: Seconds | None = None
    over: Literal["alive", "budget"] | None = None
    margin: Seconds = 1.5

    @model_validator(mode="after")
    def _one_length(self) -> StallFault:
        if (self.duration is None) == (self.over is None):
            raise ValueError("give exactly one of duration (seconds) or over ('alive' | 'budget')")
        return self


class KillFault(_Fault):
    """Arm a failpoint in one worker: the worker SIGKILLs itself there; the harness restarts it."""

    kind: Literal["kill"]
    failpoint: Literal["after-effect-before-record", "inside-transact", "after-claim"]


class PartitionFault(_Fault):
    """Cut one worker from the store through its toxiproxy proxy for ``duration`` seconds."""

    kind: Literal["partition"]
    mode: Literal["down", "timeout", "latency", "reset_peer"] = "down"
    duration: Seconds = 3.0


class RestartFault(_Fault):
    """Restart the store server (SIGKILL, then start it on the same data)."""

    kind: Literal["restart"]


class WallStepFault(_Fault):
    """Step the wall clock a process-clock store (SQLite) reads, in every process of the run, by
    ``seconds`` (negative: back), as NTP or a resumed VM would; the harness's own clock, which the
    history is stamped by, does not move, so the checkers judge the store by real time. Skipped for a
    server's store, whose clock a run cannot step."""

    kind: Literal["wall-step"]
    seconds: float


Fault = Annotated[
    StallFault | KillFault | PartitionFault | RestartFault | WallStepFault | ClockStepFault,
    Field(discriminator="kind"),
]


class Storm(_Strict):
    """Locust load instead of the worker workload: ``take`` users answering deliveries, or
    ``append`` users delivering to a few workflows."""

    kind: Literal["take", "append"]
    users: Annotated[int, Field(ge=1, le=1000)] = 8
    spawn_rate: Annotated[float, Field(gt=0)] = 8.0
    seconds: Seconds = 8.0
    workflows: Annotated[int, Field(ge=1, le=100000)] = 4
    visits: Annotated[int, Field(ge=1, le=100000)] = 25
    """take: passes each workflow needs before a user finishes it (liveness checks they all did)."""
    readers: Annotated[int, Field(ge=0, le=100)] = 3
    """append: users besides ``users`` that loop load and history on the workflows being appended
    to (judged as the worker scenarios' readers are)."""
    read_pause: Annotated[float, Field(ge=0, le=10)] = 0.01
    """append: seconds a reader waits between reads."""
    check_own_every: Annotated[int, Field(ge=0, le=100000)] = 10
    """append: every this many deliveries an appender loads the workflow (read-your-writes); 0
    never."""


class Scenario(_Strict):
    """One named scenario (see the module docstring)."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    description: str = ""
    seed: int = 1
    stores: list[StoreName] = Field(default_factory=_all_stores, min_length=1)
    time_limit: TimeLimit = 30.0
    """The workload phase: faults happen inside it; then everything is healed."""
    heal_seconds: Seconds = 30.0
    """After the final heal, how long every workflow has to finish (liveness)."""
    lease: Lease = Lease()
    workload: Workload = Workload()
    faults: list[Fault] = Field(default_factory=list)
    storm: Storm | None = None
    checks: list[CheckName] = Field(default_factory=_default_checks, min_length=1)
    bite: Literal[
        "stall-fenced",
        "kill-between",
        "partition-refused",
        "restart-survived",
        "storm",
        "budget-fenced",
        "long-wait",
        "clock-step",
        "none",
    ] = "none"
    lifecycle: Lifecycle | None = None
    """Retention and retries (the ``long-wait`` scenario): needs the library Worker client."""

    @model_validator(mode="after")
    def _lifecycle_needs_the_worker(self) -> Scenario:
        if self.lifecycle is not None and self.workload.client != "worker":
            raise ValueError(
                "a [lifecycle] section needs workload.client = 'worker': only the library Worker "
                "records terminal states and retries"
            )
        return self


def _expected(error: dict[str, object]) -> str:
    kind = str(error.get("type", ""))
    ctx = error.get("ctx") or {}
    if kind == "literal_error" and isinstance(ctx, dict):
        return f"one of {ctx.get('expected')}"
    if kind == "extra_forbidden":
        return "no such field (check the spelling)"
    if kind == "missing":
        return "a value (this field is required)"
    if kind in ("greater_than", "greater_than_equal", "less_than_equal") and isinstance(ctx, dict):
        return str(error.get("msg", "")).lower().replace("input should be", "a number")
    if kind == "finite_number":
        return "a finite number"
    if kind.startswith(("float", "int")):
        return "a number"
    if kind.startswith("string"):
        return "a string" + (
            " matching " + str(ctx.get("pattern")) if isinstance(ctx, dict) and ctx.get("pattern") else ""
        )
    if kind == "union_tag_invalid" and isinstance(ctx, dict):
        return f"kind = one of {ctx.get('expected_tags')}"
    if kind == "union_tag_not_found":
        return "a 'kind' field: stall, kill, partition, restart, wall-step or clock-step"
    return str(error.get("msg", "")).removeprefix("Value error, ")


def bounded(kind: Any, value: object, what: str) -> Any:
    """``value`` checked against one of the bounded types above (``TimeLimit``, ``WorkerCount``,
    ``WorkflowCount``), so a command line meets the limits a scenario file does. Raises
    ``OptionError`` naming ``what``, the limit and the value."""
    try:
        return TypeAdapter(kind).validate_python(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise OptionError(f"{what}: expected {_expected(dict(err))}, got {value!r}") from exc


def _where(loc: tuple[object, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("stall", "kill", "partition", "restart", "wall-step", "clock-step"):
            continue  # the discriminator's branch name is noise in a field path
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def parse(text: str, source: str) -> Scenario:
    """Validate scenario TOML ``text``; ``source`` names it in errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{source}: not valid TOML: {exc}") from exc
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            got = err.get("input")
            shown = "" if err["type"] == "missing" else f", got {got!r}"
            lines.append(f"{source}: {_where(tuple(err['loc']))}: expected {_expected(dict(err))}{shown}")
        raise ScenarioError("\n".join(lines)) from exc


def load_file(path: Path) -> Scenario:
    """Read and validate one scenario file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc}") from exc
    scenario = parse(text, str(path))
    if scenario.name != path.stem:
        raise ScenarioError(f"{path}: name: expected {path.stem!r} (the file's name), got {scenario.name!r}")
    return scenario


def available(directory: Path = SCENARIO_DIR) -> dict[str, Path]:
    """Scenario names and their files."""
    return {p.stem: p for p in sorted(directory.glob("*.toml"))}


def find(name: str, directory: Path = SCENARIO_DIR) -> Scenario:
    """Load the scenario called ``name`` (or a path to a .toml file)."""
    as_path = Path(name)
    if as_path.suffix == ".toml" and as_path.exists():
        return load_file(as_path)
    files = available(directory)
    if name not in files:
        raise ScenarioError(f"no scenario {name!r}; available: {', '.join(files) or 'none'} (in {directory})")
    return load_file(files[name])


def plan(scenario: Scenario, seed: int, workers: int, time_limit: float) -> list[dict[str, object]]:
    """The concrete fault schedule: one event per fault occurrence, sorted by start time, with the
    target worker chosen by the seed. Faults starting after ``time_limit`` are dropped; a
    repeating fault (``every``) repeats ``count`` times per the scenario's own time limit, so a
    longer ``time_limit`` repeats it for longer."""
    rng = random.Random(f"{seed}:faults")
    events: list[dict[str, object]] = []
    # a longer run repeats its repeating faults for longer: "longer" also means "harder"
    stretch = max(1.0, time_limit / scenario.time_limit)
    for number, fault in enumerate(scenario.faults):
        count = fault.count if fault.every is None else math.ceil(fault.count * stretch)
        for i in range(count):
            start = fault.at + (fault.every or 0.0) * i + rng.uniform(0, fault.jitter)
            if start >= time_limit:
                break
            event: dict[str, object] = {
                "fault": fault.kind,
                "index": number,
                "at": round(start, 3),
                "target": f"worker-{rng.randrange(workers)}",
            }
            if isinstance(fault, StallFault):
                event["inside"] = fault.inside
                if fault.duration is not None:
                    event["duration"] = fault.duration
                else:
                    base = scenario.lease.alive if fault.over == "alive" else scenario.lease.budget
                    event["duration"] = round(base + fault.margin, 3)
                    event["over"] = fault.over
            elif isinstance(fault, KillFault):
                event["failpoint"] = fault.failpoint
            elif isinstance(fault, PartitionFault):
                event["mode"] = fault.mode
                event["duration"] = fault.duration
            elif isinstance(fault, WallStepFault):
                event["seconds"] = fault.seconds
                event["target"] = "store"
            elif isinstance(fault, ClockStepFault):
                event.update(clockstep_fields(fault))
            else:
                event["target"] = "store"
            events.append(event)
    events.sort(key=lambda e: float(str(e["at"])))
    return events


class ScheduledEvent(_Strict):
    """One event of a concrete fault schedule, as ``plan`` makes it and ``run.json`` records it;
    a replayed schedule (``wd-chaos run --schedule``) is held to this form."""

    fault: Literal["stall", "kill", "partition", "restart", "wall-step", "clock-step"]
    index: Annotated[int, Field(ge=0)] = 0
    """Which of the scenario's ``[[faults]]`` the event came from (informational on a replay)."""
    at: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    target: Annotated[str, Field(pattern=r"^(worker-[0-9]+|store)$")]
    inside: Literal["step", "transact"] | None = None
    duration: Annotated[float | None, Field(gt=0, le=3600, allow_inf_nan=False)] = None
    over: Literal["alive", "budget"] | None = None
    failpoint: Literal["after-effect-before-record", "inside-transact", "after-claim"] | None = None
    mode: Literal["down", "timeout", "latency", "reset_peer"] | None = None
    seconds: Annotated[float | None, Field(allow_inf_nan=False)] = None

    @model_validator(mode="after")
    def _fields_of_its_kind(self) -> ScheduledEvent:
        needs = {
            "stall": ("duration",),
            "partition": ("duration", "mode"),
            "kill": ("failpoint",),
            "wall-step": ("seconds",),
            "clock-step": ("seconds",),
            "restart": (),
        }[self.fault]
        missing = [name for name in needs if getattr(self, name) is None]
        if missing:
            raise ValueError(f"a {self.fault} event needs {', '.join(missing)}")
        return self


def parse_schedule(data: object, source: str) -> list[dict[str, object]]:
    """Validate a fault schedule: a JSON list of events, or a run's ``run.json`` (an object whose
    ``schedule`` is that list). Returns the events sorted by ``at``, as ``plan`` would give them,
    without the fields left unset. Raises ``OptionError`` naming ``source``, the event's index and
    the field."""
    if isinstance(data, dict) and "schedule" in data:
        data = data["schedule"]
    if not isinstance(data, list):
        raise OptionError(
            f"{source}: expected a JSON list of fault events (or a run.json with a 'schedule'), "
            f"got {type(data).__name__}"
        )
    try:
        events = TypeAdapter(list[ScheduledEvent]).validate_python(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            got = err.get("input")
            where = f"{source}: event {_where(tuple(err['loc']))}"
            if err["type"] == "value_error":
                lines.append(f"{where}: {_expected(dict(err))}")
                continue
            shown = "" if err["type"] == "missing" else f", got {got!r}"
            lines.append(f"{where}: expected {_expected(dict(err))}{shown}")
        raise OptionError("; ".join(lines)) from exc
    out = [e.model_dump(exclude_none=True) for e in events]
    out.sort(key=lambda e: float(str(e["at"])))
    return out


def load_schedule(path: Path) -> list[dict[str, object]]:
    """Read and validate a schedule file (``parse_schedule``); errors name the file."""
    import json

    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise OptionError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise OptionError(f"{path}: not valid JSON: {exc}") from exc
    return parse_schedule(data, str(path))
