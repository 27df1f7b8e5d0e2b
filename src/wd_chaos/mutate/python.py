"""``wd-chaos mutate --python``: mutants of a store's Python decision code, made by cosmic-ray's
operators on a copy of the project (never the project itself) and judged as the statement half
judges its own: each mutant written into the module on disk, the store's tests run on it failing
fast, the likely killers first (the tests that killed its function's other mutants, then any
killer, fastest first), a kill counted only when its test passes on the real code in the same job.

cosmic-ray rather than mutmut: cosmic-ray writes each mutant into the module on disk, so every
process a check starts (a worker, a pytest-xdist node) imports the mutant, and its session and
operators can be driven from here; mutmut drives pytest itself from a tree of its own.

Mutants that cannot change behaviour are skipped, counted by why, never run: a change inside an
annotation or a docstring (the stores never read their annotations at run time), a change that
leaves the syntax tree as it was, and one that does not compile (cosmic-ray also rewrites the
bare ``*`` of keyword-only parameters and the ``**`` of a dict display).
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

from ..mutation import junit, page, session
from ..mutation.session import Session
from .inert import Module, compiles
from .plugin import FIRST_ENV, ORDER_ENV
from .runner import _first, equivalents

CONFTEST_BROKEN = "while loading conftest"
"""pytest's words (exit 4) when a conftest's imports fail: under a mutant, the package broke."""

INSTALL_HINT = "pip install 'without-durability[mutate]' (or: pip install cosmic-ray)"

COPIED = ("src", "tests", "pyproject.toml", "conftest.py")
"""What of the project the copy holds: the code, its tests and their configuration; never a
virtualenv, reports or server data."""

_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache", "*.egg-info")


class PythonMutateError(RuntimeError):
    """The Python mutation job cannot run: cosmic-ray missing, a file not found, the copy not the
    code the tests import, or the real code failing its own tests. The message says what to do."""


def _cosmic_ray() -> list[str]:
    """The command that runs cosmic-ray in this interpreter; a clear error when it is missing."""
    if importlib.util.find_spec("cosmic_ray") is None:
        raise PythonMutateError(f"--python needs cosmic-ray, which is not installed: {INSTALL_HINT}")
    return [sys.executable, "-m", "cosmic_ray.cli"]


def copy_project(project: Path, into: Path, files: tuple[str, ...]) -> Path:
    """Copy ``project``'s code, tests and configuration into ``into``/project and return it; each
    of ``files`` must be a file under the project's ``src``."""
    for name in files:
        path = Path(name)
        if path.is_absolute() or not path.parts or path.parts[0] != "src" or path.suffix != ".py":
            raise PythonMutateError(
                f"MutatePlan.python: {name!r} must be a .py file under the project's src/ folder, "
                "relative to the project folder (e.g. 'src/mystore/claims.py')"
            )
        if not (project / path).is_file():
            raise PythonMutateError(
                f"MutatePlan.python: no file {project / path}; run from the project folder"
            )
    copy = into / "project"
    copy.mkdir(parents=True)
    for name in COPIED:
        source = project / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=_IGNORED)
        elif source.is_file():
            shutil.copy2(source, copy / name)
    return copy


def _environment(copy: Path) -> dict[str, str]:
    """The environment every command of the job runs in: the copy's ``src`` first on the path (the
    editable install points at the real one), and no bytecode written or read from a shared
    cache, so a mutant the size of the original written in the same second is never taken for it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTHONPYCACHEPREFIX", None)
    for name in ("WD_MUTANT_EDIT", "WD_MUTANT_FIRST", "WD_MUTANT_ORDER"):
        env.pop(name, None)  # a statement mutant of an enclosing job must not leak in
    return env


def check_imports_copy(copy: Path, files: tuple[str, ...], env: dict[str, str]) -> None:
    """Fail unless each of ``files``, imported by its module name in ``env``, comes from the copy."""
    for name in files:
        module = ".".join(Path(name).relative_to("src").with_suffix("").parts)
        module = module.removesuffix(".__init__")
        probe = f"import importlib.util as u; print(u.find_spec({module!r}).origin)"
        done = subprocess.run(
            [sys.executable, "-c", probe], cwd=copy, env=env, capture_output=True, text=True, check=False
        )
        origin = Path(done.stdout.strip() or "?").resolve()
        if done.returncode != 0 or not origin.is_relative_to(copy.resolve()):
            raise PythonMutateError(
                f"module {module} is imported from {origin}, not from the copy in {copy}: a mutant "
                f"would not be what the tests run ({done.stderr.strip()[-300:]})"
            )


TEST_TIMEOUT = session.TEST_TIMEOUT
"""Seconds one test may take (pytest-timeout), as in the statement half."""


@dataclass
class PyMutant:
    """One cosmic-ray mutant of a store's Python and what happened to it."""

    mutant: str
    """A stable id: store, module, enclosing function, operator and a digest of the changed line
    (with a counter when one line yields the same change twice), so it survives edits elsewhere."""
    module: str
    definition: str
    operator: str
    occurrence: int
    line: int
    before: str
    after: str
    diff: str
    verdict: str = "not run"
    """killed, survived, equivalent, skipped (see ``why``), not run (the budget ran out) or error."""
    killed_by: str = ""
    why: str = ""
    seconds: float = 0.0


def _dotted(file: str) -> str:
    return ".".join(Path(file).relative_to("src").with_suffix("").parts)


def generate(
    cosmic: list[str], copy: Path, files: tuple[str, ...], store: str, env: dict[str, str], deadline: float
) -> list[tuple[PyMutant, str]]:
    """cosmic-ray's mutants of ``files`` (in ``copy``), each with its mutated source; a mutant that
    cannot change behaviour is marked skipped, with why."""
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator
    from cosmic_ray.work_db import WorkDB, use_db

    config = copy / "cosmic-ray.toml"
    config.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(list(files))}\n"
        'timeout = 60.0\nexcluded-modules = []\ntest-command = "true"\n\n'
        '[cosmic-ray.distributor]\nname = "local"\n',
        encoding="utf-8",
    )
    session = copy / "session.sqlite"
    _run_until([*cosmic, "init", str(config), str(session)], copy, env, deadline)
    with use_db(str(session), WorkDB.Mode.open) as db:
        specs = [m for item in db.work_items for m in item.mutations]
    specs.sort(key=lambda m: (str(m.module_path), m.operator_name, m.occurrence))
    modules = {f: Module((copy / f).read_text(encoding="utf-8")) for f in files}
    seen: dict[str, int] = {}
    found: list[tuple[PyMutant, str]] = []
    for spec in specs:
        file = Path(spec.module_path).as_posix()
        module = modules[file]
        start, end = tuple(spec.start_pos), tuple(spec.end_pos)
        operator = spec.operator_name.removeprefix("core/")
        definition = module.definition(start)
        line = int(start[0])
        key = f"{file}|{definition}|{operator}|{module.line(line)}"
        count = seen[key] = seen.get(key, -1) + 1
        digest = hashlib.sha1(f"{key}|{count}".encode()).hexdigest()[:8]
        op = get_operator(spec.operator_name)(**(spec.operator_args or {}))
        mutated = mutate_code(module.source, op, spec.occurrence) or module.source
        after = mutated.splitlines()
        diff = "\n".join(
            difflib.unified_diff(
                module.source.split("\n"), mutated.split("\n"), f"a/{file}", f"b/{file}", lineterm="", n=1
            )
        )
        row = PyMutant(
            f"{store}:py:{_dotted(file)}:{definition}:{operator}:{digest}",
            file, definition, operator, spec.occurrence, line, module.line(line),
            " ".join(after[line - 1].split()) if line <= len(after) else "", diff,
        )  # fmt: skip
        kind = module.inert_kind(start, end)
        if kind is None and not compiles(mutated):
            kind = "does not compile"
        if kind is None and ast.dump(ast.parse(mutated)) == ast.dump(ast.parse(module.source)):
            kind = "same syntax tree"
        if kind is not None:
            row.verdict, row.why = "skipped", kind
        found.append((row, mutated))
    return found


def _earlier(report: Path) -> dict[str, str]:
    """Python mutant id -> the test that killed it, in an earlier job's ``mutate.json``; kills by
    timeout run again (a loaded machine times out too)."""
    try:
        rows = json.loads(report.read_text())["python"]["mutants"]
    except (KeyError, TypeError, ValueError) as exc:
        raise PythonMutateError(
            f"--resume {report}: not a mutate.json written by 'wd-chaos mutate --python' ({exc!r})"
        ) from None
    return {
        r["mutant"]: r["killed_by"]
        for r in rows
        if r.get("verdict") == "killed"
        and "::" in r.get("killed_by", "")
        and not r["killed_by"].startswith("timeout")
    }


def _timed_out(report: Path) -> set[str]:
    """The Python mutants an earlier job's ``mutate.json`` records as killed by a timeout."""
    rows = json.loads(report.read_text())["python"]["mutants"]
    return {
        r["mutant"] for r in rows if r.get("verdict") == "killed" and r["killed_by"].startswith("timeout")
    }


@contextlib.contextmanager
def _written(path: Path, mutated: str, cache: Path) -> Iterator[None]:
    """``mutated`` in ``path`` for the block, the original after; the module's compiled copy in
    ``cache`` removed each time, so no process runs a stale one (a mutant may have the size and
    second of the one before)."""
    original = path.read_text(encoding="utf-8")

    def forget() -> None:
        folder = cache / path.resolve().parent.relative_to(path.resolve().anchor)
        for compiled in folder.glob(f"{path.stem}.*.pyc"):
            compiled.unlink(missing_ok=True)

    path.write_text(mutated, encoding="utf-8")
    forget()
    try:
        yield
    finally:
        path.write_text(original, encoding="utf-8")
        forget()


def _pytest(
    copy: Path,
    env: dict[str, str],
    tests: tuple[str, ...],
    stores: tuple[str, ...],
    pytest_args: tuple[str, ...],
    *,
    timeout: float,
    fail_fast: bool = True,
    first: tuple[str, ...] = (),
    junit: Path | None = None,
) -> Session:
    """One pytest session in ``copy``; code -1 when ``timeout`` passed (the session's whole process
    group is stopped)."""
    command = session.command(
        tests, stores=stores, plugins=("wd_chaos.mutate.plugin",), fail_fast=fail_fast, junit=junit,
        test_timeout=TEST_TIMEOUT, summary=True, after=pytest_args,
    )  # fmt: skip
    return session.run(
        command, env={**env, FIRST_ENV: json.dumps(first)}, cwd=copy, timeout=timeout, merge_stderr=True
    )


def _run_until(command: list[str], cwd: Path, env: dict[str, str], deadline: float) -> None:
    """Run a cosmic-ray command; a clear error when it fails."""
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, check=False,
        timeout=max(60.0, deadline - time.monotonic()),
    )  # fmt: skip
    if done.returncode != 0:
        raise PythonMutateError(
            f"{shlex.join(command[2:])} failed (exit {done.returncode}): {done.stderr[-600:]}"
        )


def mutate_python(
    files: tuple[str, ...],
    tests: tuple[str, ...],
    stores: tuple[str, ...],
    pytest_args: tuple[str, ...] = (),
    *,
    budget_seconds: float,
    store: str = "store",
    project: Path | None = None,
    equivalent_file: Path | Traversable | None = None,
    resume: Path | None = None,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Mutate ``files`` (paths under ``project``'s src) with cosmic-ray's operators in a temporary
    copy of the project, run ``tests`` on ``stores`` against each mutant until ``budget_seconds``
    run out, and return the report (see ``report``). Mutants listed in ``equivalent_file`` are not
    run; with ``resume`` (an earlier job's ``mutate.json``) its kills are kept and only the rest
    run. The project itself is only read."""
    if not files:
        raise PythonMutateError(
            "this store's MutatePlan names no Python files (its 'python' field): name the modules "
            "holding its decisions, e.g. python=('src/mystore/claims.py',)"
        )
    cosmic = _cosmic_ray()
    started = time.monotonic()
    deadline = started + budget_seconds
    project = (project or Path.cwd()).resolve()
    known = equivalents(equivalent_file)
    earlier = _earlier(resume) if resume else {}
    with tempfile.TemporaryDirectory(prefix="wd-mutate-python-") as folder:
        copy = copy_project(project, Path(folder), files)
        cache = Path(folder) / "pycache"
        env = {**_environment(copy), "PYTHONPYCACHEPREFIX": str(cache)}
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # compiled modules kept, the mutated one's removed
        check_imports_copy(copy, files, env)
        real = Path(folder) / "real.xml"
        base = _pytest(
            copy,
            env,
            tests,
            stores,
            pytest_args,
            timeout=max(600.0, budget_seconds),
            fail_fast=False,
            junit=real,
        )
        code, base_seconds = base.code, base.seconds
        if code == 1 and (flaky := tuple(base.failures)):
            again = _pytest(copy, env, flaky, stores, pytest_args, timeout=600.0, fail_fast=False)
            progress(
                f"python: {', '.join(flaky)} failed on the real code, then {'passed' if again.code == 0 else 'failed'} once more"
            )
            code = again.code
        if code != 0:
            raise PythonMutateError(
                f"the unmutated copy fails its tests (exit {code}); fix that first:\n{base.tail[-1500:]}"
            )
        timings = junit.timings(real)
        order = Path(folder) / "order.json"
        order.write_text(json.dumps(timings))
        env[ORDER_ENV] = str(order)
        timeout = max(60.0, 3 * base_seconds)
        progress(
            f"python: tests pass on the copy in {base_seconds:.0f}s; a mutant gets at most {timeout:.0f}s"
        )
        found = generate(cosmic, copy, files, store, env, deadline)
        rows = [row for row, _ in found]
        stale = sorted(k for k in known if k.startswith(f"{store}:py:") and k not in {r.mutant for r in rows})
        if stale:
            progress(
                f"python: equivalent entries matching no mutant (the code moved on?): {', '.join(stale)}"
            )
        killers: dict[str, list[str]] = {}
        for row in rows:
            if row.mutant in earlier:
                killers.setdefault(row.definition, []).append(earlier[row.mutant])
        runnable = [(r, m) for r, m in found if r.verdict != "skipped"]
        # an earlier job's timeouts run again, but last: each may cost the whole timeout once more
        slow = _timed_out(resume) if resume else set()
        runnable.sort(key=lambda pair: pair[0].mutant in slow)
        progress(
            f"python: {len(rows)} mutants, {len(rows) - len(runnable)} skipped (cannot change behaviour)"
        )
        for n, (row, mutated) in enumerate(runnable, 1):
            if row.mutant in known:
                row.verdict, row.why = "equivalent", known[row.mutant]
                continue
            if row.mutant in earlier:
                row.verdict, row.killed_by, row.why = "killed", earlier[row.mutant], f"killed in {resume}"
                continue
            if time.monotonic() + min(timeout, base_seconds) > deadline:
                continue
            with _written(copy / row.module, mutated, cache):
                check = _pytest(
                    copy, env, tests, stores, pytest_args, timeout=timeout,
                    first=_first(row.definition, killers, timings),
                )  # fmt: skip
            code, failed, row.seconds, tail = check.code, check.failed, check.seconds, check.tail
            if code in (0, 5):
                row.verdict = "survived"
            elif code in (1, -1) or (code == 2 and failed) or (code == 4 and CONFTEST_BROKEN in tail):
                # exit 2 with a named error: the mutant broke collection (an import), a kill; exit
                # 4 naming the conftest: the mutant broke importing the package itself (the same
                # tests load on the real code), the plainest kill of all
                row.verdict = "killed"
                row.killed_by = failed or ("import: the package fails to load" if code == 4 else f"pytest exit {code}")
                if "::" in failed and not failed.startswith("timeout"):
                    own = killers.setdefault(row.definition, [])
                    if failed not in own:
                        own.append(failed)
            else:
                row.verdict, row.why = "error", f"pytest exit {code}: {tail[-300:]}"
            progress(
                f"[{n}/{len(runnable)}] {row.mutant} line {row.line}: {row.verdict} {row.killed_by} ({row.seconds:.0f}s)"
            )
        _confirm(copy, env, tests, stores, pytest_args, rows, progress)
    result = report(rows, time.monotonic() - started)
    progress(
        f"python: generated {result['generated']}, skipped {sum(result['skipped'].values())}, killed "
        f"{result['killed']}, equivalent {len(result['equivalent'])}, survived {len(result['survived'])}, "
        f"not run {len(result['not_run'])}, errors {len(result['errors'])}"
    )
    return result


def _confirm(
    copy: Path,
    env: dict[str, str],
    tests: tuple[str, ...],
    stores: tuple[str, ...],
    pytest_args: tuple[str, ...],
    rows: list[PyMutant],
    progress: Callable[[str], None],
) -> None:
    """A kill counts only when its test passes on the real code: run each killing test of this
    job once more on the restored copy, and take back the kills of any that fail there."""
    fresh = sorted({r.killed_by for r in rows if r.verdict == "killed" and "::" in r.killed_by and not r.why})
    if not fresh:
        return
    check = _pytest(copy, env, tuple(fresh), stores, pytest_args, timeout=900.0, fail_fast=False)
    failing = set(check.failures) if check.code == 1 else (set() if check.code == 0 else set(fresh))
    for r in rows:
        if r.verdict == "killed" and r.killed_by in failing:
            r.verdict, r.why = (
                "survived",
                f"{r.killed_by} failed on the real code too; the kill is not counted",
            )
    progress(f"python: {len(fresh) - len(failing)}/{len(fresh)} killing tests pass on the real code")


def report(rows: list[PyMutant], seconds: float) -> dict[str, Any]:
    """The ``"python"`` part of ``mutate.json``: ``tool``, ``generated``, ``skipped`` (a count per
    reason), ``killed``, ``equivalent`` ([{mutant, why}]), ``survived`` (rows), ``not_run`` (ids),
    ``errors`` (rows), ``killed_or_equivalent``, ``seconds``, ``seconds_per_mutant`` (mean over the
    mutants run) and ``mutants`` (every row)."""
    skipped: dict[str, int] = {}
    for r in rows:
        if r.verdict == "skipped":
            skipped[r.why] = skipped.get(r.why, 0) + 1
    killed = [r for r in rows if r.verdict == "killed"]
    equivalent = [{"mutant": r.mutant, "why": r.why} for r in rows if r.verdict == "equivalent"]
    survived = [asdict(r) for r in rows if r.verdict == "survived"]
    judged = len(killed) + len(equivalent) + len(survived)
    ran = [r.seconds for r in rows if r.seconds > 0]
    return {
        "tool": "cosmic-ray",
        "generated": len(rows),
        "skipped": skipped,
        "killed": len(killed),
        "equivalent": equivalent,
        "survived": survived,
        "not_run": [r.mutant for r in rows if r.verdict == "not run"],
        "errors": [asdict(r) for r in rows if r.verdict == "error"],
        "killed_or_equivalent": (
            f"{(len(killed) + len(equivalent)) / judged:.1%} of {judged} judged" if judged else "none judged"
        ),
        "seconds": round(seconds, 1),
        "seconds_per_mutant": round(sum(ran) / len(ran), 1) if ran else 0.0,
        "mutants": [asdict(r) for r in rows],
    }


def html_page(store: str, python: dict[str, Any]) -> str:
    """mutate.html for the Python mutants: the figures, then every mutant judged."""
    table = page.Table(
        ["mutant", "where", "verdict", "diff", "killed by / why"],
        [
            (m["verdict"], [m["mutant"], f"{m['module']}:{m['line']}", m["verdict"], page.pre(m["diff"]), m["killed_by"] or m["why"]])
            for m in python["mutants"]
            if m["verdict"] != "skipped"
        ],
        heading="Python decision code (cosmic-ray)",
    )  # fmt: skip
    skipped = ", ".join(f"{n} ({why})" for why, n in sorted(python["skipped"].items())) or "none"
    summary = (
        f"generated {python['generated']}, skipped {skipped}, killed {python['killed']}, equivalent "
        f"{len(python['equivalent'])}, survived {len(python['survived'])}, not run {len(python['not_run'])}, "
        f"errors {len(python['errors'])}; killed or equivalent: {python['killed_or_equivalent']}; "
        f"{python['seconds']}s"
    )
    return page.render(
        f"wd-chaos mutate {store} --python", summary, [table], heading=f"wd-chaos mutate: {store}"
    )
