"""Run the mutant catalogue: every mutant and its real store through the same checks, in one run.

The conformance half is one pytest session (one server per store kind, shared by its mutants) limited
to the checks some mutant names as its killers; results come back through pytest's JUnit XML. The
chaos half runs each ``chaos:<scenario>:<checker>`` killer as a real ``wd-chaos run`` against the
mutant and against the real store. A mutant survives if none of its killers fails on it; a real store
fails if any of those checks fails on it. Either fails the gate.
"""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

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
    unseen_by_chaos: str = ""
    """The catalogue's reason no wd-chaos run can observe it, if it gives one."""


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


def check_name(killer: str) -> str:
    """A killer's check name: a test function's name (after ``path::`` for a store's own tests), or
    the whole ``chaos:scenario:checker`` string."""
    return killer if killer.startswith("chaos:") else killer.rpartition("::")[2]


def _split_id(name: str, stores: Sequence[str]) -> tuple[str, str]:
    """``test_x[postgres-commit]`` -> (``test_x``, ``postgres``): the longest store name that is a
    whole dash-separated part of the parameter id."""
    base, _, rest = name.partition("[")
    params = "-" + rest.rstrip("]") + "-"
    found = [s for s in stores if f"-{s}-" in params]
    return base, max(found, key=len) if found else rest.rstrip("]")


def _junit_results(path: Path, stores: Sequence[str]) -> list[CheckResult]:
    results: list[CheckResult] = []
    for case in ET.parse(path).getroot().iter("testcase"):
        check, store = _split_id(case.get("name", ""), stores)
        outcome, evidence = "passed", ""
        for tag in ("failure", "error"):
            node = case.find(tag)
            if node is not None:
                outcome = "failed" if tag == "failure" else "error"
                evidence = (node.get("message") or node.text or "").strip()
        if case.find("skipped") is not None:
            outcome = "skipped"
        results.append(CheckResult(check, store, outcome, float(case.get("time", 0) or 0), evidence[:600]))
    return results


def run_conformance(
    mutants: Sequence[Mutant], workdir: Path, *, python: str = sys.executable
) -> list[CheckResult]:
    """One pytest session over the mutants and their real stores, limited to the mutants' killers."""
    killers = {k for m in mutants for k in m.killers if not k.startswith("chaos:")}
    checks = sorted({check_name(k) for k in killers})
    if not checks:
        return []
    files = sorted({str(Path(k.partition("::")[0]).resolve()) for k in killers if "::" in k})
    stores = sorted({m.store for m in mutants}) + [m.name for m in mutants]
    (workdir / "test_mutants.py").write_text(SUITE)
    junit = workdir / "conformance.xml"
    command = [
        python,
        "-m",
        "pytest",
        str(workdir / "test_mutants.py"),
        *files,
        "-p",
        "wd_chaos.mutants.plugin",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:locust",
        *_pytest_config(files, workdir),
        "-q",
        "--no-header",
        "-k",
        " or ".join(checks),
        f"--junitxml={junit}",
        *[arg for s in stores for arg in ("--wd-store", s)],
    ]
    plan: dict[str, set[str]] = {}
    for m in mutants:
        named = {check_name(k) for k in m.killers if not k.startswith("chaos:")}
        plan.setdefault(m.name, set()).update(named)
        plan.setdefault(m.store, set()).update(named)  # the real store passes the same checks
    env = {**os.environ, "WD_MUTANT_PLAN": json.dumps({s: sorted(c) for s, c in plan.items()})}
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, check=False, env=env)
    if not junit.exists():
        raise RuntimeError(f"the conformance run did not start:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return _junit_results(junit, stores)


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
                killed_by_tests=any(not k.startswith("chaos:") for k in killed_by),
                killed_by_chaos=any(k.startswith("chaos:") for k in killed_by),
                unseen_by_chaos=m.unseen_by_chaos,
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
    runs: dict[tuple[str, str], dict[str, str]] = {}
    if chaos is not None:
        results += run_chaos_killers(mutants, report_dir, chaos, runs, jobs)
        timings["chaos"] = round(time.monotonic() - started - timings["conformance"], 1)
    report = judge(mutants, results, started)
    if chaos is not None and shrink_seconds > 0:
        shrink_started = time.monotonic()
        killed_by = {m.name: m.killed_by for m in report.mutants}
        picks = gate_shrink.pick(mutants, killed_by, runs, shrink_stores)
        for chosen in picks:
            say(f"shrinking {chosen.mutant}'s {chosen.scenario} run on {chosen.store} ({chosen.faults} faults)")
        report.shrinks = gate_shrink.check_all(picks, report_dir / "shrinks", shrink_seconds, say, jobs)
        timings["shrink"] = round(time.monotonic() - shrink_started, 1)
        report.seconds = round(time.monotonic() - started, 1)
    report.timings = timings
    write_report(report, report_dir)
    return report


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
        results.append(CheckResult(killer, store_name, outcome, seconds, verdicts.get("__evidence__", "")))
    return results


def write_report(report: GateReport, report_dir: Path) -> None:
    """``mutants.json`` (machine-readable) and ``mutants.html`` (a table a person can read)."""
    data = {
        "passed": report.passed,
        "seconds": report.seconds,
        "killed_by_tests": report.killed_by_tests,
        "killed_by_chaos": report.killed_by_chaos,
        "mutants": [asdict(m) for m in report.mutants],
        "real": [asdict(r) for r in report.real],
        "timings": report.timings,
        "shrinks": gate_shrink.as_json(report.shrinks),
    }
    (report_dir / "mutants.json").write_text(json.dumps(data, indent=2))
    rows = "\n".join(
        f"<tr class={'killed' if m.killed else 'survived'}><td>{html.escape(m.name)}</td>"
        f"<td>{html.escape(m.store)}</td><td>{html.escape(m.guarantee)}</td>"
        f"<td>{html.escape(m.description)}</td><td>{'killed' if m.killed else 'SURVIVED'}</td>"
        f"<td>{'yes' if m.killed_by_tests else 'no'}</td>"
        f"<td>{'yes' if m.killed_by_chaos else html.escape(m.unseen_by_chaos or 'no')}</td>"
        f"<td>{html.escape(', '.join(m.killed_by) or '-')}</td><td>{m.seconds:.1f}s</td>"
        f"<td><pre>{html.escape(m.evidence)}</pre></td></tr>"
        for m in report.mutants
    )
    real_rows = "\n".join(
        f"<tr class={'killed' if r.outcome == 'passed' else 'survived'}><td>{html.escape(r.store)}</td>"
        f"<td>{html.escape(r.check)}</td><td>{r.outcome}</td><td><pre>{html.escape(r.evidence)}</pre></td></tr>"
        for r in report.real
    )
    shrink_rows = "\n".join(
        f"<tr class={'killed' if c.passed else 'survived'}><td>{html.escape(c.store)}</td>"
        f"<td>{html.escape(c.mutant)}</td><td>{html.escape(c.scenario)}</td>"
        f"<td>{html.escape(', '.join(c.targets))}</td><td>{c.original_faults} &rarr; {c.shrunk_faults}</td>"
        f"<td>{c.candidates}</td><td>{html.escape(', '.join(c.replay_failed) or '-')}</td>"
        f"<td>{'pass' if c.passed else 'FAIL'}</td><td>{c.seconds:.1f}s</td>"
        f"<td><pre>{html.escape(c.evidence)}\n{html.escape(c.folder)}</pre></td></tr>"
        for c in report.shrinks
    )
    shrinks = (
        "<h2>Shrinking: one chaos-killed mutant per store, shrunk and replayed</h2>"
        "<table><tr><th>store</th><th>mutant</th><th>scenario</th><th>target</th><th>faults</th>"
        f"<th>candidates</th><th>replay failed</th><th>verdict</th><th>time</th><th>evidence</th></tr>{shrink_rows}</table>"
        if report.shrinks
        else ""
    )
    timings = ", ".join(f"{part} {seconds}s" for part, seconds in report.timings.items())
    verdict = "PASS: every mutant killed, real stores pass" if report.passed else "FAIL"
    (report_dir / "mutants.html").write_text(f"""<!doctype html><meta charset=utf-8>
<title>wd-chaos mutants: {verdict}</title>
<style>body{{font:14px system-ui;margin:2em}}td,th{{border:1px solid #ccc;padding:4px;vertical-align:top}}
table{{border-collapse:collapse}}.killed td:nth-child(5){{color:#080}}.survived{{background:#fdd}}
pre{{white-space:pre-wrap;max-width:50em;margin:0}}</style>
<h1>Mutant gate: {verdict}</h1><p>{len(report.mutants)} mutants, {report.seconds}s ({timings});
killed by tests: {report.killed_by_tests}/{len(report.mutants)};
killed by wd-chaos: {report.killed_by_chaos}/{len(report.mutants)}.</p>
<table><tr><th>mutant</th><th>store</th><th>guarantee</th><th>what it breaks</th><th>verdict</th>
<th>by tests</th><th>by wd-chaos</th><th>killed by</th><th>time</th><th>evidence</th></tr>{rows}</table>
<h2>The real stores on the same checks</h2>
<table><tr><th>store</th><th>check</th><th>outcome</th><th>evidence</th></tr>{real_rows}</table>
{shrinks}
""")
