"""The chaos gate: every scenario against every store it applies to, in a short form, each a real
``wd-chaos run`` (real worker processes, real servers, real signals) under a hard timeout; and one
broken store that must be caught.

Run it with ``python -m pytest chaos`` (``.ci/run`` does). ``WD_CHAOS_GATE_SECONDS`` sets the
workload phase of each run (default 12 s; storms 5 s); reports land in ``reports/chaos-gate/``
(``WD_CHAOS_GATE_REPORTS`` names another folder, for a second gate running beside this one, as
``.ci/run``'s Python 3.12 and 3.13 legs do), one folder per case. ``.ci/run`` runs two cases at a
time (pytest-xdist ``-n 2``).

A run that comes out unknown (its fault did not bite, or this machine's wall clock stepped) tested
nothing, so it is run again on another seed, up to ``RUNS`` runs in all; a case fails on a real
verdict it did not expect, or when every run was unknown (the failure names each and why).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from wd_chaos.faults import service_needs
from wd_chaos.kits import chaos_kits, stores_for
from wd_chaos.scenario import available, load_file
from wd_chaos.services import check_available

ROOT = Path(__file__).resolve().parents[1]
REPORTS = Path(os.environ.get("WD_CHAOS_GATE_REPORTS") or ROOT / "reports" / "chaos-gate").resolve()
SECONDS = float(os.environ.get("WD_CHAOS_GATE_SECONDS", "12"))
HARD_TIMEOUT = 240


FULL = ("sqlite", "postgres", "redis-set")
"""The stores every scenario runs on here; every other installed kit that worker processes can open
runs ``REPRESENTATIVE`` under the library Worker (a full matrix per kit would not fit CI's time)."""
REPRESENTATIVE = "lease-stall"
REPRESENTATIVE_SECONDS = 8.0


def _cases() -> list[tuple[str, str]]:
    cases = []
    for name, path in available().items():
        scenario = load_file(path)
        if scenario.expect != "valid":
            continue
        for store in stores_for(scenario):
            if store in FULL:
                cases.append((name, store))
    return cases


def _lossy_cases() -> list[tuple[str, str]]:
    """Scenarios whose deployment loses acknowledged writes by design, each on its first store
    only (the gate's time allowance; wd-chaos run NAME --store STORE runs the others)."""
    found = [(name, load_file(path)) for name, path in available().items()]
    return [(name, stores_for(s)[0]) for name, s in found if s.expect == "lost-writes"]


def _worker_stores() -> list[str]:
    """Every store the library Worker meets faults on: each kit that worker processes can open."""
    return sorted(chaos_kits())


def _case_reports() -> Path:
    """This test's own folder under ``REPORTS``: cases run side by side (``-n 2``), and a run's
    folder is found by name afterwards, so two cases of one scenario and store must not share one."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "outside-a-test").rpartition(" ")[0]
    return REPORTS / re.sub(r"[^\w.-]+", "_", test.rpartition("::")[2]).strip("_")


def _run(
    name: str, store: str, *extra: str, seconds: float | None = None, report_dir: Path | None = None
) -> tuple[int, dict[str, Any], str]:
    scenario = load_file(available()[name])
    reason = check_available(store, **service_needs([{"fault": f.kind} for f in scenario.faults]))
    if reason:
        pytest.fail(f"{name} on {store}: servers unavailable: {reason}")
    if seconds is None:
        seconds = min(SECONDS, 5.0) if scenario.storm is not None else SECONDS
        if store not in FULL:
            seconds = min(seconds, REPRESENTATIVE_SECONDS)
    reports = _case_reports() if report_dir is None else report_dir
    command = [
        sys.executable,
        "-m",
        "wd_chaos.cli",
        "run",
        name,
        "--store",
        store,
        "--time-limit",
        str(seconds),
        "--report-dir",
        str(reports),
        *extra,
    ]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=HARD_TIMEOUT, cwd=ROOT, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} on {store} did not finish within {HARD_TIMEOUT}s")
    runs = sorted(reports.glob(f"*-{name}-{store}*"), key=lambda p: p.stat().st_mtime)
    if not runs or not (runs[-1] / "summary.json").is_file():
        # a run that stopped before judging (a server that would not start) says why in its output
        pytest.fail(f"{name} on {store} exited {done.returncode} without a summary:\n{done.stdout}{done.stderr}")
    summary = json.loads((runs[-1] / "summary.json").read_text())
    summary["run_dir"] = str(runs[-1])
    return done.returncode, summary, done.stdout + done.stderr


RUNS = 3
"""At most this many runs of one case: an unknown run is run again, on another seed."""


def _why_unknown(summary: dict[str, Any]) -> str:
    """What made a run unknown: each verdict that was neither valid nor invalid, and the wall-clock
    steps the run saw."""
    why = [
        f"{v['name']}: {v['summary']}"
        for v in summary.get("verdicts", [])
        if v["valid"] is not True and v["valid"] is not False
    ]
    if summary.get("wall_clock_steps"):
        why.append(f"the wall clock stepped ({summary['wall_clock_steps']})")
    return "; ".join(why) or "no verdict said why"


def _run_judged(
    name: str,
    store: str,
    *extra: str,
    seed: int | None = None,
    seconds: float | None = None,
    report_dir: Path | None = None,
) -> tuple[int, dict[str, Any], str]:
    """``_run`` until a run gives a real verdict (valid or invalid), at most ``RUNS`` times. An
    unknown run proves nothing either way: its fault did not bite (a stall that caught a worker
    between passes), or this machine's wall clock stepped under a store whose leases run on it.
    It is kept, a warning names it, and the next run takes another seed (``seed``, else the
    scenario's, plus the retry's number), since the same seed would likely time the same way.
    ``RUNS`` unknown runs fail the test, naming each run and why it was unknown."""
    base = load_file(available()[name]).seed if seed is None else seed
    misses: list[str] = []
    output = ""
    for attempt in range(RUNS):
        chosen = () if seed is None and attempt == 0 else ("--seed", str(base + attempt))
        code, summary, output = _run(name, store, *extra, *chosen, seconds=seconds, report_dir=report_dir)
        if code != 2:
            return code, summary, output
        missed = f"{summary.get('run_dir')} (seed {summary.get('seed')}): {_why_unknown(summary)}"
        misses.append(missed)
        if attempt + 1 < RUNS:
            warnings.warn(
                f"{name} on {store}: unknown, running it again on another seed: {missed}", stacklevel=2
            )
    pytest.fail(
        f"{name} on {store}: unknown in all {RUNS} runs, each on another seed, so it tested "
        "nothing:\n  " + "\n  ".join(misses) + f"\nthe last run's output:\n{output}"
    )


@pytest.mark.parametrize(("name", "store"), _cases(), ids=[f"{n}[{s}]" for n, s in _cases()])
@pytest.mark.timeout(RUNS * HARD_TIMEOUT + 30)
def test_scenario_passes_and_its_fault_bites(name: str, store: str) -> None:
    code, summary, output = _run_judged(name, store)
    assert code == 0, f"{name} on {store} exited {code} (0 valid, 1 invalid, 2 unknown):\n{output}"
    bites = [v for v in summary["verdicts"] if str(v["name"]).startswith("bite")]
    assert bites and all(v["valid"] is True for v in bites), bites
    # the stored run re-checks to the same verdict
    again = subprocess.run(
        [sys.executable, "-m", "wd_chaos.cli", "analyze", summary["run_dir"]],
        capture_output=True,
        text=True,
        timeout=HARD_TIMEOUT,
        check=False,
    )
    assert again.returncode == 0, f"analyze disagreed with the run:\n{again.stdout}{again.stderr}"


@pytest.mark.parametrize(("name", "store"), _lossy_cases(), ids=[f"{n}[{s}]" for n, s in _lossy_cases()])
@pytest.mark.timeout(RUNS * HARD_TIMEOUT + 30)
def test_writes_lost_by_design_are_counted_by_durability(name: str, store: str) -> None:
    """Asynchronous replication across a failover: the run must fail, durability must count the
    acknowledged writes the promoted standby never had, and the fault must have bitten."""
    code, summary, output = _run_judged(name, store)
    assert code == 1, f"{name} on {store} exited {code}, expected 1 (writes lost):\n{output}"
    kept = next(v for v in summary["verdicts"] if v["name"] == "durability")
    assert kept["valid"] is False and kept["counts"]["lost"] > 0, kept
    assert all(e.get("why") for e in kept["evidence"]), kept
    bites = [v for v in summary["verdicts"] if str(v["name"]).startswith("bite")]
    assert bites and all(v["valid"] is True for v in bites), bites


@pytest.mark.parametrize("name", ["lease-stall", "kill-between-effect-and-record"])
@pytest.mark.timeout(RUNS * HARD_TIMEOUT + 30)
def test_the_library_worker_under_faults(name: str) -> None:
    """The same workflow as a Run body under the library's own Worker (renewal tick, resume)."""
    code, summary, output = _run_judged(name, "sqlite", "--client", "worker")
    assert code == 0, f"{name} with the library Worker exited {code}:\n{output}"
    assert summary["client"] == "worker"


@pytest.mark.parametrize("store", [s for s in _worker_stores() if s != "sqlite"])
@pytest.mark.timeout(RUNS * HARD_TIMEOUT + 30)
def test_the_library_worker_under_faults_on_every_store(store: str) -> None:
    """``REPRESENTATIVE`` under the library Worker on every other kit worker processes can open (the
    Redis stream scheduler and Redis Cluster included), and its fault bites."""
    code, summary, output = _run_judged(REPRESENTATIVE, store, "--client", "worker")
    assert code == 0, f"{REPRESENTATIVE} on {store} with the library Worker exited {code}:\n{output}"
    assert summary["client"] == "worker" and summary["store"] == store, summary
    bites = [v for v in summary["verdicts"] if str(v["name"]).startswith("bite")]
    assert bites and all(v["valid"] is True for v in bites), bites


@pytest.mark.timeout(RUNS * HARD_TIMEOUT + 30)
def test_a_store_without_the_fence_on_record_is_caught() -> None:
    code, summary, output = _run_judged("lease-stall", "sqlite", "--mutant", "sqlite-record-without-fence")
    assert code == 1, f"the mutant was not caught (exit {code}):\n{output}"
    fencing = next(v for v in summary["verdicts"] if v["name"] == "fencing")
    assert fencing["valid"] is False, fencing
    assert any("superseded token" in str(e.get("why")) for e in fencing["evidence"]), fencing


@pytest.mark.timeout((2 * RUNS + 1) * HARD_TIMEOUT + 60)  # runs, shrink, replays
@pytest.mark.longest
def test_a_failing_run_shrinks_to_fewer_faults_that_still_fail_on_replay(tmp_path: Path) -> None:
    """``wd-chaos shrink`` on the broken store's run finds a smaller schedule within a short budget,
    and that schedule replayed with ``--schedule`` fails the run again."""
    code, summary, output = _run_judged("lease-stall", "sqlite", "--mutant", "sqlite-record-without-fence")
    assert code == 1, f"the mutant was not caught (exit {code}):\n{output}"
    assert f"wd-chaos shrink {summary['run_dir']}" in output  # the failing run says how to shrink it
    shrunk = subprocess.run(
        [
            sys.executable,
            "-m",
            "wd_chaos.cli",
            "shrink",
            summary["run_dir"],
            "--report-dir",
            str(tmp_path),
            "--attempts",
            "1",
            "--budget-minutes",
            "1.5",
        ],
        capture_output=True,
        text=True,
        timeout=HARD_TIMEOUT,
        cwd=ROOT,
        check=False,
    )
    assert shrunk.returncode == 1, f"shrink exited {shrunk.returncode}:\n{shrunk.stdout}{shrunk.stderr}"
    (folder,) = tmp_path.glob("*-shrink-lease-stall-sqlite")
    result = json.loads((folder / "shrink.json").read_text())
    assert result["targets"] == ["fencing"], result["targets"]
    assert 0 < len(result["shrunk"]["schedule"]) < len(summary["schedule"]), result["shrunk"]
    # the replay keeps the shrunk schedule; a retry after an unknown replay takes another seed
    code, replayed, output = _run_judged(
        "lease-stall",
        "sqlite",
        "--mutant",
        "sqlite-record-without-fence",
        "--schedule",
        str(folder / "schedule.json"),
        seed=int(summary["seed"]),
        seconds=float(result["shrunk"]["time_limit"]),
        report_dir=tmp_path / "replay",
    )
    assert code == 1, f"the replay exited {code}:\n{output}"
    assert replayed["schedule_from"] == str(folder / "schedule.json")
    assert len(replayed["schedule"]) == len(result["shrunk"]["schedule"])
    # the same failure, not merely some exit 1 (some other checker's)
    fencing = next(v for v in replayed["verdicts"] if v["name"] == "fencing")
    assert fencing["valid"] is False, fencing
