"""The package as a new user gets it: a wheel built from this tree, installed with ``[all]`` into a
fresh virtualenv, lists every shipped scenario and runs ``lease-stall`` on SQLite from an empty
folder outside the repository (no source checkout on any path).

Dependencies come from a wheelhouse (``WD_WHEELHOUSE``, default ``~/.cache/without-durability/
wheelhouse``) through ``pip install --no-index --find-links``: once it holds every wheel the install
is offline. ``pip wheel`` fills in what it lacks from the package index, once per machine or
dependency change; with no index reachable the test fails saying so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOUSE = Path(os.environ.get("WD_WHEELHOUSE", Path.home() / ".cache" / "without-durability" / "wheelhouse"))
# what pip needs to build our wheel in isolation (pyproject's build-system.requires)
BUILD_REQUIRES = ["setuptools>=77", "wheel"]


def _pip(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _copy_tree(dest: Path) -> Path:
    # a copy, so a stale build/ in the work tree cannot leak old files into the wheel
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(
        ROOT / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    )
    return dest


def _forget_our_own() -> None:
    """Drop this project's own wheels from HOUSE (``pip wheel`` writes the one it is given there):
    ``[all]`` names the project's other extras through the project itself, and an older wheel of
    the same version left in HOUSE would answer for it, so a dependency a newer extra adds (as
    ``powerloss`` added mfusepy) would never be fetched and the install would then fail."""
    for old in HOUSE.glob("without_durability-*.whl"):
        old.unlink(missing_ok=True)


def _wheelhouse(requirements: list[str]) -> None:
    """Every wheel ``requirements`` need is in HOUSE: offline when it already is, else pip wheel
    fetches the rest from the index."""
    HOUSE.mkdir(parents=True, exist_ok=True)
    _forget_our_own()
    offline = _pip("wheel", "-q", "--no-index", "--find-links", str(HOUSE), "-w", str(HOUSE), *requirements)
    _forget_our_own()
    if offline.returncode == 0:
        return
    online = _pip("wheel", "-q", "--find-links", str(HOUSE), "-w", str(HOUSE), *requirements, timeout=600)
    _forget_our_own()
    assert online.returncode == 0, (
        f"the wheelhouse {HOUSE} lacks wheels and pip could not fetch them (set WD_WHEELHOUSE to a "
        f"folder holding them, or reach the package index):\n{online.stderr[-3000:]}"
    )


def test_a_built_wheel_installed_with_all_lists_and_runs_from_an_empty_folder(tmp_path: Path) -> None:
    started = time.monotonic()
    tree = _copy_tree(tmp_path / "tree")
    _wheelhouse(BUILD_REQUIRES)
    built = _pip(
        "wheel",
        "-q",
        "--no-deps",
        "--no-index",
        "--find-links",
        str(HOUSE),
        "-w",
        str(tmp_path / "dist"),
        str(tree),
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("without_durability-*.whl")
    _wheelhouse([f"{wheel}[all]"])

    venv = tmp_path / "venv"
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    # the outer pip installs into the fresh venv (--python): the venv needs no pip of its own
    # compiled at install, as any user's pip does: the run's processes would each compile them otherwise
    installed = _pip(
        "--python", str(python), "install", "-q", "--no-index", "--find-links", str(HOUSE), f"{wheel}[all]"
    )
    assert installed.returncode == 0, installed.stderr[-3000:]

    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), cwd=empty, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )

    # [all] brings every extra's imports, testcontainers ([containers]) among them
    where = run(
        str(python),
        "-c",
        "import wd_chaos, without_durability, without_durability_postgres, without_durability_redis, "
        "testcontainers.core.container; print(wd_chaos.__file__)",
    )
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(venv), f"not the installed package: {where.stdout}"

    shipped = sorted(p.stem for p in (ROOT / "src" / "wd_chaos" / "scenarios").glob("*.toml"))
    listed = run(str(venv / "bin" / "wd-chaos"), "list")
    assert listed.returncode == 0, listed.stderr
    missing = [name for name in shipped if name not in listed.stdout]
    assert "lease-stall" in listed.stdout and not missing, (
        f"wd-chaos list from the wheel lacks {missing}:\n{listed.stdout}"
    )

    # a shorter workload than the file's 24 s keeps the test inside its allowance; both stalls still happen
    ran = run(
        str(venv / "bin" / "wd-chaos"),
        "run",
        "lease-stall",
        "--store",
        "sqlite",
        "--time-limit",
        "10",
        timeout=240,
    )
    assert ran.returncode == 0, f"exit {ran.returncode}\n{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}"
    assert list((empty / "reports").glob("*-lease-stall-sqlite")), "no report folder in the empty folder"
    print(f"wheel build, install and runs took {time.monotonic() - started:.1f} s")


def _readme_install_line() -> str:
    """The install command of the README's first code block: what a new user copies first."""
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    (line,) = [line for line in lines if line.startswith("pip install")]
    return line


@pytest.mark.timeout(900)  # about 90 s with pip's cache warm (CI's own install fills it); longer cold
def test_the_readme_install_line_works_in_a_fresh_virtualenv_from_the_checkout(tmp_path: Path) -> None:
    """Issue #48: the README's first command once installed a placeholder from the package index.
    Its install line, verbatim, run in a copy of the checkout inside a fresh virtualenv (with pip's
    own cache, and the wheelhouse as extra links, so a second run downloads nothing), must give a
    working ``wd-chaos``."""
    line = _readme_install_line()
    assert "without-durability" not in line, (
        f"the README installs {line!r} from the package index, where the name is a placeholder"
    )
    tree = _copy_tree(tmp_path / "checkout")
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, check=False)
    assert made.returncode == 0, made.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    if HOUSE.is_dir():  # wheels already fetched for the test above: found first, not downloaded again
        env["PIP_FIND_LINKS"] = str(HOUSE)
    installed = subprocess.run(
        ["bash", "-c", line], cwd=tree, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert installed.returncode == 0, f"{line!r} failed:\n{installed.stderr[-3000:]}"
    version = subprocess.run(
        [str(venv / "bin" / "wd-chaos"), "--version"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("wd-chaos 0."), version.stdout
    assert version.stdout.strip() != "wd-chaos 0.0.0", "the placeholder distribution was installed"


def test_no_page_installs_the_placeholder_from_the_package_index() -> None:
    """The README and the docs install from a checkout, and say the distribution is not published."""
    import re

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    wrong = [
        f"{page.relative_to(ROOT)}: {hit.group(0)}"
        for page in pages
        for line in page.read_text().splitlines()
        if "published" not in line  # a line that says it works only once the name is published
        for hit in re.finditer(r"pip install ['\"]?without-durability\b[^`\n]*", line)
    ]
    assert not wrong, "pages install the placeholder from the package index:\n" + "\n".join(wrong)
    for page in ("README.md", "docs/index.md", "docs/tutorials/first-run.md"):
        text = (ROOT / page).read_text()
        assert 'pip install ".[chaos]"' in text, f"{page} does not install from a checkout"
        assert "placeholder" in text, f"{page} does not say the name on the package index is a placeholder"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q", "-s"]))
