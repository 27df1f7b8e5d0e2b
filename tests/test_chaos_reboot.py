"""The ``reboot`` fault (``wd_chaos.faults.reboot``): a process launched after a reboot reads a
monotonic clock restarted near zero while its history stays on the machine's clock; a machine where
no time namespace can be made is a harness error, said before anything is killed; the bite check
counts the live passes a reboot ended, and only on a store whose leases run on that clock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wd_chaos.faults import Nemesis, launching
from wd_chaos.faults import reboot as rb
from wd_chaos.history import HistoryWriter, merge
from wd_chaos.rundir import FinalState
from wd_chaos.scenario import find, plan
from without_durability.testing.servers import ServerUnavailable

CHILD = """
import sys, time
from pathlib import Path
from wd_chaos.history import HistoryWriter
HistoryWriter(Path(sys.argv[1]), "worker-0").event("info", what="start")
print(time.monotonic())
"""


def _reboot(run_dir: Path, uptime: int = 2) -> dict[str, int]:
    clock = rb.offsets(uptime)
    (run_dir / rb.CONTROL).write_text(json.dumps(clock))
    return clock


def test_no_reboot_changes_nothing(tmp_path: Path) -> None:
    assert launching(tmp_path) == ([], {})


def test_a_process_launched_after_a_reboot_reads_a_restarted_clock_and_writes_the_machines(
    tmp_path: Path,
) -> None:
    _reboot(tmp_path, uptime=2)
    prefix, env = launching(tmp_path)
    assert prefix and Path(prefix[0]).name == "unshare"
    before = time.monotonic_ns()
    done = subprocess.run(
        [*prefix, sys.executable, "-c", CHILD, str(tmp_path / "h.jsonl")],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    after = time.monotonic_ns()
    mine = time.monotonic()
    reading = float(done.stdout)
    assert reading < 2 + 30 < mine, f"the child's clock did not restart: {reading} (the machine's: {mine})"
    line = json.loads((tmp_path / "h.jsonl").read_text())
    assert before <= line["mono"] <= after, "the child's history left the machine's monotonic clock"


def test_each_reboot_restarts_the_clock_again(tmp_path: Path) -> None:
    first = _reboot(tmp_path)
    time.sleep(1.1)
    second = _reboot(tmp_path)
    assert second["monotonic"] < first["monotonic"], "the second reboot kept the first's clock"


def test_no_unshare_is_a_harness_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _reboot(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ServerUnavailable, match=r"needs the unshare program.*util-linux"):
        launching(tmp_path)
    with pytest.raises(ServerUnavailable, match="unshare"):
        rb.probe(2)


def test_a_namespace_refused_is_a_harness_error_before_anything_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "unshare"
    fake.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    monkeypatch.setenv("PATH", str(bin_dir))
    try:
        events = plan(find("reboot"), 1, 4, 12.0)
        assert [e["fault"] for e in events] == ["reboot", "reboot"]
        hist = HistoryWriter(tmp_path / "controller.jsonl", "controller")
        nemesis = Nemesis(
            events, hist, tmp_path, pids=lambda: {"worker-0": victim.pid}, busy=lambda _: {"worker-0"}, seed=1
        )
        with pytest.raises(ServerUnavailable, match=r"time namespace.*Operation not permitted"):
            nemesis.tick(float(events[0]["at"]))
        assert victim.poll() is None, "a run that cannot reboot killed a process"
        assert not (tmp_path / rb.CONTROL).exists()
    finally:
        victim.kill()
        victim.wait()


def _history(tmp_path: Path, *, held: bool) -> list[dict[str, object]]:
    worker = HistoryWriter(tmp_path / "procs" / "worker-0.jsonl", "worker-0")
    op = worker.invoke("claim", alive=20.0, budget=30.0)
    worker.complete(op, "claim", "ok", workflow="wf", token=1)
    if not held:
        op = worker.invoke("release", workflow="wf", token=1)
        worker.complete(op, "release", "ok")
    ctl = HistoryWriter(tmp_path / "procs" / "controller.jsonl", "controller")
    ctl.event("fault", fault="reboot", phase="start", id="reboot-0", target_pids=[worker.pid], busy=[])
    ctl.event("fault", fault="reboot", phase="stop", id="reboot-0", target_pids=[worker.pid])
    worker.close()
    ctl.close()
    return merge(sorted((tmp_path / "procs").glob("*.jsonl")), tmp_path / "history.jsonl")


def _final(lease_clock: str) -> FinalState:
    return FinalState.from_json({"workflows": {}, "expected_workflows": [], "lease_clock": lease_clock})


def test_the_bite_counts_live_passes_a_reboot_ended(tmp_path: Path) -> None:
    ops = _history(tmp_path, held=True)
    verdict = rb.reboot_held(ops, _final("monotonic"))
    assert verdict.valid is True and verdict.counts == {"faults": 1, "bit": 1}
    assert verdict.evidence[0]["workflow"] == "wf" and verdict.evidence[0]["got_token"] == 1
    assert "reboot-0" in verdict.evidence[0]["why"]
    wall = rb.reboot_held(ops, _final("wall"))
    assert wall.valid == "unknown", "a store whose leases are not on the restarted clock was tested"


def test_a_reboot_that_ended_no_live_pass_proves_nothing(tmp_path: Path) -> None:
    verdict = rb.reboot_held(_history(tmp_path, held=False), _final("monotonic"))
    assert verdict.valid == "unknown" and verdict.counts == {"faults": 1, "bit": 0}


def _takeover(tmp_path: Path, *, rebooted: bool) -> list[dict[str, object]]:
    """A pass claims with a 20 s lease; a second process claims the workflow a moment later, with a
    reboot that killed the first (or a reboot that killed some other process) in between."""
    old = HistoryWriter(tmp_path / "procs" / "worker-0.jsonl", "worker-0")
    op = old.invoke("claim", alive=20.0, budget=30.0)
    old.complete(op, "claim", "ok", workflow="wf", token=1)
    ctl = HistoryWriter(tmp_path / "procs" / "controller.jsonl", "controller")
    killed = [old.pid] if rebooted else [old.pid + 100_000]
    ctl.event("fault", fault="reboot", phase="start", id="reboot-0", target_pids=killed, busy=[])
    new = HistoryWriter(tmp_path / "procs" / "worker-1.jsonl", "worker-1")
    new.pid = old.pid + 1
    op = new.invoke("claim", alive=20.0, budget=30.0)
    new.complete(op, "claim", "ok", workflow="wf", token=2)
    for h in (old, ctl, new):
        h.close()
    return merge(sorted((tmp_path / "procs").glob("*.jsonl")), tmp_path / "history.jsonl")


def test_fencing_lets_a_claim_take_a_pass_a_reboot_ended_and_no_other(tmp_path: Path) -> None:
    from wd_chaos.checks.fencing import fencing

    final = _final("monotonic")
    ended = fencing(_takeover(tmp_path / "a", rebooted=True), final)
    assert ended.valid is True and "a pass a reboot ended" in ended.summary
    live = fencing(_takeover(tmp_path / "b", rebooted=False), final)
    assert live.valid is False, "a claim taken from a live pass no reboot ended was let through"
