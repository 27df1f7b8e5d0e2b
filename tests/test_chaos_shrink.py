"""``wd-chaos shrink``'s delta debugging on a fake oracle (no processes), and ``--schedule`` files
held to the schedule's form before a run starts (a usage error naming the file, event and field)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from wd_chaos.cli import USAGE
from wd_chaos.control.runner import Options, check_options
from wd_chaos.scenario import OptionError, find, parse_schedule, plan
from wd_chaos.shrink import (
    AFTER_LAST_FAULT,
    candidate_limit,
    ddmin,
    failing_checkers,
    shrink_command,
    simplify,
)

ROOT = Path(__file__).resolve().parents[1]


def _events(n: int) -> list[dict[str, Any]]:
    return [
        {"fault": "stall", "index": 0, "at": float(i), "target": "worker-0", "duration": 4.0}
        for i in range(n)
    ]


class Oracle:
    """Fails when every event whose ``at`` is in ``culprits`` is in the candidate; counts calls."""

    def __init__(self, culprits: set[float]) -> None:
        self.culprits = culprits
        self.calls: list[list[dict[str, Any]]] = []

    def __call__(self, events: list[dict[str, Any]]) -> bool:
        self.calls.append(events)
        return self.culprits <= {float(e["at"]) for e in events}


@pytest.mark.parametrize(
    ("n", "culprits"),
    [(12, {7.0}), (12, {0.0}), (12, {11.0}), (12, {2.0, 9.0}), (40, {13.0, 14.0, 30.0}), (1, {0.0})],
)
def test_ddmin_finds_exactly_the_faults_that_matter(n: int, culprits: set[float]) -> None:
    oracle = Oracle(culprits)
    shrunk = ddmin(_events(n), oracle)
    assert {e["at"] for e in shrunk} == culprits
    # delta debugging, not every subset: a single culprit among 12 takes a handful of runs
    assert len(oracle.calls) <= 4 * len(culprits) * max(1, n.bit_length()) + len(culprits) * 4


def test_ddmin_tries_the_end_of_the_schedule_first() -> None:
    oracle = Oracle({0.0})
    ddmin(_events(12), oracle)
    # the first candidate drops the second half, so it ends (and runs) short
    assert [e["at"] for e in oracle.calls[0]] == [float(i) for i in range(6)]


def test_ddmin_keeps_everything_when_every_fault_matters() -> None:
    every = set(map(float, range(5)))
    assert {e["at"] for e in ddmin(_events(5), Oracle(every))} == every


def test_ddmin_stops_when_the_budget_is_spent_and_keeps_the_smallest_failing() -> None:
    oracle = Oracle({3.0})
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 2

    shrunk = ddmin(_events(12), oracle, stop)
    assert oracle(shrunk)  # still failing
    assert 1 < len(shrunk) < 12  # cut short: smaller than the original, not yet minimal


def test_a_flaky_oracle_never_yields_a_passing_answer() -> None:
    """The schedule returned is one the oracle said fails, even when it answers differently for
    the same events later (real runs are not deterministic)."""
    said: dict[str, bool] = {}
    flip = {"n": 0}

    def flaky(events: list[dict[str, Any]]) -> bool:
        flip["n"] += 1
        answer = 5.0 in {e["at"] for e in events} and flip["n"] % 3 != 0
        said[json.dumps(events)] = answer
        return answer

    shrunk = ddmin(_events(12), flaky)
    assert len(shrunk) == 12 or said[json.dumps(shrunk)] is True


def test_simplify_shortens_and_moves_earlier_what_still_fails() -> None:
    def fails(events: list[dict[str, Any]]) -> bool:
        return any(float(e["duration"]) >= 1.0 for e in events)

    cut = {"fault": "partition", "at": 8.0, "target": "worker-1", "duration": 4.0, "mode": "down"}
    assert simplify([cut], fails) == [{**cut, "at": 4.0, "duration": 2.0}]
    # a stall sized over the lease keeps its length (shorter, it fails only by luck); it moves earlier
    stall = {"fault": "stall", "at": 8.0, "target": "worker-1", "duration": 4.0, "over": "alive"}
    assert simplify([stall], fails) == [{**stall, "at": 4.0}]


def test_simplify_keeps_what_the_failure_needs() -> None:
    ev = {"fault": "stall", "at": 8.0, "target": "worker-1", "duration": 4.0}
    assert simplify([ev], lambda events: events == [ev]) == [ev]


def test_a_candidate_runs_until_shortly_after_its_last_fault() -> None:
    assert candidate_limit(_events(3)[:1], 24.0) == 4.0 + AFTER_LAST_FAULT
    assert candidate_limit(_events(40), 24.0) == 24.0


def test_the_target_is_the_failed_checkers_without_the_bite() -> None:
    summary = {
        "verdicts": [
            {"name": "fencing", "valid": False},
            {"name": "bite:stall-fenced", "valid": False},
            {"name": "liveness", "valid": True},
            {"name": "order", "valid": None},
        ]
    }
    assert failing_checkers(summary) == ["fencing"]
    assert shrink_command(Path("reports/a b")) == "wd-chaos shrink 'reports/a b'"


# -- schedule files ------------------------------------------------------------------------------


def test_the_schedule_plan_makes_passes_its_own_validation() -> None:
    sc = find("lease-stall")
    events = plan(sc, 1, 4, sc.time_limit)
    assert parse_schedule(events, "x") == events
    assert parse_schedule({"schedule": events, "seed": 1}, "run.json") == events


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"seed": 1}, "expected a JSON list"),
        ([{"fault": "stall", "at": 1, "target": "worker-0"}], "event [0]: a stall event needs duration"),
        (
            [{"fault": "stall", "at": 1, "target": "worker-0", "duration": 1}, {"fault": "nap"}],
            "event [1].fault",
        ),
        ([{"fault": "kill", "at": -1, "target": "worker-0", "failpoint": "after-claim"}], "event [0].at"),
        ([{"fault": "restart", "at": 1, "target": "the-db"}], "event [0].target"),
        ([{"fault": "restart", "at": 1, "target": "store", "colour": 1}], "event [0].colour"),
    ],
)
def test_a_bad_schedule_names_the_file_the_event_and_the_field(data: object, expected: str) -> None:
    with pytest.raises(OptionError) as err:
        parse_schedule(data, "bad.json")
    assert str(err.value).startswith("bad.json: ") and expected in str(err.value), err.value


def test_a_schedule_must_fit_the_run() -> None:
    sc = find("lease-stall")
    wrong_worker = [{"fault": "stall", "at": 1.0, "target": "worker-9", "duration": 2.0}]
    with pytest.raises(OptionError, match=r"event \[0\]\.target: worker-9 does not exist"):
        check_options(sc, Options(schedule=wrong_worker, schedule_source="s.json"))
    too_late = [{"fault": "stall", "at": 30.0, "target": "worker-0", "duration": 2.0}]
    with pytest.raises(OptionError, match=r"event \[0\]\.at: 30.0 s is not inside the time limit"):
        check_options(sc, Options(schedule=too_late, time_limit=10))
    # a short time limit is fine with a replay whose faults fit in it
    check_options(sc, Options(schedule=[{**too_late[0], "at": 0.5}], time_limit=1))


def test_a_bad_schedule_file_is_a_usage_error_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "schedule.json"
    bad.write_text(json.dumps([{"fault": "stall", "at": "soon", "target": "worker-0", "duration": 1}]))
    done = subprocess.run(
        [sys.executable, "-m", "wd_chaos.cli", "run", "lease-stall", "--schedule", str(bad), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == USAGE, done.stderr
    assert str(bad) in done.stderr and "event [0].at" in done.stderr, done.stderr
    bad.write_text("[{")
    done = subprocess.run(
        [sys.executable, "-m", "wd_chaos.cli", "run", "lease-stall", "--schedule", str(bad), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == USAGE and "not valid JSON" in done.stderr, done.stderr


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wd_chaos.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )


def test_shrinking_a_run_that_did_not_fail_is_a_usage_error(tmp_path: Path) -> None:
    sc = find("lease-stall")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "scenario.json").write_text(sc.model_dump_json())
    (run_dir / "run.json").write_text(
        json.dumps({"scenario": sc.name, "store": "sqlite", "schedule": plan(sc, 1, 4, 24)})
    )
    verdicts = [{"name": "fencing", "valid": True}, {"name": "bite:stall-fenced", "valid": False}]
    (run_dir / "summary.json").write_text(json.dumps({"valid": False, "verdicts": verdicts}))
    done = _cli("shrink", str(run_dir), "--report-dir", str(tmp_path / "out"))
    assert done.returncode == USAGE and "failed no checker" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing ran
    (run_dir / "run.json").unlink()
    done = _cli("shrink", str(run_dir), "--report-dir", str(tmp_path / "out"))
    assert done.returncode == 255 and "run.json" in done.stderr, done.stderr
