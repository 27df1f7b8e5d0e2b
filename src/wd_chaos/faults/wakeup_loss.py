"""The ``wakeup-loss`` fault: half-open only the workers' wakeup connections (Postgres's LISTEN
session, a Redis stream's blocking read) while they idle, through toxiproxy, leaving their store
connections alone; and the ``wakeup-pickup`` checker that says whether the wakeup came back.

A run with ``[lease] wakeup = true`` gives every worker a wakeup (``Opened.wakeup``) it waits on
when idle, and with a ``wakeup-loss`` fault each worker's wakeup its own toxiproxy proxy
(``wakeup_url`` in its spec; ``services.services(wakeup_proxy=True)``). The fault waits (up to
``TARGET_WAIT`` s) until no worker is inside a step, then puts toxiproxy's ``timeout`` toxic (no
timeout: nothing gets through either way, no error) on every worker's wakeup proxy for
``duration`` seconds: their wakeups go silent, as a proxy, a NAT or a failover leaves a connection,
and meanwhile due work waits for the workers' polls. Removing the toxic closes the connections it
held (toxiproxy does), so by then a wakeup must notice and subscribe again on a new connection,
within the bound its store documents (``[lease] wakeup_resubscribe``).

``wakeup-pickup``: outside every fault window (a ``wakeup-loss`` one extended by
``wakeup_resubscribe``), a wakeup (``schedule`` due now, ``arrive``, ``deliver``) of a workflow
nobody held (``pickup``'s rule) must be picked up within ``wakeup_bound`` whenever a worker was
idle on its wakeup when it landed (its last take had found nothing, and its next take began later than the bound):
a pickup that waited longer shows the wakeup did not wake the idle worker, so pickup fell back to
the poll interval (a dead wakeup never subscribed again). Its bite (``wakeup-resubscribed``): a
wakeup-loss with idle workers, a wakeup lost and subscribed again by a worker (its ``wakeup``
lines), and after the re-subscribe bound a wakeup picked up by an idle worker within
``wakeup_bound``, long before its poll interval.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Literal

from ..checks.bitten import bit
from ..checks.core import UNKNOWN, Operation, Verdict, bite_check, checker, operations
from ..checks.pickup import fault_windows, held_at
from ..checks.queue_calls import PROBE, Queue, final_key, is_wakeup
from ..rundir import FinalState
from .base import TARGET_WAIT, EventSpec, FaultKind, FaultSpec
from .nemesis import Active
from .toxics import Seconds, pid_of, requires

if TYPE_CHECKING:
    from ..history import Op
    from .nemesis import Nemesis

NAME = "wakeup-loss"


class WakeupLossFault(FaultSpec):
    """Make every worker's wakeup connection half-open for ``duration`` seconds, while they idle."""

    kind: Literal["wakeup-loss"]
    duration: Seconds = 4.0


class WakeupLossEvent(EventSpec):
    """A scheduled wakeup loss: for how long."""

    NEEDS = ("duration",)
    fault: Literal["wakeup-loss"]
    duration: Seconds | None = None


def plan(fault: WakeupLossFault, scenario: Any) -> dict[str, object]:
    """The fault's length."""
    return {"duration": fault.duration}


def services(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Toxiproxy, with a proxy of its own for each worker's wakeup."""
    return {"partition": True, "wakeup_proxy": True}


READY = 2.0
"""Seconds every worker must have been up before a wakeup-loss starts: a worker opens its wakeup
when it first idles, and one that never had it cannot lose it."""


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    """Once every worker has been up ``READY`` s and none is inside a step (or after
    ``TARGET_WAIT`` s more), hold everything on every worker's wakeup proxy for ``duration`` s."""
    toxi = nemesis.services.get("toxi")
    wakeups: dict[str, str] = dict(nemesis.services.get("wakeup_proxies") or {})
    if toxi is None or not wakeups:
        nemesis.line(ev, "skipped", why="no wakeup proxies (the run has no [lease] wakeup)")
        return True
    names = sorted(wakeups)
    up: dict[str, float] = nemesis.state(NAME, lambda n: {})
    if "since" not in up:
        if not all(nemesis.pids().get(n) for n in names):
            return False
        up["since"] = elapsed
    if elapsed - up["since"] < READY:
        return False
    busy = nemesis.busy("step")
    if busy and elapsed - max(float(ev["at"]), up["since"] + READY) <= TARGET_WAIT:
        return False
    for name in names:
        for stream in ("upstream", "downstream"):
            toxi.add(wakeups[name], f"{ev['id']}-{stream}", "timeout", stream, {"timeout": 0})
    pids = nemesis.pids()
    idle = sorted(set(names) - set(busy))
    nemesis.line(ev, "start", targets=names, idle=idle, target_pids=[pids.get(n) for n in names])

    def heal() -> None:
        for name in names:
            for stream in ("upstream", "downstream"):
                toxi.remove(wakeups[name], f"{ev['id']}-{stream}")
        nemesis.line(ev, "stop", targets=names)

    nemesis.active.append(Active(time.monotonic() + float(ev["duration"]), ev, heal))
    return True


def heal_all(nemesis: Nemesis) -> None:
    """Remove every toxic from the wakeup proxies."""
    toxi = nemesis.services.get("toxi")
    for proxy in dict(nemesis.services.get("wakeup_proxies") or {}).values():
        if toxi is not None:
            toxi.heal(proxy)


def _losses(ops: list[Op]) -> list[tuple[float, float, list[str]]]:
    """Each wakeup-loss's start and stop (monotonic ns; inf when the run ended first) and the
    workers idle at its start."""
    lines = [o for o in ops if o.get("type") == "fault" and o.get("fault") == NAME]
    out = []
    for s in (o for o in lines if o.get("phase") == "start"):
        stop = next((o for o in lines if o.get("phase") == "stop" and o.get("id") == s.get("id")), None)
        out.append((float(s["mono"]), float(stop["mono"]) if stop else float("inf"), list(s.get("idle") or [])))
    return out


def _bounds(final: FinalState) -> tuple[float, float] | None:
    """The run's ``wakeup_bound`` and ``wakeup_resubscribe`` in ns, None for a run without wakeups."""
    got = final_key(final, "wakeup")
    if not isinstance(got, dict):
        return None
    return float(got["bound"]) * 1e9, float(got["resubscribe"]) * 1e9


def measure(ops: list[Op], final: FinalState) -> dict[str, Any]:
    """Every wakeup of a free workflow judged against the wakeup bound: ``late`` (evidence lists),
    ``prompt`` (deliveries picked up within the bound, each with whether it came after a loss's
    re-subscribe bound), ``unjudged`` by reason."""
    out: dict[str, Any] = {"late": [], "prompt": [], "unjudged": {}}
    bounds = _bounds(final)
    if bounds is None:
        return out
    bound, resub = bounds
    all_ops = operations(ops)
    q = Queue.of(all_ops)
    losses = _losses(ops)
    windows = [(b, e + resub) for b, e, _ in losses]
    others = [(b, e) for b, e in fault_windows(ops) if not any(lb <= b <= le for lb, le, _ in losses)]
    takes_by: dict[int, list[Operation]] = {}
    for o in all_ops:
        if o.f == "take" and o.ok and not o.invoke.get("probe"):
            takes_by.setdefault(pid_of(o), []).append(o)
    for group in takes_by.values():
        group.sort(key=lambda o: o.start)

    def skip(why: str) -> None:
        out["unjudged"][why] = out["unjudged"].get(why, 0) + 1

    picked: set[int] = set()  # pickup takes judged already: wakeups one take picked up count once
    for wf, wakeups in q.wakeups.items():
        if wf.startswith(PROBE):
            continue
        for w in wakeups:
            if not w.ok or w.complete is None or not is_wakeup(w):
                continue
            state, due, _ = held_at(q, wf, w)
            if state != "free":  # its holder takes again after answering: no wakeup is needed
                skip("held when it arrived")
                continue
            taker = next((t for t in q.takes.get(wf, []) if t.end > w.start), None)
            if taker is None:
                skip("never taken")
                continue
            if id(taker) in picked:
                skip("picked up by the take of an earlier wakeup")
                continue
            picked.add(id(taker))
            if any(b <= taker.end and e >= w.start for b, e in windows + others):
                skip("a fault (or a wakeup's re-subscribe window) while it waited")
                continue
            wait = taker.start - due
            idle = []
            for takes in takes_by.values():
                before = [t for t in takes if t.end <= due]
                after = [t for t in takes if t.start > before[-1].end] if before else []
                if not before or before[-1].got("workflow") or not after or after[0].start <= due:
                    continue
                idle.append((before[-1], after[0]))
            if wait <= bound:
                after_loss = any(e + resub < due for _, e, _ in losses)
                out["prompt"].append((w, taker, wait, after_loss, bool(idle)))
                continue
            asleep = [(last, nxt) for last, nxt in idle if nxt.start > due + bound]
            if not asleep:
                skip("late with no worker idle on its wakeup (a busy fleet)")
                continue
            last, nxt = asleep[0]
            out["late"].append([
                w.brief(f"a wakeup of {wf!r}: due here"),
                last.brief(f"found nothing: pid {pid_of(last)} idle on its wakeup"),
                nxt.brief(f"pid {pid_of(nxt)} took again only {(nxt.start - due) / 1e6:.0f} ms after it was due"),
                taker.brief(f"picked up {wait / 1e6:.0f} ms after it was due, past the wakeup bound of {bound / 1e6:.0f} ms"),
            ])
    return out


@checker("wakeup-pickup")
def wakeup_pickup(ops: list[Op], final: FinalState) -> Verdict:
    """With wakeups on (``[lease] wakeup``), every wakeup of a free workflow outside a fault (and
    outside a wakeup-loss's re-subscribe window) is picked up within ``wakeup_bound`` whenever a
    worker was idle on its wakeup when it became due; unknown for a run without wakeups."""
    bounds = _bounds(final)
    if bounds is None:
        return Verdict("wakeup-pickup", UNKNOWN, "not judged: the run's workers had no wakeup", [], {})
    got = measure(ops, final)
    late, prompt = got["late"], got["prompt"]
    counts = {
        "late": len(late),
        "prompt": len(prompt),
        "bound_ms": round(bounds[0] / 1e6),
        **{f"not judged: {k}": v for k, v in sorted(got["unjudged"].items())},
    }
    if late:
        return Verdict(
            "wakeup-pickup",
            False,
            f"{len(late)} wakeup(s) not picked up within {bounds[0] / 1e9:g}s while a worker idled "
            "on its wakeup: the wakeup did not wake it",
            [e for group in late for e in group],
            counts,
        )
    return Verdict(
        "wakeup-pickup",
        True,
        f"{len(prompt)} wakeup(s) picked up within {bounds[0] / 1e9:g}s; none late beside an idle worker",
        [],
        counts,
    )


@bite_check("wakeup-resubscribed")
def wakeup_resubscribed(ops: list[Op], final: FinalState) -> Verdict:
    """A wakeup-loss found workers idle; a worker's wakeup was lost and subscribed again (its
    ``wakeup`` lines) after the fault began; and after the loss's re-subscribe bound a wakeup was
    picked up within the wakeup bound by a worker that had been idle on its wakeup."""
    losses = [(b, e) for b, e, idle in _losses(ops) if idle]
    resub = (_bounds(final) or (0.0, 0.0))[1]
    lines = [o for o in ops if o.get("type") == "info" and o.get("what") == "wakeup"]
    hits: list[dict[str, Any]] = []
    prompt = [p for p in measure(ops, final)["prompt"] if p[3] and p[4]]
    for b, e in losses:
        again = [o for o in lines if float(o["mono"]) > b and int(o.get("resubscribed") or 0) > 0]
        later = [p for p in prompt if p[0].end > e + resub]
        if again and later:
            taker, wait = later[0][1], later[0][2]
            hits.append(
                taker.brief(
                    f"after the wakeup-loss ({(e - b) / 1e9:.1f}s) and its re-subscribe bound, picked up "
                    f"{wait / 1e6:.0f} ms after the wakeup; {len(again)} worker line(s) say a wakeup "
                    "was lost and replaced"
                )
            )
    return bit("wakeup-resubscribed", hits, len(losses), "wakeups replaced and waking idle workers after")


WAKEUP_LOSS = FaultKind(
    NAME,
    WakeupLossFault,
    WakeupLossEvent,
    plan,
    start,
    requires=requires,
    services=services,
    heal=heal_all,
    color="#9c755f",
    window=True,
    detail=("duration",),
)
