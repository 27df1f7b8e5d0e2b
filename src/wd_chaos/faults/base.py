"""What a fault kind is (``FaultKind``) and where kinds are found (``kinds``): every ``FaultKind``
defined in a module of this package, by its name. Adding a fault kind is adding a module; the
scenario loader, the schedule replay, the nemesis, the report and the CLI ask the registry and name
no kind themselves."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from without_durability.testing.kit import Capability

from ..history import Op

TARGET_WAIT = 6.0
"""How long a fault that wants a busy worker (a stall, a cut, a step) waits for one to be inside an
effect before it gives up on that event (a stall) or goes ahead anyway (the others)."""


class FaultSpec(BaseModel):
    """The fields every ``[[faults]]`` entry has: when (``at`` seconds after the start, plus up to
    ``jitter``), and how often (``count`` times, ``every`` seconds apart). A kind's own entry
    subclasses it with ``kind: Literal[NAME]`` and its fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: Annotated[float, Field(ge=0, description="seconds after the start")]
    every: Annotated[float | None, Field(gt=0)] = None
    count: Annotated[int, Field(ge=1, le=1000)] = 1
    jitter: Annotated[float, Field(ge=0)] = 0.0
    kind: str
    """The kind's name (a subclass narrows it to ``Literal[NAME]``)."""


class EventSpec(BaseModel):
    """One event of a concrete fault schedule, as ``scenario.plan`` makes it and ``run.json``
    records it; a replayed schedule (``wd-chaos run --schedule``) is held to this form. A kind's
    own event subclasses it with ``fault: Literal[NAME]``, its fields (None when unset) and
    ``NEEDS``, the fields its events must have."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    NEEDS: ClassVar[tuple[str, ...]] = ()

    fault: str
    index: Annotated[int, Field(ge=0)] = 0
    """Which of the scenario's ``[[faults]]`` the event came from (informational on a replay)."""
    at: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    target: Annotated[str, Field(pattern=r"^(worker-[0-9]+|store)$")]

    @model_validator(mode="after")
    def _fields_of_its_kind(self) -> EventSpec:
        missing = [name for name in self.NEEDS if getattr(self, name) is None]
        if missing:
            raise ValueError(f"a {self.fault} event needs {', '.join(missing)}")
        return self


# The nemesis is ``Any`` here: ``nemesis`` looks kinds up in this module, so naming its class here
# (even for typing only) would make the two modules a cycle. A kind's own functions name it.
Start = Callable[[Any, dict[str, Any], float], bool]
"""The nemesis's action (called with the ``nemesis.Nemesis``) for one due event (with its ``id``)
at ``elapsed`` seconds: True when done
(started, or skipped with a line saying why), False to be asked again on the next tick."""


Launch = Callable[[Path], tuple[list[str], dict[str, str]]]
"""How a process of the run started now is launched (given the run's folder): words put before
its command line and variables added to its environment, ``([], {})`` for no change."""


def _nothing_required(fault: Any) -> frozenset[Capability]:
    return frozenset()


def _no_services(events: list[dict[str, Any]]) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Marker:
    """How the report's timeline draws one phase of a kind's fault lines: a vertical line."""

    phase: str
    width: float = 0.8
    style: str = ":"


@dataclass(frozen=True)
class SimulatedForm:
    """How ``wd-chaos sim``'s nemesis draws a kind (its simulated form), in the kind's module.

    At each nemesis event the simulator draws one number in [0, 1) and walks the forms of every
    kind that has one, by ``order``, each over its ``share`` (shares scaled to sum to 1): the
    first whose cumulative bound is above the draw and that ``applies`` is injected, with the
    event's number ``n``. ``applies`` and ``inject`` are given the simulated run (``sim.world.Sim``:
    its ``rng``, ``world.permits``, ``workers``, ``lease`` and the primitives ``crash``, ``hold``,
    ``reboot`` and ``step_wall``, each told the kind's name for its fault lines); ``inject`` draws
    what the event needs from ``sim.rng`` and asks ``sim.world.permits`` before it acts, so a
    shrunk plan can leave the event out."""

    order: int
    share: float
    inject: Callable[[Any, int], Awaitable[None]]
    applies: Callable[[Any], bool] = lambda sim: True


@dataclass(frozen=True)
class FaultKind:
    """Everything about one kind of fault, in the kind's own module.

    ``name`` is the ``kind`` of a ``[[faults]]`` entry and the ``fault`` of its events; ``spec``
    validates the entry and ``event`` a scheduled event; ``plan`` gives an event's fields besides
    ``fault``, ``index``, ``at`` and ``target`` (it may set ``target`` to ``"store"``); ``start``
    is the nemesis's action; ``heal`` (optional) undoes what is left at the final heal;
    ``requires`` says what a store's kit must provide for an entry (capabilities); ``services``
    what the run's servers must offer for its events (keyword arguments of
    ``services.services``, such as ``partition`` or ``restart``). Its bite checks are
    ``checks.core.bite_check`` functions defined in the same module. The report shades its
    start-to-stop windows (``window``) in ``color``, draws ``markers`` (a kind with neither: a
    line at each start) and lists ``detail``; ``describe`` (optional) adds to the report's text.
    ``launch`` (optional) changes how every process the run starts from then on is launched (a
    ``reboot`` starts them on the rebooted machine's clock).

    What a kind remembers during a run is its own (Jepsen's nemesis protocol): a module-level
    ``setup(nemesis)`` makes a per-run state object, which ``start`` (invoke) and ``heal``
    (teardown) get with ``nemesis.state(NAME, setup)``; a state that subclasses
    ``nemesis.KindState`` tells the other kinds which workers it holds stopped or spares. The
    nemesis itself keeps only what is common to every kind."""

    name: str
    spec: type[BaseModel]
    event: type[EventSpec]
    plan: Callable[[Any, Any], dict[str, object]]
    start: Start
    requires: Callable[[Any], frozenset[Capability]] = _nothing_required
    services: Callable[[list[dict[str, Any]]], dict[str, Any]] = _no_services
    heal: Callable[[Any], None] | None = None
    """Called with the ``nemesis.Nemesis`` at the final heal."""
    color: str = "#999999"
    window: bool = False
    markers: tuple[Marker, ...] = ()
    describe: Callable[[list[Op]], str] | None = None
    """An HTML paragraph for the report about what this kind did in the run ('' for nothing)."""
    detail: tuple[str, ...] = ()
    """The fields of its fault lines the report's fault table shows."""
    launch: Launch | None = None
    """Called by the cluster each time it starts a process of the run (see ``launching``)."""
    simulated: str = ""
    """What ``wd-chaos sim`` draws in this kind's place ('' for nothing): a scenario whose kinds
    all have a simulated form is one ``wd-chaos sim --all`` runs."""
    form: SimulatedForm | None = None
    """How sim's nemesis draws this kind (None: it draws nothing of its own; the wire or another
    kind's form stands for it, as ``simulated`` says)."""


PACKAGE = "wd_chaos.faults"


@functools.cache
def kinds() -> dict[str, FaultKind]:
    """Every fault kind by name, found in this package's modules (sorted by module name)."""
    found: dict[str, FaultKind] = {}
    path = importlib.import_module(PACKAGE).__path__
    for info in sorted(pkgutil.iter_modules(path), key=lambda i: i.name):
        module = importlib.import_module(f"{PACKAGE}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, FaultKind) and found.setdefault(value.name, value) is not value:
                raise RuntimeError(
                    f"two fault kinds are named {value.name!r}: {found[value.name].spec.__module__} and "
                    f"{module.__name__}; rename one (scenario files name kinds)"
                )
    return found


def simulated_forms() -> list[tuple[float, str, SimulatedForm]]:
    """Every kind's simulated form by ``order``, with its cumulative bound in [0, 1] and the kind's
    name: what ``wd-chaos sim``'s nemesis draws from (``SimulatedForm``)."""
    forms = sorted(
        ((k.form, name) for name, k in kinds().items() if k.form is not None), key=lambda f: f[0].order
    )
    total = sum(form.share for form, _ in forms) or 1.0
    out: list[tuple[float, str, SimulatedForm]] = []
    bound = 0.0
    for form, name in forms:
        bound += form.share
        out.append((bound / total, name, form))
    return out


def kind(name: str) -> FaultKind:
    """The fault kind called ``name``; ``KeyError`` for one no module defines."""
    return kinds()[name]


def service_needs(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What the run's servers must offer for ``events`` (each needs only its ``fault``), merged
    over the kinds that occur: keyword arguments of ``services.services`` and
    ``services.check_available``."""
    out: dict[str, Any] = {}
    for name, k in kinds().items():
        mine = [e for e in events if e.get("fault") == name]
        if mine:
            out.update(k.services(mine))
    return out


def launching(run_dir: Path) -> tuple[list[str], dict[str, str]]:
    """How a process of the run in ``run_dir`` started now is launched: every kind's ``launch``
    prefix (in kind order) and environment, merged; ``([], {})`` while no fault has changed it."""
    prefix: list[str] = []
    env: dict[str, str] = {}
    for k in kinds().values():
        if k.launch is not None:
            more, extra = k.launch(run_dir)
            prefix += more
            env.update(extra)
    return prefix, env
