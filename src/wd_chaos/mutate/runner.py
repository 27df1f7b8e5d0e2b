"""Run generated mutants through a store's tests (and, for survivors, short wd-chaos runs) and judge
them: a mutant is killed when a check fails on it that passes on the real store in the same job."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from importlib.abc import Traversable
from importlib.resources import files
from pathlib import Path
from typing import Any

from ..mutation import junit, page, session
from ..mutation.patch import EDIT_ENV, Spec
from ..mutation.session import Session
from .plugin import FIRST_ENV, ORDER_ENV
from .targets import Target, describe, mutants, script_targets, statement_targets


@dataclass(frozen=True)
class StorePlan:
    """How to mutate one store: where its statements or scripts live, which conformance stores and
    test files check it, which server it needs, and which scenarios judge its survivors."""

    name: str
    statements: tuple[str, ...] = ()
    scripts: str | None = None
    script_reader: str = ""
    """The ``module:function`` the store reads its scripts through (``MutatePlan.script_reader``)."""
    wd_stores: tuple[str, ...] = ()
    tests: tuple[str, ...] = ()
    server: str | None = None
    """The kit whose ``server()`` the job starts once (None: no server)."""
    server_env: str = ""
    """Where that server's URL goes, so every session of the job uses it."""
    chaos_store: str | None = None
    scenarios: tuple[str, ...] = ()
    pytest_args: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    """Modules whose constants are never mutated: the kit's own module, whose statements are the
    tests' harness (a ledger, a superseding claim), and its mutant modules: not the store."""
    narrow: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(target prefix, conformance stores): a mutant of a target starting so runs on those stores
    only (the first match); one the prefixes miss runs on ``wd_stores``."""
    python: tuple[str, ...] = ()
    """Python decision-code files (under ``src/``) that ``--python`` mutates with cosmic-ray."""
    equivalents: str = ""
    """The kit's list of equivalent mutants, as ``package:file`` (see ``MutatePlan.equivalents``)."""

    def stores_for(self, target: str) -> tuple[str, ...]:
        """The conformance stores a mutant of ``target`` is run on."""
        return next((stores for prefix, stores in self.narrow if target.startswith(prefix)), self.wd_stores)


def plan_for(store: str) -> StorePlan:
    """The plan the kit called ``store`` (or an alias of it) declares as ``mutate_plan``; a
    ``KitError`` naming the kits that declare one when it has none."""
    from without_durability.testing.kit import KitError, find_kit, kits

    kit = find_kit(store)
    declared = kit.mutate_plan
    if declared is None:
        having = sorted(k.name for k in kits().values() if k.mutate_plan is not None)
        raise KitError(
            f"store kit {kit.name!r} declares no mutate_plan (kits that do: {', '.join(having) or 'none'})"
        )
    if declared.scripts and not declared.script_reader:
        raise KitError(
            f"store kit {kit.name!r}: its MutatePlan names a scripts package ({declared.scripts!r}) "
            "but no script_reader: name the module:function the store reads each script through, "
            "so a generated script mutant can be put in its place"
        )
    return StorePlan(
        declared.name or kit.store_kind,
        statements=declared.statements,
        scripts=declared.scripts,
        script_reader=declared.script_reader,
        wd_stores=declared.stores or (kit.name,),
        tests=declared.tests,
        server=kit.name if declared.server_env else None,
        server_env=declared.server_env,
        chaos_store=kit.name if "workers" in kit.provides else None,
        scenarios=declared.scenarios,
        pytest_args=declared.pytest_args,
        narrow=declared.narrow,
        python=declared.python,
        equivalents=declared.equivalents,
        exclude=(type(kit).__module__, *kit.mutant_modules),
    )


def runtime_plan() -> StorePlan:
    """``wd-chaos mutate --runtime``: the library's own Python above the stores (the Worker's loop,
    ``Run``'s steps, sleeps and inbox, ``RetryPolicy`` and the lifecycle, the dag), mutated with
    the operators the stores' Python gets and run through the runtime's tests and the conformance
    suite on the installed kits that run in one process, with no server (those that provide
    ``simulated``: Memory and SQLite among the built-in ones; SQLite's calls really yield, so a
    fan-out's operations overlap there)."""
    from ..sim import simulated_stores

    return StorePlan(
        "runtime",
        wd_stores=tuple(simulated_stores()),
        tests=(
            "tests/test_worker.py",
            "tests/test_run.py",
            "tests/test_dag.py",
            "tests/test_lifecycle.py",
            "tests/test_conformance.py",  # the Worker's lifecycle and the Run protocol
        ),
        python=(
            "src/without_durability/worker.py",
            "src/without_durability/run.py",
            "src/without_durability/dag.py",
            "src/without_durability/lifecycle.py",
        ),
        equivalents="wd_chaos.mutate:runtime_equivalent.toml",
    )


def plan_equivalents(plan: StorePlan) -> Traversable | None:
    """The file of equivalent mutants ``plan``'s kit ships in its own package (``package:file``),
    or None when it names none; a ``ValueError`` saying what to write when the name is malformed."""
    if not plan.equivalents:
        return None
    package, colon, name = plan.equivalents.partition(":")
    if not colon or not package or not name:
        raise ValueError(
            f"MutatePlan.equivalents of {plan.name!r} is {plan.equivalents!r}: write it as "
            "'package:file' (e.g. 'my_store:equivalent.toml')"
        )
    return files(package).joinpath(name)


def equivalents(path: Path | Traversable | None) -> dict[str, str]:
    """Mutant id -> why it is equivalent (behaves as the real store for every caller), from ``path``
    (a TOML table ``[equivalent]`` of ``"id" = "why"``); empty for None or a missing file."""
    if path is None or not path.is_file():
        return {}
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    table = data.get("equivalent", {})
    if not isinstance(table, dict) or not all(isinstance(v, str) and v for v in table.values()):
        raise ValueError(f"{path}: [equivalent] must map each mutant id to a one-line reason")
    return dict(table)


def targets_of(plan: StorePlan) -> list[Target]:
    """Every statement and script ``plan`` names."""
    found = [
        t
        for package in plan.statements
        for t in statement_targets(package)
        if t.name.partition(":")[0] not in plan.exclude
    ]
    if plan.scripts:
        found.extend(script_targets(plan.scripts, plan.script_reader))
    return found


@dataclass
class Outcome:
    """What happened to one mutant."""

    mutant: str
    target: str
    operator: str
    before: str
    after: str
    verdict: str = "not run"
    """killed, survived, equivalent, not run (the budget ran out), or error (the check could not run)."""
    killed_by: str = ""
    why: str = ""
    seconds: float = 0.0
    chaos: list[str] = field(default_factory=list)


TEST_TIMEOUT = session.TEST_TIMEOUT


def run_tests(
    plan: StorePlan,
    spec: Spec | None,
    *,
    tests: tuple[str, ...] | None = None,
    timeout: float | None = None,
    fail_fast: bool = True,
    junit: Path | None = None,
    first: tuple[str, ...] = (),
    jobs: int = 1,
) -> Session:
    """One pytest session over ``plan``'s tests (or ``tests``, node ids) on ``plan``'s stores, with
    ``spec`` applied in every process (None: the real store), the tests ``first`` names run
    before the others, and ``jobs`` > 1 test processes (pytest-xdist)."""
    env = dict(os.environ)
    env.pop(EDIT_ENV, None)
    env.pop(FIRST_ENV, None)
    if spec is not None:
        env[EDIT_ENV] = spec.to_json()
    if first:
        env[FIRST_ENV] = json.dumps(first)
    stores = plan.stores_for(spec.target) if spec else plan.wd_stores
    command = session.command(
        tests or plan.tests, stores=stores, plugins=("wd_chaos.mutate.plugin",), fail_fast=fail_fast,
        jobs=jobs, junit=junit, test_timeout=TEST_TIMEOUT, summary=True, after=plan.pytest_args,
    )  # fmt: skip
    return session.run(command, env=env, timeout=timeout)


def run_chaos(plan: StorePlan, scenario: str, spec: Spec | None, seconds: float, report_dir: Path) -> int:
    """One wd-chaos run of ``scenario`` on ``plan``'s store with ``spec`` in every process; its exit
    code (0 valid, 1 invalid, other: unknown or could not run)."""
    env = dict(os.environ)
    env.pop(EDIT_ENV, None)
    if spec is not None:
        env[EDIT_ENV] = spec.to_json()
    command = [
        sys.executable, "-m", "wd_chaos.cli", "run", scenario, "--store", str(plan.chaos_store),
        "--time-limit", str(seconds), "--report-dir", str(report_dir),
    ]  # fmt: skip
    try:
        return subprocess.run(
            command, capture_output=True, env=env, timeout=seconds * 10 + 120, check=False
        ).returncode
    except subprocess.TimeoutExpired:
        return -1


@contextlib.contextmanager
def servers(plan: StorePlan) -> Iterator[None]:
    """One server for the whole job (each test makes its own schema or keys on it), named in the
    environment so every pytest session and wd-chaos run uses it rather than starting its own."""
    if plan.server is None or not plan.server_env:
        yield
        return
    from without_durability.testing.kit import find_kit

    # the variable the kit's server recipe reads first (URL, then a container, then a private one)
    variable = plan.server_env
    if os.environ.get(variable):
        yield
        return
    with find_kit(plan.server).server() as server:
        os.environ[variable] = server.url
        try:
            yield
        finally:
            os.environ.pop(variable, None)


@contextlib.contextmanager
def bytecode_cache() -> Iterator[None]:
    """Let the job's pytest sessions keep compiled (and assertion-rewritten) modules between
    sessions, in a folder of their own removed afterwards, even where ``PYTHONDONTWRITEBYTECODE`` is
    set: otherwise every session recompiles every module, a third of a killed mutant's CPU time."""
    import tempfile

    saved = {k: os.environ.get(k) for k in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    with tempfile.TemporaryDirectory(prefix="wd-mutate-pycache-") as folder:
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ["PYTHONPYCACHEPREFIX"] = folder  # never beside the sources
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


Progress = Callable[[str], None]


def mutate(
    plan: StorePlan,
    *,
    budget_seconds: float,
    report_dir: Path,
    chaos_seconds: float = 8.0,
    jobs: int = 1,
    only: tuple[str, ...] = (),
    progress: Progress = print,
    equivalent_file: Path | None = None,
    resume: Path | None = None,
) -> dict[str, Any]:
    """Generate ``plan``'s mutants, run each through its tests (and survivors through wd-chaos
    while the budget lasts), write ``mutate.json`` and ``mutate.html`` in ``report_dir``, and
    return the report. With ``resume`` (an earlier ``mutate.json``), a mutant it records as killed
    keeps that verdict (tests are only ever added, so a kill stays a kill) and only the others run.
    ``equivalent_file`` replaces the kit's list of equivalent mutants (``plan.equivalents``)."""
    deadline = time.monotonic() + budget_seconds
    started = time.monotonic()
    report_dir.mkdir(parents=True, exist_ok=True)
    targets = {t.name: t for t in targets_of(plan)}
    specs = mutants(plan.name, list(targets.values()))
    if only:
        specs = [s for s in specs if s.id in only or any(s.id.startswith(p) for p in only)]
    known = equivalents(equivalent_file or plan_equivalents(plan))
    earlier = _killed_in(resume) if resume else {}
    # the tests that killed each statement's mutants (a resumed report's, then this job's): a
    # mutant meets its neighbours' killers first, since one test often kills a statement's mutants
    killers: dict[str, list[str]] = {}
    for target, test in _killers_in(resume) if resume else []:
        if test not in killers.setdefault(target, []):
            killers[target].append(test)
    outcomes: dict[str, Outcome] = {}
    for s in specs:
        change = describe(s, targets[s.target].text)
        outcomes[s.id] = Outcome(s.id, s.target, s.operator, change["before"], change["after"])
    progress(f"{plan.name}: {len(specs)} mutants from {len(targets)} statements/scripts")
    with servers(plan), bytecode_cache():
        base = run_tests(plan, None, fail_fast=False, junit=report_dir / "real.xml", jobs=jobs)
        if base.code == 1 and (flaky := tuple(base.failures)):
            # a loaded machine can fail a timing test once: the failing tests get one more run
            again = run_tests(plan, None, tests=flaky, fail_fast=False, jobs=1)
            progress(
                f"real store: {', '.join(flaky)} failed, then {'passed' if again.code == 0 else 'failed'} once more"
            )
            if again.code == 0:
                base.code, base.failures = 0, []
        if base.code != 0:
            raise RuntimeError(
                f"the real {plan.name} store fails its own tests ({base.failed or base.code}); "
                f"fix that before mutating it:\n{base.tail}"
            )
        order = report_dir / "order.json"
        timings = junit.timings(report_dir / "real.xml")
        order.write_text(json.dumps(timings))
        os.environ[ORDER_ENV] = str(order)
        per_mutant = max(90.0, 3 * base.seconds)
        progress(f"real store: tests pass in {base.seconds:.0f}s; a mutant gets at most {per_mutant:.0f}s")
        for n, spec in enumerate(specs, 1):
            outcome = outcomes[spec.id]
            if spec.id in known:
                outcome.verdict, outcome.why = "equivalent", known[spec.id]
                progress(f"[{n}/{len(specs)}] {spec.id}: equivalent ({known[spec.id]})")
                continue
            if spec.id in earlier:
                outcome.verdict, outcome.killed_by = "killed", earlier[spec.id]
                outcome.why = f"{RESUMED}{resume}"
                continue
            if time.monotonic() + min(per_mutant, base.seconds) > deadline:
                progress(f"[{n}/{len(specs)}] {spec.id}: not run, the budget is spent")
                continue
            check = run_tests(
                plan, spec, timeout=per_mutant, first=_first(spec.target, killers, timings), jobs=jobs
            )
            outcome.seconds = check.seconds
            if check.code in (0, 5):
                outcome.verdict = "survived"
            elif check.code in (1, -1):
                outcome.verdict, outcome.killed_by = "killed", check.failed or f"pytest exit {check.code}"
                if "::" in check.failed and not check.failed.startswith("timeout"):
                    found = killers.setdefault(spec.target, [])
                    if check.failed not in found:
                        found.append(check.failed)
            else:
                outcome.verdict, outcome.why = "error", f"pytest exit {check.code}: {check.tail[-300:]}"
            progress(
                f"[{n}/{len(specs)}] {spec.id}: {outcome.verdict} {outcome.killed_by} ({check.seconds:.0f}s)"
            )
        _confirm(plan, outcomes, progress, jobs)
        _chaos(plan, specs, outcomes, deadline, chaos_seconds, report_dir, progress)
        os.environ.pop(ORDER_ENV, None)
    report = _report(plan, outcomes, time.monotonic() - started)
    (report_dir / "mutate.json").write_text(json.dumps(report, indent=2) + "\n")
    (report_dir / "mutate.html").write_text(_html(report))
    return report


def _killed_in(report: Path) -> dict[str, str]:
    """Mutant id -> what killed it, in an earlier ``mutate.json``: kills by a named test or a
    wd-chaos run only; a kill by timeout runs again (a loaded machine times out too)."""
    data = json.loads(report.read_text())
    return {
        m["mutant"]: m["killed_by"]
        for m in data.get("mutants", [])
        if m.get("verdict") == "killed"
        and not m["killed_by"].startswith("timeout")
        and ("::" in m["killed_by"] or m["killed_by"].startswith("chaos:"))
    }


def _killers_in(report: Path) -> list[tuple[str, str]]:
    """(statement, killing test) for every mutant an earlier ``mutate.json`` records as killed by
    a named test."""
    data = json.loads(report.read_text())
    killed = _killed_in(report)
    return [
        (m["target"], killed[m["mutant"]])
        for m in data.get("mutants", [])
        if "::" in killed.get(m["mutant"], "")
    ]


RESUMED = "killed in "
"""How a kill kept from a resumed report starts its ``why``."""


def _first(target: str, killers: dict[str, list[str]], timings: dict[str, float]) -> tuple[str, ...]:
    """The tests to run first on a mutant of ``target``: those that killed its statement's other
    mutants, then those that killed any, each group fastest first (by the real store's run)."""
    own = sorted(killers.get(target, []), key=lambda t: timings.get(t, 0.0))
    rest = sorted(
        {t for tests in killers.values() for t in tests} - set(own), key=lambda t: timings.get(t, 0.0)
    )
    return (*own, *rest)


def _confirm(plan: StorePlan, outcomes: dict[str, Outcome], progress: Progress, jobs: int = 1) -> None:
    """A kill counts only when its failing test passes on the real store: run every distinct
    killing test of this job once more on the real store, and take back the kills of any that
    fail there. A kill kept from a resumed report was confirmed by the job that made it (its test
    may have been renamed since, which would make pytest refuse the whole session)."""
    killers = sorted(
        {
            o.killed_by
            for o in outcomes.values()
            if o.verdict == "killed"
            and "::" in o.killed_by
            and not o.killed_by.startswith("timeout")
            and not o.why.startswith(RESUMED)
        }
    )
    if not killers:
        return
    check = run_tests(plan, None, tests=tuple(killers), fail_fast=False, jobs=jobs)
    failing = set(check.failures) if check.code != 0 else set()
    if check.code not in (0, 1):
        progress(
            f"could not confirm the kills: the real store's session exited {check.code} (not a test "
            f"verdict), so none is counted:\n{(check.stdout + check.stderr)[-1500:]}"
        )
        failing = set(killers)
    for o in outcomes.values():
        if o.verdict == "killed" and o.killed_by in failing:
            o.verdict, o.why = (
                "survived",
                f"{o.killed_by} failed on the real store too; the kill is not counted",
            )
    progress(f"confirmed {len(killers) - len(failing)}/{len(killers)} killing tests pass on the real store")


def _chaos(
    plan: StorePlan,
    specs: list[Spec],
    outcomes: dict[str, Outcome],
    deadline: float,
    seconds: float,
    report_dir: Path,
    progress: Progress,
) -> None:
    """Each survivor of the tests through ``plan``'s scenarios while the budget lasts; a scenario
    counts only if the real store passes it in this job."""
    survivors = [s for s in specs if outcomes[s.id].verdict == "survived"]
    if not survivors or not plan.chaos_store:
        return
    cost = seconds * 3 + 30
    for scenario in plan.scenarios:
        if time.monotonic() + cost * 2 > deadline:
            break
        if run_chaos(plan, scenario, None, seconds, report_dir / "chaos") != 0:
            progress(f"chaos {scenario}: not valid on the real store; not used")
            continue
        for spec in survivors:
            outcome = outcomes[spec.id]
            if outcome.verdict != "survived":
                continue
            if time.monotonic() + cost > deadline:
                return
            code = run_chaos(plan, scenario, spec, seconds, report_dir / "chaos")
            outcome.chaos.append(f"{scenario}: exit {code}")
            if code == 1:
                outcome.verdict, outcome.killed_by = "killed", f"chaos:{scenario}"
            progress(f"chaos {scenario} on {spec.id}: exit {code}")


def _report(plan: StorePlan, outcomes: dict[str, Outcome], seconds: float) -> dict[str, Any]:
    rows = list(outcomes.values())

    def of(verdict: str) -> list[dict[str, Any]]:
        return [asdict(o) for o in rows if o.verdict == verdict]

    killed = of("killed")
    equivalent = [{"mutant": o.mutant, "why": o.why} for o in rows if o.verdict == "equivalent"]
    run = [o for o in rows if o.verdict in ("killed", "survived", "equivalent")]
    return {
        "store": plan.name,
        "generated": len(rows),
        "killed": len(killed),
        "equivalent": equivalent,
        "survived": of("survived"),
        "not_run": [o.mutant for o in rows if o.verdict == "not run"],
        "errors": of("error"),
        "killed_or_equivalent": (
            f"{(len(killed) + len(equivalent)) / len(run):.1%} of {len(run)} judged" if run else "none judged"
        ),
        "seconds": round(seconds, 1),
        "mutants": [asdict(o) for o in rows],
    }


def _html(report: dict[str, Any]) -> str:
    table = page.Table(
        ["mutant", "verdict", "before / after", "killed by / why", "time"],
        [
            (
                m["verdict"],
                [m["mutant"], m["verdict"], page.code(m["before"], m["after"]), m["killed_by"] or m["why"], f"{m['seconds']:.1f}s"],
            )
            for m in report["mutants"]
        ],
    )  # fmt: skip
    summary = (
        f"generated {report['generated']}, killed {report['killed']}, equivalent "
        f"{len(report['equivalent'])}, survived {len(report['survived'])}, not run {len(report['not_run'])}; "
        f"killed or equivalent: {report['killed_or_equivalent']}; {report['seconds']}s"
    )
    store = report["store"]
    return page.render(f"wd-chaos mutate {store}", summary, [table], heading=f"wd-chaos mutate: {store}")
