"""Scenario files: ``NAME.toml``, validated by pydantic, refused with file, field and the
expected form. The built-in ones ship inside this package (``wd_chaos/scenarios/``, read through
``importlib.resources``, so an installed wheel has them); a user's own are a path to a ``.toml``
file or a ``--scenario-dir`` folder of them.

A scenario is a workload (workflows, workers, leases, outside writers), a fault schedule (each
fault at a time after the start, for a duration, optionally repeated), the checks to run, the
evidence that the fault bit, and a seed. The seed fixes the workload and the schedule: ``plan``
turns the file into concrete fault events with a seeded ``random.Random``, so the same seed gives
the same schedule.
"""

from __future__ import annotations

import math
import os
import random
import tomllib
from collections.abc import Sequence
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from without_durability.testing.kit import Capability, KitError, resolve_or_missing

from .checks import bites, checkers, with_core
from .checks.coverage import windows
from .faults import EventSpec, FaultSpec, kind, kinds
from .fleet import Fleet

StoreName = str
"""A store kit's name or alias, installed under the entry points ``without_durability.stores``."""


def _known_check(name: str) -> str:
    if name not in checkers():
        raise ValueError(f"one of {', '.join(repr(n) for n in sorted(checkers()))}")
    return name


def _known_bite(name: str) -> str:
    if name not in bites():
        raise ValueError(f"one of {', '.join(repr(n) for n in sorted(bites()))}")
    return name


def _known_window(name: str) -> str:
    if name not in windows():
        raise ValueError(f"one of {', '.join(repr(n) for n in windows())}")
    return name


WindowName = Annotated[str, AfterValidator(_known_window)]
"""A coverage window's name (see ``wd_chaos.checks.coverage``)."""
CheckName = Annotated[str, AfterValidator(_known_check)]
"""A checker's name: any a module of ``wd_chaos.checks`` defines (see ``wd_chaos.checks.registry``)."""
CarelessRound = Literal[
    "refused-burst", "sweeps-beside-overruns", "claim-storm", "cancellations", "starved", "ticking-pass",
    "claim-burst", "plain-claims",
]  # fmt: skip
"""A careless client's round (``wd_chaos.client.clients.ROUNDS`` says what each does)."""
BiteName = Annotated[str, AfterValidator(_known_bite)]
"""A bite check's name, found the same way."""


def _default_checks() -> list[CheckName]:
    named = ["fencing", "first-writer-wins", "order", "exactly-once", "at-least-once", "liveness"]
    return with_core([*named, "monotonic-loads"])


BUILT_IN: Traversable = files("wd_chaos").joinpath("scenarios")
"""The scenarios that ship with the package (a folder of ``NAME.toml``), wherever it is installed."""
SCENARIO_DIR = BUILT_IN
"""The built-in scenarios' folder (the name older callers use)."""


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names the file, the field and the form expected."""


class UnknownName(ScenarioError):
    """A name that is not known: a scenario that does not exist, or a key a scenario file may not
    have (a typo); the message says which names come close. A usage error, not a broken file."""


def close_to(name: str, known: Sequence[str]) -> str:
    """``; did you mean 'x'?`` naming the known names closest to ``name`` (difflib), or ``""``."""
    import difflib

    near = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""


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
    wakeup: bool = False  # idle workers wait on the store's wakeup (Opened.wakeup), not a sleep
    wakeup_bound: Seconds = 1.0  # then the most a wakeup waits for an idle worker (wakeup-pickup)
    wakeup_resubscribe: Seconds = 6.0  # the store's re-subscribe bound after a wakeup-loss stops

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
    writers: Annotated[int, Field(ge=0, le=16)] = 2
    """Outside writer processes delivering ``messages`` and approvals; 0 (with ``messages = 0``):
    none, for a fault that kills every process of the run and restarts only workers."""
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
    careless_effects: Annotated[float, Field(ge=0, le=1)] = 0.0
    """The share of workflows whose passes first run the ledger transact with a careless effect
    (it writes, in three cases of four tries to COMMIT, and fails): the ``misuse`` checker judges
    that nothing of it stayed."""
    forged_keys: bool = False
    """Each outside writer also tries to supply a reserved ``wd/`` key to every workflow; the
    ``misuse`` checker judges that each was refused and nothing stored."""
    identity: Literal["own", "name"] = "own"
    """A worker's identity where its store lets one be named (a Redis stream's consumer name):
    ``own``, the store's default per process; ``name``, its process name (``worker-N``), so a
    restart or a replacement reuses its predecessor's, as a fixed pod name does."""
    careless_clients: Annotated[int, Field(ge=0, le=8)] = 0
    """Processes of careless clients beside the workers (``wd_chaos.client.clients``): refused input beside
    valid calls, cancelled calls, a pass with a renewal ticker, claim storms, sweeps beside
    overrunning passes, on workflows of their own, through a pool of one connection (judged by
    ``errors-classified``, ``cancelled-calls``, ``no-hung-pass`` and ``tokens-unique``)."""
    careless_ttl: Annotated[float, Field(ge=1, le=60)] = 1.0
    """The retention the careless clients' store is opened with (a Redis checkpointer's ``ttl``;
    seconds >= 1): their claim storms pause longer than it, so claim records expire between."""
    careless_rounds: list[CarelessRound] | None = Field(default=None, min_length=1)
    """The careless clients' rounds, in order (``wd_chaos.client.clients``); unset: every round but
    ``claim-burst``, which makes thousands of claims a round and is asked for by name."""

    @model_validator(mode="after")
    def _messages_need_writers(self) -> Workload:
        if self.writers == 0 and self.messages > 0:
            raise ValueError(
                f"messages = {self.messages} needs writers to deliver them; with writers = 0 set messages = 0"
            )
        return self


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


def _union(models: list[type[BaseModel]], tag: str) -> Any:
    """The discriminated union of ``models`` on ``tag``: pydantic picks the model by its value."""
    if len(models) == 1:
        return models[0]
    return Annotated[Union[tuple(models)], Field(discriminator=tag)]  # noqa: UP007 - built at run time


if TYPE_CHECKING:
    Fault = FaultSpec
    Event = EventSpec
else:
    Fault = _union([k.spec for k in kinds().values()], "kind")
    """A ``[[faults]]`` entry: one of the fault kinds' own models (``wd_chaos.faults``), by ``kind``."""
    Event = _union([k.event for k in kinds().values()], "fault")
    """A scheduled event: one of the fault kinds' own event models, by ``fault``."""


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
    """append: every this many deliveries an appender loads the workflow (read-your-writes); 0 never."""
    lapsing: Annotated[float, Field(ge=0, le=1)] = 0.0
    """take: the share of passes that claim with ``lapse_seconds`` of liveness and hand the
    workflow back at once, so their lease lapses while they load and record and the next taker's
    claim races their writes (the ``stale-landing`` checker judges what landed)."""
    lapse_seconds: Annotated[float, Field(gt=0, le=1)] = 0.003


class Scenario(_Strict):
    """One named scenario (see the module docstring)."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    description: str = ""
    seed: int = 1
    stores: list[StoreName] | None = Field(default=None, min_length=1)
    """Only these stores (kit names); unset: every installed kit that provides what it needs."""
    needs: list[Capability] = Field(default_factory=list)
    """What a store's kit must provide besides what the faults imply (see ``requires``)."""
    time_limit: TimeLimit = 30.0
    """The workload phase: faults happen inside it; then everything is healed."""
    shortest: TimeLimit | None = None
    """The shortest workload phase that can judge this scenario (its faults need that long to land
    and be recovered from): the chaos and mutant gates, which shorten every run, never run it for
    less. Unset: no floor beyond the gate's own."""
    heal_seconds: Seconds = 30.0
    """After the final heal, how long every workflow has to finish (liveness)."""
    lease: Lease = Lease()
    workload: Workload = Workload()
    faults: list[Fault] = Field(default_factory=list)
    storm: Storm | None = None
    checks: Annotated[list[CheckName], AfterValidator(with_core)] = Field(default_factory=_default_checks, min_length=1)
    """The checkers to run, then every core one they leave out (``wd_chaos.checks.CORE``, never dropped)."""
    bite: BiteName = "none"
    coverage: list[WindowName] = Field(default_factory=list)
    """Dangerous windows the run must reach; one reached 0 times makes it unknown (checks.coverage)."""
    lifecycle: Lifecycle | None = None  # retention and retries (long-wait): the library Worker client
    fleet: Fleet | None = None  # workers with different store settings (wd_chaos.fleet); unset: alike
    expect: Literal["valid", "lost-writes"] = "valid"
    """What a correct store gives here: ``valid``, or ``lost-writes`` where the deployment loses
    acknowledged writes by design (asynchronous replication across a failover), so the chaos
    gate requires ``durability`` to count them rather than the run to pass."""

    @field_validator("stores")
    @classmethod
    def _installed_kits(cls, stores: list[str] | None) -> list[str] | None:
        if stores is None:
            return None
        try:  # a kit registered but not loadable here stays: `wd-chaos list` says which extra
            return [resolve_or_missing(name) for name in stores]
        except KitError as exc:
            raise ValueError(str(exc)) from exc

    def requires(self) -> frozenset[Capability]:
        """What a store's kit must provide to run this scenario: worker processes always; a
        restartable server for a restart fault; a proxy-able address for a partition; a pause
        inside an open transaction for a stall inside ``transact``; a replicated deployment for a
        failover; and ``needs``."""
        out: set[Capability] = {"workers", *self.needs}
        for fault in self.faults:
            out |= kind(str(fault.kind)).requires(fault)
        return frozenset(out)

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
        return f"a 'kind' field: one of {_kind_names()}"
    return str(error.get("msg", "")).removeprefix("Value error, ")


def _kind_names() -> str:
    return ", ".join(repr(name) for name in kinds())


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
        elif part in kinds():
            continue  # the discriminator's branch name is noise in a field path
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field's annotation holds (through Optional, list and Annotated), if any."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _fields_at(loc: tuple[object, ...]) -> list[str]:
    """The keys a scenario file may have at ``loc`` (pydantic's error location of the table that
    holds an unknown key): the fields of the model there."""
    model: type[BaseModel] | None = Scenario
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int):
            continue
        if part in kinds() and str(part) not in model.model_fields:  # a fault's branch: its kind's model
            model = kinds()[str(part)].spec
            continue
        info = model.model_fields.get(str(part))
        model = None if info is None else _model_of(info.annotation)
    return sorted(model.model_fields) if model is not None else []


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
        unknown = False
        for err in exc.errors():
            loc = tuple(err["loc"])
            if err["type"] == "extra_forbidden":
                unknown = True
                fields = _fields_at(loc[:-1])
                lines.append(
                    f"{source}: {_where(loc)}: no such key{close_to(str(loc[-1]), fields)}"
                    + (f" (known here: {', '.join(fields)})" if fields else "")
                )
                continue
            got = err.get("input")
            shown = "" if err["type"] == "missing" else f", got {got!r}"
            lines.append(f"{source}: {_where(loc)}: expected {_expected(dict(err))}{shown}")
        raise (UnknownName if unknown else ScenarioError)("\n".join(lines)) from exc


def load_file(path: Traversable) -> Scenario:
    """Read and validate one scenario file (a ``Path`` or a packaged resource); its ``name`` must
    be the file's name without ``.toml``."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot read: {exc}") from exc
    stem = path.name.removesuffix(".toml")
    scenario = parse(text, str(path))
    if scenario.name != stem:
        raise ScenarioError(f"{path}: name: expected {stem!r} (the file's name), got {scenario.name!r}")
    return scenario


def _toml_files(directory: Traversable) -> list[Traversable]:
    return sorted((p for p in directory.iterdir() if p.name.endswith(".toml")), key=lambda p: p.name)


def available(dirs: Sequence[Path] = ()) -> dict[str, Traversable]:
    """Scenario names and their files: the built-in ones, then each of ``dirs`` (a user's
    ``--scenario-dir``) in order. Raises ``ScenarioError`` for a folder that does not exist and
    for a name found twice (a user's scenario may not shadow a built-in one or another's)."""
    found: dict[str, Traversable] = {p.name.removesuffix(".toml"): p for p in _toml_files(BUILT_IN)}
    for directory in dirs:
        if not directory.is_dir():
            raise ScenarioError(f"--scenario-dir {directory}: no such directory")
        for path in _toml_files(directory):
            name = path.name.removesuffix(".toml")
            if name in found:
                raise ScenarioError(_clash(path, name, found[name]))
            found[name] = path
    return found


def _clash(path: object, name: str, other: Traversable) -> str:
    where = "a built-in scenario" if _is_built_in(other) else f"the scenario in {other}"
    return (
        f"{path}: scenario name {name!r} is already {where}; rename the file and its name field "
        "so runs and reports tell them apart"
    )


def _is_built_in(path: Traversable) -> bool:
    return str(path).startswith(str(BUILT_IN))


def _looks_like_a_path(name: str) -> bool:
    return name.endswith((".toml", ".json")) or os.sep in name


def _load_run_scenario(path: Path) -> Scenario:
    """A run folder's ``scenario.json`` (the scenario as the run used it), as a shrink's replay
    command names it for a scenario that is not built in."""
    try:
        return Scenario.model_validate_json(path.read_text())
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ScenarioError(
            f"{path}: not a run's scenario.json: {_where(tuple(first['loc']))}: {_expected(dict(first))}"
        ) from exc


def find(name: str, dirs: Sequence[Path] = ()) -> Scenario:
    """Load the scenario called ``name`` (built in, or in one of ``dirs``), or the file at
    ``name`` when it is a path to a ``.toml`` file (or a run folder's ``scenario.json``). Raises ``ScenarioError`` naming what is wrong:
    no such scenario or file, a file that is not valid TOML or not a valid scenario, or a name
    that clashes with another scenario's."""
    if _looks_like_a_path(name):
        path = Path(name)
        if not path.is_file():
            raise ScenarioError(
                f"{name}: no such scenario file (give a scenario NAME from `wd-chaos list`, or the "
                "path of a .toml file or of a run's scenario.json)"
            )
        scenario = _load_run_scenario(path) if path.suffix == ".json" else load_file(path)
        known = available(dirs)
        other = known.get(scenario.name)
        if other is not None and Path(str(other)).resolve() != path.resolve():
            raise ScenarioError(_clash(path, scenario.name, other))
        return scenario
    files_ = available(dirs)
    if name not in files_:
        places = ", ".join(["the built-in scenarios", *(str(d) for d in dirs)])
        raise UnknownName(
            f"no scenario {name!r}{close_to(name, list(files_)) or ';'} available: {', '.join(files_) or 'none'} "
            f"(searched {places}; a path to a .toml file works too)"
        )
    return load_file(files_[name])


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
            event.update(kind(str(fault.kind)).plan(fault, scenario))
            events.append(event)
    events.sort(key=lambda e: float(str(e["at"])))
    return events


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
        for i, ev in enumerate(data):
            if isinstance(ev, dict) and "fault" in ev and ev["fault"] not in kinds():
                raise OptionError(
                    f"{source}: event [{i}].fault: expected one of {_kind_names()}, got {ev['fault']!r}"
                )
        events = TypeAdapter(list[Event]).validate_python(data)
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
