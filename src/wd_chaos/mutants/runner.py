"""Run the mutant catalogue: every mutant and its real store through the same checks, in one run.

The conformance half is one pytest session (one server per store kind, shared by its mutants) limited
to the checks some mutant names as its killers; results come back through pytest's JUnit XML. The
chaos half runs each ``chaos:<scenario>:<checker>`` killer as a real ``wd-chaos run`` against the
mutant and against the real store; the simulation half runs each ``sim:<scenario>:<checker>`` killer
as ``wd-chaos sim`` over the same seeds on the mutant and on the real store. A mutant survives if none
of its killers fails on it; a real store fails if any of those checks fails on it. Either fails the
gate. Kills by tests, by wd-chaos runs and by simulation are counted apart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..mutation import junit, page, session
from . import Mutant, gate_shrink
from .gate_shrink import ShrinkCheck

SUITE = "from without_durability.testing.conformance import *  # noqa: F403\n"


@dataclass
class CheckResult:
    """One check on one store: passed, failed (with the evidence), or errored."""

    check: str
    store: str
    outcome: str
    seconds: float
    evidence: str = ""
    runs: int = 1
    """How many wd-chaos runs a chaos killer made before this outcome (retries on other seeds)."""


@dataclass
class MutantVerdict:
    """Whether a mutant was killed, by which of its killers, how long its checks took, and why."""

    name: str
    store: str
    guarantee: str
    description: str
    killers: list[str]
    killed: bool
    killed_by: list[str] = field(default_factory=list)
    seconds: float = 0.0
    evidence: str = ""
    killed_by_tests: bool = False
    """A unit or conformance test killed it."""
    killed_by_chaos: bool = False
    """A wd-chaos run (``chaos:<scenario>:<checker>``) killed it."""
    killed_by_sim: bool = False
    """A simulation (``sim:<scenario>:<checker>``, ``wd-chaos sim``) killed it."""
    unseen_by_chaos: str = ""
    """The catalogue's reason no wd-chaos run can observe it, if it gives one."""
    chaos_runs: list[str] = field(default_factory=list)
    """Each of its chaos killers with what it came to and after how many runs (``chaos_share``)."""


@dataclass
class GateReport:
    """The whole run: each mutant's verdict and each real store's results on the same checks."""

    mutants: list[MutantVerdict]
    real: list[CheckResult]
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent in each part of the gate: conformance, chaos, shrink."""
    shrinks: list[ShrinkCheck] = field(default_factory=list)
    """The shrink checks (``--shrink-seconds``): one chaos-killed mutant per store shrunk and replayed."""

    @property
    def passed(self) -> bool:
        """Every mutant killed, every real store passing every check it ran, and every shrink check
        passing."""
        return (
            all(m.killed for m in self.mutants)
            and all(r.outcome == "passed" for r in self.real)
            and all(c.passed for c in self.shrinks)
        )

    @property
    def killed_by_tests(self) -> int:
        """How many mutants a unit or conformance test killed."""
        return sum(m.killed_by_tests for m in self.mutants)

    @property
    def killed_by_chaos(self) -> int:
        """How many mutants a wd-chaos run killed."""
        return sum(m.killed_by_chaos for m in self.mutants)

    @property
    def killed_by_sim(self) -> int:
        """How many mutants a simulation (``wd-chaos sim``) killed."""
        return sum(m.killed_by_sim for m in self.mutants)


RUNS = "__runs__"
"""The key a chaos runner's verdicts carry the number of runs a killer made under (retries)."""

HARNESS_KILLERS = ("chaos:", "sim:")
"""The prefixes of killers that are harness runs rather than tests."""

SIM_SEEDS = 24
"""Seeds a ``sim:`` killer runs on the mutant and on its real store (each catalogue mutant a
simulation sees is found within the first ten)."""


def check_name(killer: str) -> str:
    """A killer's check name: a test function's name (after ``path::`` for a store's own tests), or
    the whole ``chaos:scenario:checker`` or ``sim:scenario:checker`` string."""
    return killer if killer.startswith(HARNESS_KILLERS) else killer.rpartition("::")[2]


def _split_id(name: str, stores: Sequence[str]) -> tuple[str, str]:
    """``test_x[postgres-commit]`` -> (``test_x``, ``postgres``): the longest store name that is a
    whole dash-separated part of the parameter id."""
    base, _, rest = name.partition("[")
    params = "-" + rest.rstrip("]") + "-"
    found = [s for s in stores if f"-{s}-" in params]
    return base, max(found, key=len) if found else rest.rstrip("]")


def _junit_results(path: Path, stores: Sequence[str]) -> list[CheckResult]:
    return [
        CheckResult(*_split_id(case.name, stores), case.outcome, case.seconds, case.evidence[:600])
        for case in junit.read(path)
    ]


def run_conformance(
    mutants: Sequence[Mutant], workdir: Path, *, python: str = sys.executable
) -> list[CheckResult]:
    """One pytest session over the mutants and their real stores, limited to the mutants' killers."""
    killers = {k for m in mutants for k in m.killers if not k.startswith(HARNESS_KILLERS)}
    checks = sorted({check_name(k) for k in killers})
    if not checks:
        return []
    files = sorted({str(Path(k.partition("::")[0]).resolve()) for k in killers if "::" in k})
    stores = sorted({m.store for m in mutants}) + [m.name for m in mutants]
    (workdir / "test_mutants.py").write_text(SUITE)
    results = workdir / "conformance.xml"
    command = session.command(
        [str(workdir / "test_mutants.py"), *files],
        stores=stores,
        plugins=("wd_chaos.mutants.plugin", "no:locust"),
        junit=results,
        after=(*_pytest_config(files, workdir), "-k", " or ".join(checks)),
        python=python,
    )
    plan: dict[str, set[str]] = {}
    for m in mutants:
        named = {check_name(k) for k in m.killers if not k.startswith(HARNESS_KILLERS)}
        plan.setdefault(m.name, set()).update(named)
        plan.setdefault(m.store, set()).update(named)  # the real store passes the same checks
    env = {**os.environ, "WD_MUTANT_PLAN": json.dumps({s: sorted(c) for s, c in plan.items()})}
    done = session.run(command, env=env, cwd=workdir)
    if not results.exists():
        raise RuntimeError(f"the conformance run did not start:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return _junit_results(results, stores)


def _pytest_config(files: Sequence[str], workdir: Path) -> list[str]:
    """The killers' own project's pytest configuration (its rootdir and ini: asyncio mode, timeouts,
    plugins its tests rely on), found upward from the first killer file; with no file, no ini but
    the asyncio mode the conformance suite's async checks need."""
    for file in files[:1]:
        for folder in Path(file).parents:
            for name in ("pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg"):
                ini = folder / name
                if ini.is_file() and (name == "pytest.ini" or _has_pytest_section(ini)):
                    return ["--rootdir", str(folder), "-c", str(ini)]
    return ["--rootdir", str(workdir), "-c", os.devnull, "-o", "asyncio_mode=auto"]


def _has_pytest_section(ini: Path) -> bool:
    text = ini.read_text(errors="replace")
    return (
        "[tool.pytest.ini_options]" in text
        if ini.suffix == ".toml"
        else "[pytest]" in text or "[tool:pytest]" in text
    )


ChaosRunner = Callable[[str, str, str | None, Path], dict[str, str]]
"""(scenario, store, mutant name or None, report dir) -> checker name -> verdict."""


def judge(mutants: Sequence[Mutant], results: Sequence[CheckResult], started: float) -> GateReport:
    """Turn check results into verdicts. A mutant is killed by a killer that failed on it while the
    same check passed on its real store in this run (a check that fails on the real store too proves
    nothing about the mutant); real stores must pass all."""
    by_store: dict[str, list[CheckResult]] = {}
    for r in results:
        by_store.setdefault(r.store, []).append(r)
    verdicts = []
    for m in mutants:
        mine = by_store.get(m.name, [])
        real = by_store.get(m.store, [])
        named = {check_name(k) for k in m.killers}

        def real_passes(check: str, real: list[CheckResult] = real) -> bool:
            outcomes = [r.outcome for r in real if r.check == check]
            return bool(outcomes) and all(o == "passed" for o in outcomes)

        failed = [r for r in mine if r.check in named and r.outcome == "failed"]
        hits = [r for r in failed if real_passes(r.check)]
        void = [r.check for r in failed if not real_passes(r.check)]
        killed_by = list(dict.fromkeys(h.check for h in hits))
        chaos_runs = [
            f"{r.check} {'killed' if r in hits else r.outcome} after {r.runs} run{'s' if r.runs != 1 else ''}"
            for r in mine
            if r.check in named and r.check.startswith("chaos:")
        ]
        if hits:
            evidence = hits[0].evidence
        elif mine:
            evidence = "no killer failed while its real store passed: " + ", ".join(
                f"{r.check}={r.outcome}" + (" (the real store failed it too)" if r.check in void else "")
                for r in mine
                if r.check in named
            )
        else:
            evidence = f"none of its checks ran: is its store {m.store!r} registered, and its server up?"
        verdicts.append(
            MutantVerdict(
                m.name,
                m.store,
                m.guarantee,
                m.description,
                list(m.killers),
                bool(hits),
                killed_by,
                round(sum(r.seconds for r in mine), 2),
                evidence,
                killed_by_tests=any(not k.startswith(HARNESS_KILLERS) for k in killed_by),
                killed_by_chaos=any(k.startswith("chaos:") for k in killed_by),
                killed_by_sim=any(k.startswith("sim:") for k in killed_by),
                unseen_by_chaos=m.unseen_by_chaos,
                chaos_runs=chaos_runs,
            )
        )
    real_names = {m.store for m in mutants}
    real = [r for r in results if r.store in real_names]
    return GateReport(verdicts, real, round(time.monotonic() - started, 1))


def run_gate(
    mutants: Sequence[Mutant],
    report_dir: Path,
    *,
    chaos: ChaosRunner | None = None,
    shrink_seconds: float = 0.0,
    shrink_stores: Sequence[str] = (),
    say: Callable[[str], None] = lambda line: None,
    jobs: int = 1,
) -> GateReport:
    """Run every check that any mutant names against the mutants and their real stores, judge, and
    write ``mutants.json`` and ``mutants.html`` into ``report_dir``; ``jobs`` chaos runs at a time.
    With ``shrink_seconds`` (and ``chaos``), also shrink one chaos-killed mutant per store (of
    ``shrink_stores``, if given) within that budget each, ``jobs`` at a time (``gate_shrink``)."""
    started = time.monotonic()
    report_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="wd-mutants-") as tmp:
        results = run_conformance(mutants, Path(tmp))
    timings["conformance"] = round(time.monotonic() - started, 1)
    sim_started = time.monotonic()
    results += run_sim_killers(mutants, jobs)
    if any(k.startswith("sim:") for m in mutants for k in m.killers):
        timings["sim"] = round(time.monotonic() - sim_started, 1)
    runs: dict[tuple[str, str], dict[str, str]] = {}
    if chaos is not None:
        chaos_started = time.monotonic()
        results += run_chaos_killers(mutants, report_dir, chaos, runs, jobs)
        timings["chaos"] = round(time.monotonic() - chaos_started, 1)
    report = judge(mutants, results, started)
    if chaos is not None and shrink_seconds > 0:
        shrink_started = time.monotonic()
        killed_by = {m.name: m.killed_by for m in report.mutants}
        picks = gate_shrink.pick(mutants, killed_by, runs, shrink_stores)
        for chosen in picks:
            say(
                f"shrinking {chosen.mutant}'s {chosen.scenario} run on {chosen.store} ({chosen.faults} faults)"
            )
        report.shrinks = gate_shrink.check_all(picks, report_dir / "shrinks", shrink_seconds, say, jobs)
        timings["shrink"] = round(time.monotonic() - shrink_started, 1)
        report.seconds = round(time.monotonic() - started, 1)
    report.timings = timings
    write_report(report, report_dir)
    return report


def run_sim_killers(mutants: Sequence[Mutant], jobs: int = 1, seeds: int = SIM_SEEDS) -> list[CheckResult]:
    """Each ``sim:<scenario>:<checker>`` killer judged by ``wd-chaos sim SCENARIO --seeds seeds``
    on the mutant and, once per scenario and store, on its real store, each in a process of its
    own (``jobs`` processes for a run's seeds): the check fails on a run where some seed's failing
    checkers include it, and passes where every seed was valid."""
    wanted: dict[tuple[str, str], tuple[str, str | None]] = {}
    judged: list[tuple[str, str, str, str]] = []  # (killer, judged store name, scenario, checker)
    for m in mutants:
        for killer in m.killers:
            if not killer.startswith("sim:"):
                continue
            _, scenario, checker = killer.split(":", 2)
            for store_name, mutant_name in ((m.name, m.name), (m.store, None)):
                wanted.setdefault((scenario, store_name), (m.store, mutant_name))
                judged.append((killer, store_name, scenario, checker))
    runs: dict[tuple[str, str], tuple[dict[str, list[int]], str, float]] = {}
    for (scenario, store_name), (store, mutant_name) in wanted.items():
        t0 = time.monotonic()
        command = [sys.executable, "-m", "wd_chaos.cli", "sim", scenario, "--store", store]
        command += ["--seeds", str(seeds), "--jobs", str(max(1, jobs)), "--json"]
        command += ["--mutant", mutant_name] if mutant_name else []
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        failing: dict[str, list[int]] = {}
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        for line in lines:
            for name in line.get("failing", []):
                failing.setdefault(str(name), []).append(int(line["seed"]))
        summary = lines[-1] if lines and "runs" in lines[-1] else None
        why = "" if summary is not None else f"wd-chaos sim exited {done.returncode}: {done.stderr[-600:]}"
        runs[(scenario, store_name)] = (failing, why, round(time.monotonic() - t0, 1))
    results: list[CheckResult] = []
    for killer, store_name, scenario, checker in judged:
        failing, why, seconds = runs[(scenario, store_name)]
        if why:
            results.append(CheckResult(killer, store_name, "error", seconds, why))
            continue
        seeds_failed = failing.get(checker, [])
        outcome = "failed" if seeds_failed else "passed"
        evidence = (
            f"{checker} failed on seed(s) {seeds_failed[:5]} of {seeds}: wd-chaos sim {scenario} --store "
            f"{wanted[(scenario, store_name)][0]} --seed {seeds_failed[0]} --seeds 1"
            + (f" --mutant {store_name}" if store_name != wanted[(scenario, store_name)][0] else "")
            if seeds_failed
            else f"{checker} valid on all {seeds} seeds"
        )
        results.append(CheckResult(killer, store_name, outcome, seconds, evidence))
    return results


def run_chaos_killers(
    mutants: Sequence[Mutant],
    report_dir: Path,
    chaos: ChaosRunner,
    verdicts_by_run: dict[tuple[str, str], dict[str, str]] | None = None,
    jobs: int = 1,
) -> list[CheckResult]:
    """Each ``chaos:<scenario>:<checker>`` killer judged on a wd-chaos run of its scenario on the
    mutant and on its real store: one run per scenario and store, whatever number of killers (every
    checker of a run judges the same history), ``jobs`` runs at a time (``chaos`` must then be safe
    to call from threads). ``verdicts_by_run``, if given, receives each run's verdicts by (scenario,
    mutant or store name)."""
    wanted: dict[tuple[str, str], tuple[str, str | None]] = {}  # -> (store, mutant or None)
    judged: list[tuple[str, str, str, str]] = []  # (killer, judged store name, scenario, checker)
    real_judged: set[tuple[str, str]] = set()
    for m in mutants:
        for killer in m.killers:
            if not killer.startswith("chaos:"):
                continue
            _, scenario, checker = killer.split(":", 2)
            targets = [(m.name, m.name)]
            if (killer, m.store) not in real_judged:
                real_judged.add((killer, m.store))
                targets.append((m.store, ""))
            for store_name, mutant_name in targets:
                wanted.setdefault((scenario, store_name), (m.store, mutant_name or None))
                judged.append((killer, store_name, scenario, checker))

    def one(key: tuple[str, str]) -> tuple[dict[str, str], float]:
        t0 = time.monotonic()
        store, mutant = wanted[key]
        verdicts = chaos(key[0], store, mutant, report_dir / "runs")
        return verdicts, round(time.monotonic() - t0, 1)

    # each run's time is its own, even when another ran beside it
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        runs = dict(zip(wanted, pool.map(one, wanted), strict=True))
    if verdicts_by_run is not None:
        verdicts_by_run.update({key: verdicts for key, (verdicts, _) in runs.items()})
    results: list[CheckResult] = []
    for killer, store_name, scenario, checker in judged:
        verdicts, seconds = runs[(scenario, store_name)]
        outcome = {"valid": "passed", "invalid": "failed"}.get(verdicts.get(checker, ""), "error")
        runs_made = int(verdicts.get(RUNS, "1"))
        results.append(
            CheckResult(killer, store_name, outcome, seconds, verdicts.get("__evidence__", ""), runs_made)
        )
    return results


def chaos_share(report: GateReport) -> list[str]:
    """The gate's chaos share as lines to print: how many mutants a wd-chaos run killed, and for
    each mutant which chaos killer did it (after how many runs), or why none did: its chaos
    killers' runs all missed it, or it names none (with the catalogue's reason)."""
    if "chaos" not in report.timings:
        return ["chaos share: not measured (no chaos runs in this gate)"]
    n = len(report.mutants)
    share = f"{report.killed_by_chaos}/{n} ({report.killed_by_chaos / n:.1%})" if n else "0/0"
    lines = [
        f"chaos share: {share} mutants killed by a wd-chaos run "
        f"(by tests {report.killed_by_tests}, by sim {report.killed_by_sim})"
    ]
    for m in sorted(report.mutants, key=lambda m: (not m.killed_by_chaos, m.name)):
        if m.killed_by_chaos:
            killed = [run for run in m.chaos_runs if " killed after " in run]
            lines.append(f"  by wd-chaos: {m.name}: {'; '.join(killed)}")
        elif m.chaos_runs:
            lines.append(f"  not by wd-chaos: {m.name}: {'; '.join(m.chaos_runs)}")
        else:
            lines.append(
                f"  no chaos killer: {m.name}: {m.unseen_by_chaos or 'the catalogue gives no reason'}"
            )
    return lines


def write_report(report: GateReport, report_dir: Path) -> None:
    """``mutants.json`` (machine-readable) and ``mutants.html`` (a table a person can read)."""
    data = {
        "passed": report.passed,
        "seconds": report.seconds,
        "killed_by_tests": report.killed_by_tests,
        "killed_by_chaos": report.killed_by_chaos,
        "killed_by_sim": report.killed_by_sim,
        "chaos_share": chaos_share(report)[0],
        "mutants": [asdict(m) for m in report.mutants],
        "real": [asdict(r) for r in report.real],
        "timings": report.timings,
        "shrinks": gate_shrink.as_json(report.shrinks),
    }
    (report_dir / "mutants.json").write_text(json.dumps(data, indent=2))
    mutants = page.Table(
        ["mutant", "store", "guarantee", "what it breaks", "verdict", "by tests", "by wd-chaos", "killed by", "time", "evidence"],
        [
            (
                "killed" if m.killed else "survived",
                [
                    m.name, m.store, m.guarantee, m.description, "killed" if m.killed else "SURVIVED",
                    "yes" if m.killed_by_tests else "no", "yes" if m.killed_by_chaos else m.unseen_by_chaos or "no",
                    ", ".join(m.killed_by) or "-", f"{m.seconds:.1f}s", page.pre(m.evidence),
                ],
            )
            for m in report.mutants
        ],
    )  # fmt: skip
    real = page.Table(
        ["store", "check", "outcome", "evidence"],
        [(r.outcome, [r.store, r.check, r.outcome, page.pre(r.evidence)]) for r in report.real],
        heading="The real stores on the same checks",
    )
    shrinks = page.Table(
        ["store", "mutant", "scenario", "target", "faults", "candidates", "replay failed", "verdict", "time", "evidence"],
        [
            (
                "pass" if c.passed else "FAIL",
                [
                    c.store, c.mutant, c.scenario, ", ".join(c.targets), f"{c.original_faults} \u2192 {c.shrunk_faults}",
                    c.candidates, ", ".join(c.replay_failed) or "-", "pass" if c.passed else "FAIL",
                    f"{c.seconds:.1f}s", page.pre(f"{c.evidence}\n{c.folder}"),
                ],
            )
            for c in report.shrinks
        ],
        heading="Shrinking: one chaos-killed mutant per store, shrunk and replayed",
    )  # fmt: skip
    timings = ", ".join(f"{part} {seconds}s" for part, seconds in report.timings.items())
    verdict = "PASS: every mutant killed, real stores pass" if report.passed else "FAIL"
    summary = (
        f"{len(report.mutants)} mutants, {report.seconds}s ({timings}); killed by tests: "
        f"{report.killed_by_tests}/{len(report.mutants)}; killed by wd-chaos: "
        f"{report.killed_by_chaos}/{len(report.mutants)}."
    )
    (report_dir / "mutants.html").write_text(
        page.render(
            f"wd-chaos mutants: {verdict}",
            summary,
            [mutants, real, *([shrinks] if report.shrinks else [])],
            heading=f"Mutant gate: {verdict}",
        )
    )
