"""Chaos runs as a CI gate's cases, with no test framework in sight (``pytest_plugin`` is the pytest
face of it): which (scenario, store) pairs a selection names, one case run until it gives a real
verdict, and the text that says why a verdict was not the one its scenario expects.

A run that comes out unknown (its fault did not bite, a dangerous window was never reached, this
machine's wall clock stepped) tested nothing, so a case runs again on another seed, at most
``RUNS`` runs in all; so does a valid run of a scenario that loses writes by design, since the loss
it exists to show did not happen; it fails on a real verdict its scenario does not expect, or when every run
was unknown (``AllUnknown`` names each run and why).
"""

from __future__ import annotations

import difflib
import json
import shlex
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from without_durability.testing.kit import KitError, resolve

from .analyze import Outcome
from .control.kits import chaos_kits, why_not
from .control.runner import Options, check_options, run
from .control.services import check_available
from .control.toxi import ToxiproxyStuck
from .faults import service_needs
from .rundir import shrink_command
from .scenario import OptionError, Scenario, ScenarioError, available, find

RUNS = 3
"""At most this many runs of one case: an unknown run is run again, on another seed."""

EVIDENCE_SHOWN = 5
"""Evidence items a failure shows per checker (the run folder holds the rest)."""


class SelectionError(ValueError):
    """A scenario or store name nobody knows, or a selection that runs nothing; the message names
    the known ones (and the closest, when one is close)."""


class AllUnknown(AssertionError):
    """Every run of a case was unknown: the store was not tested. The message names each run's
    folder and seed and why it was unknown."""


class Unavailable(RuntimeError):
    """A case's servers cannot be had (no URL answers, no Docker, no binaries); the message says
    which and how to get them."""


@dataclass(frozen=True)
class Case:
    """One (scenario, store) pair of a selection; ``skip`` says why the scenario does not apply to
    the store (a case that cannot run), else None."""

    scenario: str
    store: str
    skip: str | None = None

    @property
    def id(self) -> str:
        """``scenario[store]``, the case's name in a test report."""
        return f"{self.scenario}[{self.store}]"


@dataclass
class Judged:
    """A case's runs: the one that gave a real verdict (``outcome``) and the unknown ones before it
    (``misses``, one line each: folder, seed, why)."""

    outcome: Outcome
    scenario: Scenario
    options: Options
    misses: list[str] = field(default_factory=list)


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def chaos_stores(names: Sequence[str]) -> list[str]:
    """The kit names of ``names`` (aliases resolved; ``all``: every kit worker processes can open),
    each one a store wd-chaos can run on, else ``SelectionError`` naming the known ones."""
    known = sorted(chaos_kits())
    if "all" in names:
        return known
    stores: list[str] = []
    for name in names:
        try:
            kit = resolve(name)
        except KitError:
            kit = name
        if kit not in known:
            raise SelectionError(
                f"unknown chaos store {name!r}{_did_you_mean(name, known)}; the stores worker "
                f"processes can open: {', '.join(known)} (a store's kit must provide 'workers')"
            )
        if kit not in stores:
            stores.append(kit)
    return stores


def select(scenarios: Sequence[str], stores: Sequence[str], scenario_dirs: Sequence[Path] = ()) -> list[Case]:
    """The cases ``scenarios`` (names, paths of .toml files, or ``all``: every scenario expected
    valid, as ``wd-chaos run --all``) on ``stores`` (kit names or aliases, or ``all``) make, in
    the order given. A named scenario that does not apply to a store becomes a case with ``skip``
    set; one that applies to none of them, an unknown name, or a selection with no case raises
    ``SelectionError``."""
    kits = chaos_stores(stores)
    try:
        known = available(scenario_dirs)
    except ScenarioError as exc:
        raise SelectionError(str(exc)) from exc
    cases: list[Case] = []
    for name in dict.fromkeys(scenarios):
        if name == "all":
            for one in known:
                sc = _load(one, scenario_dirs, known)
                if sc.expect == "valid":  # a scenario that loses writes by design runs by name
                    cases += [Case(sc.name, kit) for kit in kits if why_not(sc, kit) is None]
            continue
        sc = _load(name, scenario_dirs, known)
        reasons = {kit: why_not(sc, kit) for kit in kits}
        if all(reasons.values()):
            raise SelectionError(
                f"{name} runs on none of {', '.join(kits)}: " + "; ".join(str(r) for r in reasons.values())
            )
        cases += [Case(sc.name, kit, reasons[kit]) for kit in kits]
    unique = list(dict.fromkeys(cases))
    if not unique:
        raise SelectionError(f"no scenario of {list(scenarios)} runs on {', '.join(kits)}")
    return unique


def _load(name: str, scenario_dirs: Sequence[Path], known: dict[str, Any]) -> Scenario:
    if name not in known and not name.endswith((".toml", ".json")):
        raise SelectionError(
            f"unknown scenario {name!r}{_did_you_mean(name, list(known))}; known: "
            f"{', '.join(known)}, or 'all' (or the path of a .toml file)"
        )
    try:
        return find(name, scenario_dirs)
    except ScenarioError as exc:
        raise SelectionError(str(exc)) from exc


def own_seconds(scenario: Scenario) -> float:
    """How long ``scenario``'s workload runs when no time limit is given."""
    return scenario.storm.seconds if scenario.storm is not None else scenario.time_limit


def options_for(
    case: Case, *, seconds: float | None = None, scenario_dirs: Sequence[Path] = (), **options: Any
) -> tuple[Scenario, Options]:
    """The scenario of ``case`` and the ``Options`` its run takes: ``seconds`` caps the time limit
    (a scenario shorter than it keeps its own), ``options`` are ``Options`` fields. Options the
    scenario refuses (a time limit that ends before its first fault, an unknown mutant) raise
    ``OptionError`` naming them; nothing starts."""
    scenario = find(case.scenario, scenario_dirs)
    if seconds is not None and options.get("time_limit") is None:
        options["time_limit"] = min(float(seconds), own_seconds(scenario))
    opts = Options(store=case.store, **options)
    check_options(scenario, replace(opts))
    return scenario, opts


def _why_unknown(outcome: Outcome) -> str:
    """What made a run unknown: each verdict that was neither valid nor invalid, and the wall-clock
    steps the run saw."""
    why = [f"{v.name}: {v.summary}" for v in outcome.verdicts if v.valid is not True and v.valid is not False]
    steps = outcome.summary.get("wall_clock_steps")
    if steps:
        why.append(f"the wall clock stepped ({steps})")
    return "; ".join(why) or "no verdict said why"


LOSSLESS = (
    "valid: no acknowledged write was lost, so durability had no loss to count "
    "(the cuts found nothing acknowledged still unsynced)"
)
"""Why a run of a scenario that loses writes by design (``expect = "lost-writes"``) that came out
valid is run again: the loss it exists to show did not happen, so it tested nothing."""


def run_judged(
    scenario: Scenario,
    opts: Options,
    *,
    runs: int = RUNS,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> Judged:
    """Run ``scenario`` with ``opts`` until a run gives a real verdict (valid or invalid), at most
    ``runs`` times. A valid run of a scenario that loses writes by design (``expect =
    "lost-writes"``) showed no loss to count and counts as unknown here. Each unknown run is kept, a ``UserWarning`` names it, and the next run takes
    another seed (``opts.seed``, else the scenario's, plus the retry's number), since the same seed
    would likely time the same way. A run that toxiproxy's stuck control API ended
    (``ToxiproxyStuck``) counts as such a miss too: its faults could not be placed or removed,
    and its folder says so. ``runs`` unknown runs raise ``AllUnknown`` naming each;
    servers that cannot be had raise ``Unavailable`` before anything starts."""
    reason = check_available(opts.store, **service_needs([{"fault": f.kind} for f in scenario.faults]))
    if reason:
        raise Unavailable(f"{scenario.name} on {opts.store}: servers unavailable: {reason}")
    base = scenario.seed if opts.seed is None else opts.seed
    misses: list[str] = []
    for attempt in range(max(1, runs)):
        this = replace(opts, seed=opts.seed if attempt == 0 else base + attempt)
        try:
            outcome = run(scenario, this, progress)
        except ToxiproxyStuck as exc:  # the fault injector failed, not the store: no verdict
            missed = f"{exc.run_dir} (seed {base if attempt == 0 else base + attempt}): {exc}"
            misses.append(missed)
            if attempt + 1 < runs:
                warnings.warn(
                    f"{scenario.name} on {opts.store}: could not finish, running it again on another "
                    f"seed: {missed}",
                    stacklevel=2,
                )
            continue
        lossless = scenario.expect == "lost-writes" and outcome.valid is True
        if (outcome.valid is True and not lossless) or outcome.valid is False:
            return Judged(outcome, scenario, this, misses)
        why = _why_unknown(outcome) if not lossless else LOSSLESS
        missed = f"{outcome.run_dir} (seed {outcome.summary.get('seed')}): {why}"
        misses.append(missed)
        if attempt + 1 < runs:
            warnings.warn(
                f"{scenario.name} on {opts.store}: unknown, running it again on another seed: {missed}",
                stacklevel=2,
            )
    raise AllUnknown(
        f"{scenario.name} on {opts.store}: unknown in all {len(misses)} runs, each on another seed, "
        "so it tested nothing (its fault never bit, a window it must reach was never reached, or the run could not finish):\n  "
        + "\n  ".join(misses)
    )


def reproduce_command(outcome: Outcome, scenario_dirs: Sequence[Path] = ()) -> str:
    """The ``wd-chaos run`` command that runs ``outcome``'s case again: its scenario, store, seed,
    time limit, workers, client and mutant as its run.json recorded them."""
    s = outcome.summary
    words = ["wd-chaos", "run", str(s["scenario"]), "--store", str(s["store"]), "--seed", str(s["seed"])]
    words += ["--time-limit", f"{float(s['time_limit']):g}", "--workers", str(s["workers"])]
    for folder in scenario_dirs:
        words += ["--scenario-dir", str(folder)]
    if s.get("mutant"):
        words += ["--mutant", str(s["mutant"])]
    if s.get("schedule_from") not in (None, "seed", "replay"):
        words += ["--schedule", str(s["schedule_from"])]
    if s.get("client") and s["client"] != "harness":
        words += ["--client", str(s["client"])]
    return shlex.join(words)


def _label(valid: object, expected: object = None) -> str:
    if expected:
        return "EXPECTED"
    return "VALID" if valid is True else "INVALID" if valid is False else "UNKNOWN"


def unexpected(judged: Judged) -> str | None:
    """None when the verdict is the one the scenario expects (valid; or, for a scenario that loses
    acknowledged writes by design, invalid with durability counting them), else the failure: each
    checker's verdict with the evidence of those that failed (JSON), the run folder, and the
    commands that reproduce and shrink it."""
    outcome, sc = judged.outcome, judged.scenario
    if sc.expect == "valid":
        if outcome.valid is True:
            return None
        wanted = "VALID"
    else:
        if outcome.expected:  # analyze's own judgement (expected_loss): one rule for every view
            return None
        wanted = "INVALID with durability counting the acknowledged writes lost by design"
    return describe(outcome, f"expected {wanted}", judged.misses)


def describe(outcome: Outcome, expected: str = "", misses: Sequence[str] = ()) -> str:
    """A run's verdict as a failure shows it: the headline, each checker (the evidence of those not
    valid as JSON lines), the unknown runs before it, the run folder, report and the commands that
    reproduce and shrink it."""
    s = outcome.summary
    verdict = _label(outcome.valid, outcome.expected)
    head = f"{s.get('scenario')} on {s.get('store')} (seed {s.get('seed')}): {verdict}"
    lines = [head + (f", {expected}" if expected else "")]
    for v in outcome.verdicts:
        lines.append(f"  {v.name}: {_label(v.valid).lower()}: {v.summary}")
        if v.valid is not True:
            for item in v.evidence[:EVIDENCE_SHOWN]:
                lines.append("      " + json.dumps(item, default=str, sort_keys=True)[:600])
            if len(v.evidence) > EVIDENCE_SHOWN:
                lines.append(f"      ... {len(v.evidence) - EVIDENCE_SHOWN} more in summary.json")
    if misses:
        lines.append("unknown runs before it (each tested nothing):")
        lines += [f"  {m}" for m in misses]
    lines.append(f"run folder: {outcome.run_dir}")
    lines.append(f"report: {outcome.run_dir / 'report.html'}")
    lines.append(f"reproduce: {reproduce_command(outcome)}")
    if outcome.valid is False and not outcome.expected:
        lines.append(f"shrink: {shrink_command(outcome.run_dir)}")
    return "\n".join(lines)


__all__ = [
    "RUNS",
    "AllUnknown",
    "Case",
    "Judged",
    "OptionError",
    "SelectionError",
    "Unavailable",
    "chaos_stores",
    "describe",
    "options_for",
    "own_seconds",
    "reproduce_command",
    "run_judged",
    "select",
    "unexpected",
]
