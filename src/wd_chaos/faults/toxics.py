"""What the bad-network fault kinds share (``latency``, ``reset``, ``half-open``, ``slow-close``,
``bandwidth``, one module each): putting toxiproxy toxics on one worker's proxy for a while, the
history windows they leave, and the ``slow-network`` bite that asks every one of them to have bitten.

A toxic event picks a worker inside a step (as a partition does: a fault proves most on a worker
mid-pass), adds its kind's toxics to that worker's proxy, and removes them after ``duration``
seconds; the start and stop lines carry the worker's pid (``target_pid``). Only that worker's
connections are touched, and one worker's proxy is always left clean (a fault waits for one to be
free): the others keep the store, so they can take its workflows over.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from without_durability.testing.kit import Capability

from ..checks.bitten import injections
from ..checks.core import NOT_TESTED, UNKNOWN, Operation, Verdict, bite_check, operations
from ..rundir import FinalState
from .base import kinds
from .nemesis import Active

if TYPE_CHECKING:
    from ..history import Op
    from .nemesis import Nemesis

Seconds = Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False, description="a number of seconds > 0")]

FULL_WAIT = 8.0
"""The most the final heal waits for a ``full`` toxic fault to run its course."""

Toxics = list[tuple[str, str, dict[str, int]]]
"""The toxics one event adds: (toxiproxy type, stream, attributes)."""


class Proxies:
    """The run's toxiproxy and each worker's proxy, and the workers whose proxy a fault holds now
    (a cut or toxics): one state the partition and the toxic kinds share, so no two faults take one
    proxy at once."""

    def __init__(self, toxi: Any, proxies: dict[str, str]) -> None:
        self.toxi = toxi
        self.proxies = proxies
        self.cut: set[str] = set()


def proxies(nemesis: Nemesis) -> Proxies:
    """The run's proxies state (made from the nemesis's ``toxi`` and ``proxies`` services)."""
    return nemesis.state(
        "toxiproxy", lambda n: Proxies(n.services.get("toxi"), dict(n.services.get("proxies") or {}))
    )


def start_toxics(
    nemesis: Nemesis,
    ev: dict[str, Any],
    elapsed: float,
    toxics: Toxics,
    *,
    wait: float | None = None,
    full: bool = False,
) -> bool:
    """Put ``toxics`` on the proxy of a worker inside a step (the event's target if it is one), and
    leave an ``Active`` that removes them after ``ev["duration"]``. With none inside a step, wait
    ``wait`` s past the event's time, then take any worker whose proxy is free (``wait`` None: wait
    for one inside a step however long, for a kind that bites only a worker holding a claim)."""
    net = proxies(nemesis)
    busy = sorted(nemesis.busy("step") - nemesis.stopped - net.cut)
    if not busy and (wait is None or elapsed - float(ev["at"]) <= wait):
        return False
    free = sorted(set(net.proxies) - net.cut)
    if len(free) <= 1 or (not busy and not free):
        return False  # keep one worker's connections clean, to take the others' workflows over
    name = ev["target"] if ev["target"] in busy else nemesis.rng.choice(busy or free)
    proxy = net.proxies[name]
    pid = nemesis.pids().get(name)
    names = [f"{ev['id']}-{i}" for i in range(len(toxics))]
    for toxic, (kind, stream, attributes) in zip(names, toxics, strict=True):
        net.toxi.add(proxy, toxic, kind, stream, attributes)
    net.cut.add(name)
    nemesis.line({**ev, "target": name}, "start", target_pid=pid)

    ends = time.monotonic() + float(ev["duration"])

    def heal(name: str = name, pid: int | None = pid, ev: dict[str, Any] = ev) -> None:
        if full:
            time.sleep(min(FULL_WAIT, max(0.0, ends - time.monotonic())))
        for toxic in names:
            net.toxi.remove(proxy, toxic)
        net.cut.discard(name)
        nemesis.line({**ev, "target": name}, "stop", target_pid=pid)

    nemesis.active.append(Active(ends, ev, heal))
    return True


def requires(fault: Any) -> frozenset[Capability]:
    """A store reached at one network address, which a proxy can stand in front of."""
    return frozenset({"proxy"})


def services(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Toxiproxy between the workers and the store (what a partition uses)."""
    return {"partition": True}


Window = tuple[int, float, int]
"""One toxic event as the history shows it: its start and stop (monotonic ns; stop inf when the
run ended first) and the pid of the worker whose proxy carried it."""


def windows(ops: list[Op], fault: str) -> list[Window]:
    """Every ``fault`` event of the history with a target pid."""
    out = []
    for start, stop in injections(ops, fault):
        if start.get("target_pid") is None:
            continue
        end = float("inf") if stop is None else float(stop["mono"])
        out.append((int(start["mono"]), end, int(start["target_pid"])))
    return out


def pid_of(o: Operation) -> int:
    """The process that made an operation."""
    return int(o.invoke.get("pid") or 0)


def seconds(o: Operation) -> float:
    """How long an operation took (inf when it never completed)."""
    return (o.end - o.start) / 1e9


BiteFn = Callable[[list[Operation], list[Window], dict[str, Any]], list[dict[str, Any]]]

_BITES: dict[str, tuple[str, BiteFn, str]] = {}


def network_bite(fault: str, name: str, what: str) -> Callable[[BiteFn], BiteFn]:
    """Register ``fn`` as the bite of toxic kind ``fault``: its hits (evidence) given the run's
    operations, the kind's windows and its events' fields. It becomes the bite check ``name``
    (for a scenario of that kind alone) and a part of ``slow-network`` (every kind that ran)."""

    def register(fn: BiteFn) -> BiteFn:
        _BITES[fault] = (name, fn, what)
        return fn

    return register


def judge(ops: list[Op], fault: str) -> Verdict:
    """The bite verdict of toxic kind ``fault`` in this history (unknown when it did not bite)."""
    from ..checks.bitten import bit

    name, fn, what = _BITES[fault]
    found = windows(ops, fault)
    return bit(name, fn(operations(ops), found, {}) if found else [], len(found), what)


@bite_check("slow-network")
def slow_network(ops: list[Op], final: FinalState) -> Verdict:
    """Every bad-network kind the run injected bit (its own bite check found evidence); one that
    did not makes the run unknown, naming it."""
    kinds()  # imports every kind's module, so each has registered its bite
    ran = [f for f in sorted(_BITES) if any(o.get("fault") == f for o in ops if o["type"] == "fault")]
    verdicts = {f: judge(ops, f) for f in ran}
    counts = {f"{f} bit": int(v.counts.get("bit", 0)) for f, v in verdicts.items()}
    counts["faults"] = sum(int(v.counts.get("faults", 0)) for v in verdicts.values())
    missed = [f for f, v in verdicts.items() if v.valid is not True]
    listed = "; ".join(f"{f}: {v.summary}" for f, v in verdicts.items())
    evidence = [{"fault": f, **e} for f, v in verdicts.items() for e in v.evidence[:5]]
    if not ran or missed:
        counts["bit"] = 0
        return Verdict(
            "bite: slow-network",
            UNKNOWN,
            f"{NOT_TESTED}: {', '.join(missed) or 'no network fault ran'} ({listed or 'nothing injected'})",
            evidence,
            counts,
        )
    counts["bit"] = sum(counts[f"{f} bit"] for f in ran)
    return Verdict("bite: slow-network", True, f"every network fault bit: {listed}", evidence, counts)
