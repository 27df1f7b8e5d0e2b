"""The chaos gate: every scenario against every store it applies to, in a short form, each a real
wd-chaos run (real worker processes, real servers, real signals) under a hard timeout; and one
broken store that must be caught. It is built on the pytest plugin the package ships
(``wd_chaos.pytest_plugin``, the one a store's own CI uses with ``--wd-chaos``): its cases are the
plugin's selection, each run is the plugin's ``wd_chaos_run`` and each verdict the plugin's
assertion.

Run it with ``python -m pytest chaos`` (``.ci/run`` does). ``WD_CHAOS_GATE_SECONDS`` sets the
workload phase of each run (default 12 s; storms 5 s); reports land in ``reports/chaos-gate/``
(``WD_CHAOS_GATE_REPORTS`` names another folder, for a second gate running beside this one, as
``.ci/run``'s Python 3.12 and 3.13 legs do), one folder per case. ``.ci/run`` runs two cases at a
time (pytest-xdist ``-n 2``).

A run that comes out unknown (its fault did not bite, or this machine's wall clock stepped) tested
nothing, so it is run again on another seed, up to ``RUNS`` runs in all (``wd_chaos.gate``); a case
fails on a real verdict it did not expect, or when every run was unknown (the failure names each
and why).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wd_chaos.control.kits import chaos_kits, stores_for
from wd_chaos.control.runner import analyze
from wd_chaos.gate import RUNS, Case, describe, select
from wd_chaos.pytest_plugin import ChaosRun
from wd_chaos.scenario import available, find, load_file, load_schedule
from wd_chaos.shrink import shrink_command

ROOT = Path(__file__).resolve().parents[1]
REPORTS = Path(os.environ.get("WD_CHAOS_GATE_REPORTS") or ROOT / "reports" / "chaos-gate").resolve()
SECONDS = float(os.environ.get("WD_CHAOS_GATE_SECONDS", "12"))
HARD_TIMEOUT = 240
"""The most one run may take (workload, heal, checks); a case's timeout allows ``RUNS`` of them."""


FULL = ("sqlite", "postgres", "redis-set")
"""The stores every scenario runs on here; every other installed kit that worker processes can open
runs ``REPRESENTATIVE`` under the library Worker (a full matrix per kit would not fit CI's time)."""
REPRESENTATIVE = "lease-stall"
REPRESENTATIVE_SECONDS = 8.0

CASES = select(["all"], [kit for kit in chaos_kits() if kit in FULL])  # in kit order, as before
"""Every scenario expected valid on each of ``FULL`` it applies to: ``pytest --wd-chaos all
--wd-store sqlite,postgres,redis-set``'s cases."""


LOSSY_STORE = {"power-loss-relaxed": "redis-set"}
"""Where a lost-writes scenario runs here when not on its first store: power-loss-relaxed on Redis
(about 30 s) rather than Postgres (about two minutes: initdb and recovery through LazyFS)."""


def _lossy_cases() -> list[tuple[str, str]]:
    """Scenarios whose deployment loses acknowledged writes by design, each on one store only
    (``LOSSY_STORE``, else its first; the gate's time allowance; wd-chaos run NAME --store STORE
    runs the others)."""
    found = [(name, load_file(path)) for name, path in available().items()]
    return [(name, LOSSY_STORE.get(name, stores_for(s)[0])) for name, s in found if s.expect == "lost-writes"]


def _worker_stores() -> list[str]:
    """Every store the library Worker meets faults on: each kit that worker processes can open."""
    return sorted(chaos_kits())


def _seconds(name: str, store: str) -> float:
    """The gate's short form: ``SECONDS`` of workload, 8 for a storm, at most
    ``REPRESENTATIVE_SECONDS`` on a store outside ``FULL``. (A take-storm of 5 s made about 240
    takes, all its six workflows need to finish, and missed liveness in two CI gates of three.)"""
    seconds = min(SECONDS, 8.0) if find(name).storm is not None else SECONDS
    shortest = find(name).shortest  # a scenario no shorter run can judge (dead-wakeup)
    if shortest is not None:
        return max(seconds, shortest)
    return seconds if store in FULL else min(seconds, REPRESENTATIVE_SECONDS)


@pytest.fixture
def chaos(wd_chaos_run: ChaosRun) -> ChaosRun:
    """The plugin's ``wd_chaos_run``, storing this test's runs under ``REPORTS``."""
    wd_chaos_run.report_dir = REPORTS / wd_chaos_run.report_dir.name
    return wd_chaos_run


def _bites_valid(verdicts: list[object]) -> bool:
    bites = [v for v in verdicts if str(getattr(v, "name", "")).startswith("bite")]
    return bool(bites) and all(getattr(v, "valid", None) is True for v in bites)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.timeout(RUNS * HARD_TIMEOUT + 30)
def test_scenario_passes_and_its_fault_bites(case: Case, chaos: ChaosRun) -> None:
    name, store = case.scenario, case.store
    outcome = chaos.check(name, store, seconds=_seconds(name, store))
    assert _bites_valid(outcome.verdicts), describe(outcome)
    # the stored run re-checks to the same verdict
    again = analyze(outcome.run_dir)
    assert again.valid is True, f"analyze disagreed with the run:\n{describe(again)}"


@pytest.mark.parametrize(("name", "store"), _lossy_cases(), ids=[f"{n}[{s}]" for n, s in _lossy_cases()])
@pytest.mark.timeout(RUNS * HARD_TIMEOUT + 30)
def test_writes_lost_by_design_are_counted_by_durability(name: str, store: str, chaos: ChaosRun) -> None:
    """Asynchronous replication across a failover: the run must fail, durability must count the
    acknowledged writes the promoted standby never had, and the fault must have bitten."""
    outcome = chaos.check(name, store, seconds=_seconds(name, store))  # the scenario expects lost writes
    assert outcome.valid is False, describe(outcome)
    kept = next(v for v in outcome.verdicts if v.name == "durability")
    assert kept.valid is False and kept.counts["lost"] > 0, describe(outcome)
    assert all(e.get("why") for e in kept.evidence), describe(outcome)
    assert _bites_valid(outcome.verdicts), describe(outcome)


@pytest.mark.parametrize("name", ["lease-stall", "kill-between-effect-and-record"])
@pytest.mark.timeout(RUNS * HARD_TIMEOUT + 30)
def test_the_library_worker_under_faults(name: str, chaos: ChaosRun) -> None:
    """The same workflow as a Run body under the library's own Worker (renewal tick, resume)."""
    outcome = chaos.check(name, "sqlite", seconds=_seconds(name, "sqlite"), client="worker")
    assert outcome.summary["client"] == "worker", outcome.summary


@pytest.mark.parametrize("store", [s for s in _worker_stores() if s != "sqlite"])
@pytest.mark.timeout(RUNS * HARD_TIMEOUT + 30)
def test_the_library_worker_under_faults_on_every_store(store: str, chaos: ChaosRun) -> None:
    """``REPRESENTATIVE`` under the library Worker on every other kit worker processes can open (the
    Redis stream scheduler and Redis Cluster included), and its fault bites."""
    outcome = chaos.check(REPRESENTATIVE, store, seconds=_seconds(REPRESENTATIVE, store), client="worker")
    assert outcome.summary["client"] == "worker" and outcome.summary["store"] == store, outcome.summary
    assert _bites_valid(outcome.verdicts), describe(outcome)


FAST_FAILOVER = ("kill-between-effect-and-record", "partition", "store-restart")
"""Postgres with fast failover on (``WD_POSTGRES_FAST_FAILOVER``): a killed worker's claims are
taken over when the server ends its session, a partitioned one that lives on must still be
fenced (partition is where a takeover of a live holder happens), and a restart of the server ends
every worker's session at once, so live holders' claims are taken over and their passes fenced."""


@pytest.mark.parametrize("name", FAST_FAILOVER)
@pytest.mark.timeout(RUNS * HARD_TIMEOUT + 30)
def test_postgres_fast_failover_under_faults(
    name: str, chaos: ChaosRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WD_POSTGRES_FAST_FAILOVER", "1")
    outcome = chaos.check(name, "postgres", seconds=_seconds(name, "postgres"))
    final = json.loads((outcome.run_dir / "final.json").read_text())
    assert final.get("fast_failover") is True, "the run did not open the store with fast failover"
    assert _bites_valid(outcome.verdicts), describe(outcome)


DEAD_WAKEUP = {"postgres": "postgres-wakeup-never-resubscribes", "redis-stream": "redis-stream-wait-never-rereads"}
"""dead-wakeup's stores, each with its mutant whose wakeup never subscribes again."""


@pytest.mark.timeout(RUNS * HARD_TIMEOUT + 30)
def test_dead_wakeup_on_the_stream_scheduler(chaos: ChaosRun) -> None:
    """dead-wakeup's other store (outside ``FULL``; postgres runs among ``CASES``): valid, and bitten."""
    outcome = chaos.check("dead-wakeup", "redis-stream", seconds=_seconds("dead-wakeup", "redis-stream"))
    assert _bites_valid(outcome.verdicts), describe(outcome)


@pytest.mark.parametrize(("store", "mutant"), list(DEAD_WAKEUP.items()), ids=list(DEAD_WAKEUP))
@pytest.mark.timeout(RUNS * HARD_TIMEOUT + 30)
def test_a_wakeup_that_never_resubscribes_is_caught(store: str, mutant: str, chaos: ChaosRun) -> None:
    outcome = chaos("dead-wakeup", store, seconds=_seconds("dead-wakeup", store), mutant=mutant)
    assert outcome.valid is False, f"the mutant was not caught:\n{describe(outcome)}"
    judged = next(v for v in outcome.verdicts if v.name == "wakeup-pickup")
    assert judged.valid is False, describe(outcome)


MUTANT = "sqlite-record-without-fence"


@pytest.mark.timeout(RUNS * HARD_TIMEOUT + 30)
def test_a_store_without_the_fence_on_record_is_caught(chaos: ChaosRun) -> None:
    outcome = chaos("lease-stall", "sqlite", seconds=SECONDS, mutant=MUTANT)
    assert outcome.valid is False, f"the mutant was not caught:\n{describe(outcome)}"
    fencing = next(v for v in outcome.verdicts if v.name == "fencing")
    assert fencing.valid is False, describe(outcome)
    assert any("superseded token" in str(e.get("why")) for e in fencing.evidence), describe(outcome)


TAKEOVER_MUTANT = "runtime-worker-gives-up-a-takeover-when-unavailable"


@pytest.mark.timeout(RUNS * HARD_TIMEOUT + 30)
def test_a_worker_whose_takeover_gives_up_when_the_store_restarts_is_caught(chaos: ChaosRun) -> None:
    """Recovery under a second fault (#49): a takeover that drops its workflow on StoreUnavailable
    strands it, and recovery-restart's liveness says so, on the store the mutant names."""
    outcome = chaos("recovery-restart", "redis-set", seconds=SECONDS, mutant=TAKEOVER_MUTANT)
    assert outcome.valid is False, f"the mutant was not caught:\n{describe(outcome)}"
    liveness = next(v for v in outcome.verdicts if v.name == "liveness")
    assert liveness.valid is False and liveness.evidence, describe(outcome)


@pytest.mark.timeout((2 * RUNS + 1) * HARD_TIMEOUT + 60)  # runs, shrink, replays
@pytest.mark.longest
def test_a_failing_run_shrinks_to_fewer_faults_that_still_fail_on_replay(
    tmp_path: Path, chaos: ChaosRun
) -> None:
    """``wd-chaos shrink`` on the broken store's run finds a smaller schedule within a short budget,
    and that schedule replayed with ``--schedule`` fails the run again."""
    outcome = chaos("lease-stall", "sqlite", seconds=SECONDS, mutant=MUTANT)
    assert outcome.valid is False, f"the mutant was not caught:\n{describe(outcome)}"
    assert shrink_command(outcome.run_dir) in describe(outcome)  # the failure says how to shrink it
    shrunk = subprocess.run(
        [
            sys.executable,
            "-m",
            "wd_chaos.cli",
            "shrink",
            str(outcome.run_dir),
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
    assert 0 < len(result["shrunk"]["schedule"]) < len(outcome.summary["schedule"]), result["shrunk"]
    # the replay keeps the shrunk schedule; a retry after an unknown replay takes another seed
    schedule = folder / "schedule.json"
    replayed = chaos(
        "lease-stall",
        "sqlite",
        mutant=MUTANT,
        schedule=load_schedule(schedule),
        schedule_source=str(schedule),
        seed=int(outcome.summary["seed"]),
        time_limit=float(result["shrunk"]["time_limit"]),
        report_dir=tmp_path / "replay",
    )
    assert replayed.valid is False, f"the replay did not fail:\n{describe(replayed)}"
    assert replayed.summary["schedule_from"] == str(schedule)
    assert len(replayed.summary["schedule"]) == len(result["shrunk"]["schedule"])
    # the same failure, not merely some invalid verdict (some other checker's)
    fencing = next(v for v in replayed.verdicts if v.name == "fencing")
    assert fencing.valid is False, describe(replayed)
