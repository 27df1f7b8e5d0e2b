"""``wd-chaos mutate --python``: mutants of a store's Python decision code, made and run by
cosmic-ray on a copy of the project, never on the project itself.

cosmic-ray rather than mutmut: cosmic-ray writes each mutant into the module on disk and runs any
command, so every process a check starts (a worker, a pytest-xdist node) imports the mutant;
mutmut drives pytest itself from a tree of its own.
"""

from __future__ import annotations

import contextlib
import html
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

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
            raise PythonMutateError(f"MutatePlan.python: no file {project / path}; run from the project folder")
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


def pytest_command(tests: tuple[str, ...], stores: tuple[str, ...], pytest_args: tuple[str, ...]) -> str:
    """The command cosmic-ray runs on each mutant: the tests, failing fast, on ``stores``."""
    return shlex.join(
        [
            sys.executable, "-m", "pytest", *tests, "-x", "-q", "-p", "no:cacheprovider",
            *[arg for s in stores for arg in ("--wd-store", s)], *pytest_args,
        ]
    )  # fmt: skip


def write_config(copy: Path, files: tuple[str, ...], command: str, timeout: float) -> Path:
    """cosmic-ray's configuration for the job, in the copy (paths relative to it)."""
    config = copy / "cosmic-ray.toml"
    config.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(list(files))}\n"
        f"timeout = {timeout:.1f}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(command)}\n\n"
        '[cosmic-ray.distributor]\nname = "local"\n',
        encoding="utf-8",
    )
    return config


def _run_until(command: list[str], cwd: Path, env: dict[str, str], deadline: float) -> bool:
    """Run ``command`` until it ends (True) or ``deadline`` (monotonic) passes (False: its whole
    process group is stopped; cosmic-ray keeps each finished mutant's result in its session)."""
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        # cosmic-ray starts each test run in a process group of its own: stop those too
        children = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGKILL)
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()
        proc.communicate()
        return False
    if proc.returncode != 0:
        raise PythonMutateError(f"{shlex.join(command[2:])} failed (exit {proc.returncode}): {err.decode()[-600:]}")
    return True


def read_session(cosmic: list[str], session: Path, cwd: Path) -> dict[str, Any]:
    """The job's figures from ``cosmic-ray dump``: one line per mutant, its work item and result."""
    done = subprocess.run(
        [*cosmic, "dump", str(session)], cwd=cwd, capture_output=True, text=True, check=True
    )
    generated = killed = not_run = errors = 0
    survived: list[dict[str, Any]] = []
    for line in done.stdout.splitlines():
        if not line.strip():
            continue
        item, result = json.loads(line)
        generated += 1
        outcome = (result or {}).get("test_outcome")
        if outcome == "killed":
            killed += 1
        elif outcome == "survived":
            mutation = item["mutations"][0]
            survived.append(
                {
                    "module": mutation["module_path"],
                    "operator": mutation["operator_name"],
                    "line": mutation["start_pos"][0],
                    "diff": result.get("diff") or "",
                }
            )
        elif result is None or result.get("worker_outcome") == "skipped":
            not_run += 1
        else:
            errors += 1  # incompetent, or the worker itself failed: neither killed nor survived
    return {"generated": generated, "killed": killed, "survived": survived, "not_run": not_run, "errors": errors}


def mutate_python(
    files: tuple[str, ...],
    tests: tuple[str, ...],
    stores: tuple[str, ...],
    pytest_args: tuple[str, ...] = (),
    *,
    budget_seconds: float,
    project: Path | None = None,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Mutate ``files`` (paths under ``project``'s src) with cosmic-ray in a temporary copy of the
    project, run ``tests`` on ``stores`` against each mutant until ``budget_seconds`` run out, and
    return ``{"tool", "generated", "killed", "survived": [{"module", "operator", "line", "diff"}],
    "not_run", "errors", "seconds"}``. The project itself is only read."""
    if not files:
        raise PythonMutateError(
            "this store's MutatePlan names no Python files (its 'python' field): name the modules "
            "holding its decisions, e.g. python=('src/mystore/claims.py',)"
        )
    cosmic = _cosmic_ray()
    started = time.monotonic()
    deadline = started + budget_seconds
    project = (project or Path.cwd()).resolve()
    with tempfile.TemporaryDirectory(prefix="wd-mutate-python-") as folder:
        copy = copy_project(project, Path(folder), files)
        env = _environment(copy)
        check_imports_copy(copy, files, env)
        command = pytest_command(tests, stores, pytest_args)
        began = time.monotonic()
        base = subprocess.run(
            shlex.split(command), cwd=copy, env=env, capture_output=True, text=True, check=False,
            timeout=max(60.0, budget_seconds),
        )  # fmt: skip
        base_seconds = time.monotonic() - began
        if base.returncode != 0:
            raise PythonMutateError(
                f"the unmutated copy fails its tests (exit {base.returncode}); fix that first:\n{base.stdout[-1500:]}"
            )
        timeout = max(30.0, 3 * base_seconds)
        progress(f"python: tests pass on the copy in {base_seconds:.0f}s; a mutant gets at most {timeout:.0f}s")
        config = write_config(copy, files, command, timeout)
        session = copy / "session.sqlite"
        _run_until([*cosmic, "init", str(config), str(session)], copy, env, deadline + 60)
        finished = _run_until([*cosmic, "exec", str(config), str(session)], copy, env, deadline)
        found = read_session(cosmic, session, copy)
    progress(
        f"python: generated {found['generated']}, killed {found['killed']}, survived "
        f"{len(found['survived'])}, not run {found['not_run']}, errors {found['errors']}"
        + ("" if finished else " (budget spent)")
    )
    return {"tool": "cosmic-ray", **found, "seconds": round(time.monotonic() - started, 1)}


def html_section(python: dict[str, Any]) -> str:
    """mutate.html's section for the Python mutants: the figures, then each survivor's diff."""
    rows = "\n".join(
        f"<tr><td>{html.escape(s['module'])}:{s['line']}</td><td>{html.escape(s['operator'])}</td>"
        f"<td><pre>{html.escape(s['diff'])}</pre></td></tr>"
        for s in python["survived"]
    )
    return (
        "<h2>Python decision code (cosmic-ray)</h2>"
        f"<p>generated {python['generated']}, killed {python['killed']}, survived "
        f"{len(python['survived'])}, not run {python['not_run']}, errors {python['errors']}; "
        f"{python['seconds']}s</p>"
        "<table border=1 cellpadding=4><tr><th>where</th><th>operator</th><th>diff</th></tr>\n"
        f"{rows}</table>\n"
    )
