"""A failing simulated run's fault plan, reduced (``wd-chaos sim --shrink``).

A run's faults each have an id (``kill-3``: the nemesis's third event, a kill; ``lost-reply-2``:
the second reply the seed chose to lose; likewise ``stall-``, ``wall-step-``, ``reboot-``,
``timeout-``, ``duplicate-``). A run given a *plan* (a set of ids) injects only the faults the plan
names; everything else its seed draws stays as it was, and the run is a pure function of
``(scenario, seed, mutant, plan)``, so its replay gives the same history byte for byte.

The shrink is delta debugging (Zeller's ddmin, the one-minimal search): drop every fault, then each
kind of fault at once, then ever smaller chunks of those left, keeping a smaller plan whenever the
run with it still fails the checker that failed first. Leaving a fault out moves the schedule after
it, so a plan found is checked by running it, never assumed; the plan kept is the faults that run
actually injected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..scenario import Scenario


@dataclass(frozen=True)
class Shrunk:
    """A shrink's outcome: the checker it kept failing, the seed's plan and the smaller one."""

    seed: int
    checker: str
    before: tuple[str, ...]
    """The faults the seed's own run injected."""
    plan: tuple[str, ...]
    """The smallest plan found whose run still fails ``checker`` (the faults that run injected)."""
    runs: int
    """Simulated runs the shrink spent."""
    complete: bool
    """False when the run budget ran out before no single fault could be dropped."""


def plan_text(plan: tuple[str, ...] | list[str]) -> str:
    """A plan as ``--faults`` takes it: ids joined by commas, ``none`` for the empty plan."""
    return ",".join(plan) if plan else "none"


def parse_plan(text: str) -> frozenset[str]:
    """``--faults``' value as a plan; ``ValueError`` naming an id that is not ``kind-N``."""
    if text.strip() == "none":
        return frozenset()
    ids = [part.strip() for part in text.split(",") if part.strip()]
    for fault in ids:
        kind, _, number = fault.rpartition("-")
        if not kind or not number.isdigit():
            raise ValueError(
                f"--faults: {fault!r} is not a fault id such as kill-3 or lost-reply-2 "
                "(give ids joined by commas, or none)"
            )
    return frozenset(ids)


def _kind(fault: str) -> str:
    return fault.rpartition("-")[0]


def shrink(
    scenario: Scenario,
    seed: int,
    run: Callable[[frozenset[str] | None], Any],
    *,
    budget: int = 200,
) -> Shrunk | None:
    """Shrink ``seed``'s fault plan; ``run(plan)`` is one simulated run's ``Result`` with that plan
    (None: the seed's own). None when the seed's own run does not fail. At most ``budget`` runs
    beyond the first."""
    first = run(None)
    failing = first.failing()
    if not failing:
        return None
    checker = failing[0]
    spent = 0

    def fails(plan: list[str]) -> list[str] | None:
        """The faults a run with ``plan`` injected, when it still fails ``checker``."""
        nonlocal spent
        spent += 1
        result = run(frozenset(plan))
        return list(result.fired) if checker in result.failing() else None

    current: list[str] = list(first.fired)
    # the cheap guesses first: no fault at all, then without each kind of fault at once
    if current and spent < budget:
        kept = fails([])
        if kept is not None:
            current = kept
    for kind in sorted({_kind(f) for f in current}):
        if spent >= budget or not current:
            break
        trial = [f for f in current if _kind(f) != kind]
        if len(trial) < len(current):
            kept = fails(trial)
            if kept is not None:
                current = kept
    # ddmin: drop each of n chunks in turn; on no luck, chunks half the size
    chunks = 2
    complete = not current
    while current and spent < budget:
        size = -(-len(current) // chunks)
        dropped = tried_all = False
        for start in range(0, len(current), size):
            if spent >= budget:
                break
            kept = fails(current[:start] + current[start + size :])
            if kept is not None:
                current = kept
                chunks = max(chunks - 1, 2)
                dropped = True
                break
        else:
            tried_all = True
        if dropped:
            complete = not current
            continue
        if size == 1 and tried_all:
            complete = True  # one-minimal: no single fault can go
            break
        chunks = min(chunks * 2, len(current))
    return Shrunk(seed, checker, tuple(first.fired), tuple(current), spent, complete)
