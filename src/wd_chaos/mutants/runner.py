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
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import Mutant

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


@dataclass
class GateReport:
    """The whole run: each mutant's verdict and each real store's results on the same checks."""

    mutants: list[MutantVerdict]
    real: list[CheckResult]
    seconds: float

    @property
    def passed(self) -> bool:
        """Every mutant killed and every real store passing every check it ran."""
        return all(m.killed for m in self.mutants) and all(r.outcome == "passed" for r in self.real)


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
        "--rootdir",
        str(workdir),
        "-c",
        os.devnull,
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


ChaosRunner = Callable[[str, str, str | None, Path], dict[str, str]]
"""(scenario, store, mutant name or None, report dir) -> checker name -> verdict."""


def judge(mutants: Sequence[Mutant], results: Sequence[CheckResult], started: float) -> GateReport:
    """Turn check results into verdicts: killed by any failing killer; real stores must pass all."""
    by_store: dict[str, list[CheckResult]] = {}
    for r in results:
        by_store.setdefault(r.store, []).append(r)
    verdicts = []
    for m in mutants:
        mine = by_store.get(m.name, [])
        named = {check_name(k) for k in m.killers}
        hits = [r for r in mine if r.check in named and r.outcome == "failed"]
        verdicts.append(
            MutantVerdict(
                m.name,
                m.store,
                m.guarantee,
                m.description,
                list(m.killers),
                bool(hits),
                [h.check for h in hits],
                round(sum(r.seconds for r in mine), 2),
                hits[0].evidence
                if hits
                else "no killer failed: "
                + ", ".join(f"{r.check}={r.outcome}" for r in mine if r.check in named)
                if mine
                else f"none of its checks ran: is its store {m.store!r} registered, and its server up?",
            )
        )
    real_names = {m.store for m in mutants}
    real = [r for r in results if r.store in real_names]
    return GateReport(verdicts, real, round(time.monotonic() - started, 1))


def run_gate(mutants: Sequence[Mutant], report_dir: Path, *, chaos: ChaosRunner | None = None) -> GateReport:
    """Run every check that any mutant names against the mutants and their real stores, judge, and
    write ``mutants.json`` and ``mutants.html`` into ``report_dir``."""
    started = time.monotonic()
    report_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wd-mutants-") as tmp:
        results = run_conformance(mutants, Path(tmp))
    if chaos is not None:
        results += run_chaos_killers(mutants, report_dir, chaos)
    report = judge(mutants, results, started)
    write_report(report, report_dir)
    return report


def run_chaos_killers(mutants: Sequence[Mutant], report_dir: Path, chaos: ChaosRunner) -> list[CheckResult]:
    """Each ``chaos:<scenario>:<checker>`` killer as a wd-chaos run on the mutant and on its real
    store (once per scenario and store)."""
    results: list[CheckResult] = []
    real_done: set[tuple[str, str]] = set()
    for m in mutants:
        for killer in m.killers:
            if not killer.startswith("chaos:"):
                continue
            _, scenario, checker = killer.split(":", 2)
            runs = [(m.name, m.name)]
            if (scenario, m.store) not in real_done:
                real_done.add((scenario, m.store))
                runs.append((m.store, ""))
            for store_name, mutant_name in runs:
                t0 = time.monotonic()
                verdicts = chaos(scenario, m.store, mutant_name or None, report_dir / "runs")
                outcome = {"valid": "passed", "invalid": "failed"}.get(verdicts.get(checker, ""), "error")
                results.append(
                    CheckResult(
                        killer,
                        store_name,
                        outcome,
                        round(time.monotonic() - t0, 1),
                        verdicts.get("__evidence__", ""),
                    )
                )
    return results


def write_report(report: GateReport, report_dir: Path) -> None:
    """``mutants.json`` (machine-readable) and ``mutants.html`` (a table a person can read)."""
    data = {
        "passed": report.passed,
        "seconds": report.seconds,
        "mutants": [asdict(m) for m in report.mutants],
        "real": [asdict(r) for r in report.real],
    }
    (report_dir / "mutants.json").write_text(json.dumps(data, indent=2))
    rows = "\n".join(
        f"<tr class={'killed' if m.killed else 'survived'}><td>{html.escape(m.name)}</td>"
        f"<td>{html.escape(m.store)}</td><td>{html.escape(m.guarantee)}</td>"
        f"<td>{html.escape(m.description)}</td><td>{'killed' if m.killed else 'SURVIVED'}</td>"
        f"<td>{html.escape(', '.join(m.killed_by) or '-')}</td><td>{m.seconds:.1f}s</td>"
        f"<td><pre>{html.escape(m.evidence)}</pre></td></tr>"
        for m in report.mutants
    )
    real_rows = "\n".join(
        f"<tr class={'killed' if r.outcome == 'passed' else 'survived'}><td>{html.escape(r.store)}</td>"
        f"<td>{html.escape(r.check)}</td><td>{r.outcome}</td><td><pre>{html.escape(r.evidence)}</pre></td></tr>"
        for r in report.real
    )
    verdict = "PASS: every mutant killed, real stores pass" if report.passed else "FAIL"
    (report_dir / "mutants.html").write_text(f"""<!doctype html><meta charset=utf-8>
<title>wd-chaos mutants: {verdict}</title>
<style>body{{font:14px system-ui;margin:2em}}td,th{{border:1px solid #ccc;padding:4px;vertical-align:top}}
table{{border-collapse:collapse}}.killed td:nth-child(5){{color:#080}}.survived{{background:#fdd}}
pre{{white-space:pre-wrap;max-width:50em;margin:0}}</style>
<h1>Mutant gate: {verdict}</h1><p>{len(report.mutants)} mutants, {report.seconds}s.</p>
<table><tr><th>mutant</th><th>store</th><th>guarantee</th><th>what it breaks</th><th>verdict</th>
<th>killed by</th><th>time</th><th>evidence</th></tr>{rows}</table>
<h2>The real stores on the same checks</h2>
<table><tr><th>store</th><th>check</th><th>outcome</th><th>evidence</th></tr>{real_rows}</table>
""")
