"""The copyable CI recipes (``examples/ci/``, issue 30 item 11) run: a small runner of ours reads each
recipe's steps (GitHub Actions ``run:`` steps; GitLab ``before_script``/``script`` entries) and runs
their commands here, with no network. A step whose script opens with ``# network:`` (PyPI, apt,
GitHub releases) is skipped: this checkout is installed already and the servers' binaries are on
PATH. Every other step runs as written, in the dry-run form of its tool so it stays short:
``python -m pytest`` with ``--collect-only`` (the plugins load, ``--wd-store`` names known stores
whose servers can be had, the suite collects) and ``wd-chaos run`` with ``--check`` (every option,
scenario and store valid, their servers available, the report folder and JUnit file writable)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

RECIPES = Path(__file__).resolve().parents[1] / "examples" / "ci"
NETWORK = "# network:"
DRY_RUN = {
    "python -m pytest ": "python -m pytest --collect-only -q -p no:cacheprovider ",
    "wd-chaos run ": "wd-chaos run --check ",
}
"""Each command a step may run, and its dry-run form."""


@dataclass
class Step:
    name: str
    script: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def needs_network(self) -> bool:
        lines = [line.strip() for line in self.script.splitlines() if line.strip()]
        return bool(lines) and lines[0].startswith(NETWORK)


def _github(doc: dict[str, Any]) -> tuple[list[Step], list[str]]:
    """The ``run:`` steps of every job, with the job's and the step's ``env``; and what the
    ``actions/upload-artifact`` steps upload."""
    steps, uploads = [], []
    for job in doc["jobs"].values():
        for i, step in enumerate(job["steps"]):
            if "run" in step:
                env = {**job.get("env", {}), **step.get("env", {})}
                steps.append(Step(step.get("name", f"step {i}"), step["run"], {k: str(v) for k, v in env.items()}))
            elif str(step.get("uses", "")).startswith("actions/upload-artifact"):
                uploads += str(step["with"]["path"]).split()
    return steps, uploads


def _gitlab(doc: dict[str, Any]) -> tuple[list[Step], list[str]]:
    """Each job's ``before_script`` and ``script`` entries, with its ``variables``; and the paths
    of its artifacts and JUnit reports."""
    steps, uploads = [], []
    for name, job in doc.items():
        if not isinstance(job, dict) or "script" not in job:
            continue
        env = {k: str(v) for k, v in job.get("variables", {}).items()}
        for part in ("before_script", "script"):
            steps += [Step(f"{name}.{part}[{i}]", entry, env) for i, entry in enumerate(job.get(part, []))]
        artifacts = job.get("artifacts", {})
        uploads += artifacts.get("paths", []) + artifacts.get("reports", {}).get("junit", [])
    return steps, uploads


RECIPE_FILES = {"github-actions.yml": _github, "gitlab-ci.yml": _gitlab}


def _dry(script: str) -> str:
    for command, dry in DRY_RUN.items():
        script = script.replace(command, dry)
    return script


@pytest.mark.parametrize("recipe", sorted(RECIPE_FILES))
def test_the_recipe_installs_tests_gates_and_uploads(recipe: str) -> None:
    """What a copier relies on: the package and the servers installed, the conformance suite and
    ``wd-chaos run --all --junit`` run, and the reports kept."""
    steps, uploads = RECIPE_FILES[recipe](yaml.safe_load((RECIPES / recipe).read_text()))
    network = "\n".join(s.script for s in steps if s.needs_network)
    assert 'pip install "without-durability[all]"' in network, network
    for server in ("postgresql", "redis-server", "toxiproxy-server"):
        assert server in network, f"{recipe}: no step installs {server}"
    local = "\n".join(s.script for s in steps if not s.needs_network)
    assert "--pyargs without_durability.testing.conformance" in local, local
    assert re.search(r"wd-chaos run --all\b.*--junit reports/", local), local
    assert "reports/" in uploads, uploads


@pytest.mark.parametrize("recipe", sorted(RECIPE_FILES))
@pytest.mark.timeout(600)
def test_the_recipe_runs_without_network(recipe: str, tmp_path: Path) -> None:
    """Each step that needs no network, run as written (in its tool's dry-run form) by bash in a
    fresh folder with this interpreter first on PATH; then what the recipe uploads is there."""
    steps, uploads = RECIPE_FILES[recipe](yaml.safe_load((RECIPES / recipe).read_text()))
    ran = 0
    for step in steps:
        if step.needs_network:
            continue
        script = _dry(step.script)
        assert script != step.script, (
            f"{recipe}: step {step.name!r} runs no command this check can run dry "
            f"({', '.join(DRY_RUN)}); mark it '{NETWORK}' if it fetches:\n{step.script}"
        )
        env = {**os.environ, **step.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, f"{recipe}: step {step.name!r} exited {done.returncode}:\n{script}\n{done.stdout}{done.stderr}"
        ran += 1
    assert ran >= 2, f"{recipe}: only {ran} step(s) could run here"
    kept = [path for path in uploads if path.endswith("/")]
    for path in kept:  # the folders the steps write into (a dry run writes no JUnit file)
        assert (tmp_path / path).is_dir(), f"{recipe}: uploads {path}, which no step made"
