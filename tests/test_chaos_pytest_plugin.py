"""``pytest --wd-chaos``: wd-chaos scenarios as test cases in a store's own pytest (item 9 of issue
30). Each pytest here is a real one in a subprocess, in a folder of its own (so this repository's
configuration does not apply), and its chaos cases are real runs on SQLite."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

SHORT = "8"  # seconds of workload: lease-stall's first stall starts at 2 s


def _pytest(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:locust", "-p", "no:xdist", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        # not this pytest's own (an xdist worker's, the current test's): the inner one is a fresh run
        env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "PYTHONDONTWRITEBYTECODE": "1"},
    )


def test_pytest_help_lists_the_wd_chaos_options(tmp_path: Path) -> None:
    done = _pytest(tmp_path, "--help")
    assert done.returncode == 0, done.stderr
    for option in ("--wd-chaos=SCENARIO", "--wd-chaos-seconds", "--wd-chaos-report-dir", "--wd-chaos-runs"):
        assert option in done.stdout, f"{option} missing from pytest --help:\n{done.stdout}"


def test_without_wd_chaos_nothing_is_added_and_wd_chaos_is_not_imported(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text(
        "import sys\n\n"
        "def test_plain():\n"
        "    loaded = [m for m in ('wd_chaos.control.runner', 'wd_chaos.gate', 'wd_chaos.scenario') if m in sys.modules]\n"
        "    assert not loaded, loaded\n"
    )
    done = _pytest(tmp_path, "-q", "--wd-store", "sqlite")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout and "wd-chaos::" not in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--wd-chaos", "lease-stal", "--wd-store", "sqlite"], "did you mean 'lease-stall'?"),
        (["--wd-chaos", "lease-stall"], "name the store(s) to run on with --wd-store"),
        (["--wd-chaos", "transact-stall", "--wd-store", "sqlite"], "transact-stall runs on none of sqlite"),
        (["--wd-chaos", "lease-stall", "--wd-store", "sqlite", "--wd-chaos-seconds", "1"], "first fault"),
        (
            ["--wd-chaos", "lease-stall", "--wd-store", "sqlite", "--wd-chaos-mutant", "no-such-mutant"],
            "no mutant 'no-such-mutant'",
        ),
    ],
    ids=["unknown-scenario", "no-store", "not-applicable", "too-short", "unknown-mutant"],
)
def test_a_bad_selection_is_a_usage_error_naming_what_is_known(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    done = _pytest(tmp_path, *args)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert expected in done.stderr, done.stderr


def _properties(junit: Path) -> dict[str, dict[str, str]]:
    cases = ET.parse(junit).getroot().iter("testcase")
    return {
        f"{c.get('classname')}::{c.get('name')}": {p.get("name", ""): p.get("value", "") for p in c.iter("property")}
        for c in cases
    }


@pytest.mark.timeout(900)  # up to three runs when the stall does not bite
def test_a_valid_run_passes_and_records_its_run(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    done = _pytest(
        tmp_path,
        "-v",
        "--wd-chaos",
        "lease-stall",
        "--wd-store",
        "sqlite",
        "--wd-chaos-seconds",
        SHORT,
        "--wd-chaos-report-dir",
        "runs",
        f"--junitxml={junit}",
        timeout=850,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "wd-chaos::lease-stall[sqlite] PASSED" in done.stdout, done.stdout
    props = _properties(junit)["wd-chaos::lease-stall[sqlite]"]
    assert props["wd_chaos_verdict"] == "valid", props  # the word --json and JUnit use
    run_dir = Path(props["wd_chaos_run_dir"])
    assert run_dir.parent == tmp_path / "runs" / "lease-stall_sqlite", run_dir
    assert (run_dir / "summary.json").is_file()


@pytest.mark.timeout(1200)
def test_a_broken_store_fails_with_the_evidence_and_the_fixture_hands_back_outcomes(tmp_path: Path) -> None:
    """The case of ``--wd-chaos`` on a store without the fence on record fails with fencing's
    evidence, the run folder and the reproduce command; beside it, a test of the user's own gets
    the same kind of run's ``Outcome`` from ``wd_chaos_run``."""
    (tmp_path / "test_own.py").write_text(
        "def test_own(wd_chaos_run):\n"
        "    outcome = wd_chaos_run('lease-stall', 'sqlite', seconds=8, mutant='sqlite-record-without-fence')\n"
        "    assert outcome.valid is False, outcome.summary\n"
        "    assert any(v.name == 'fencing' and v.valid is False for v in outcome.verdicts)\n"
    )
    done = _pytest(
        tmp_path,
        "-rf",
        "--wd-chaos",
        "lease-stall",
        "--wd-store",
        "sqlite",
        "--wd-chaos-seconds",
        SHORT,
        "--wd-chaos-mutant",
        "sqlite-record-without-fence",
        timeout=1100,
    )
    out = done.stdout
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, out + done.stderr
    assert "1 failed, 1 passed" in out, out
    assert "FAILED wd-chaos::lease-stall[sqlite]" in out, out
    assert "lease-stall on sqlite (seed " in out and "INVALID, expected VALID" in out, out
    assert "fencing: invalid:" in out and "superseded token" in out, out
    assert "run folder: " in out and "shrink: wd-chaos shrink " in out, out
    assert "reproduce: wd-chaos run lease-stall --store sqlite --seed " in out, out
    assert "--mutant sqlite-record-without-fence" in out, out


def test_a_scenario_that_does_not_apply_to_one_of_the_stores_is_a_skipped_case_saying_why(tmp_path: Path) -> None:
    # transact-stall needs a transact it can pause (Postgres); its Postgres case is deselected here
    done = _pytest(tmp_path, "-rs", "--wd-chaos", "transact-stall", "--wd-store", "sqlite,postgres", "-k", "sqlite")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 skipped, 1 deselected" in done.stdout, done.stdout
    assert "store kit 'sqlite' does not provide transact-pause" in done.stdout, done.stdout
