"""Queue kits from outside, each wrong in one way a peer queue was (issue 44): answers that act by
id without the receipt check, every schedule a new job (a second entry per workflow), one job per
key kept by dropping a wakeup while held. The stock ``lease-stall`` and
``kill-between-effect-and-record`` find each INVALID with the core scheduler checkers, naming the
calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

OUTSIDE = Path(__file__).parent / "outside_kit"


ENTRY_POINTS = "byid = byid_queue:KIT\nsecs = secs_queue:KIT\njobs = jobs_queue:JOBS_KIT\nkeyed-jobs = jobs_queue:KEYED_KIT\n"


def _installed(tmp_path: Path) -> dict[str, str]:
    """An environment in which the outside kits are installed: their modules and a ``.dist-info``
    declaring their entry points, both on PYTHONPATH, as ``pip install`` would leave them."""
    info = tmp_path / "site" / "outside_queues-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: outside-queues\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[without_durability.stores]\n{ENTRY_POINTS}")
    path = os.pathsep.join([str(tmp_path / "site"), str(OUTSIDE), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def _run(tmp_path: Path, scenario: str, store: str, seeds: int = 1) -> dict[str, dict[str, Any]]:
    """``wd-chaos run SCENARIO --store STORE`` with the outside kits installed, on seed 1, 2, ...
    until one is INVALID (exit 1), at most ``seeds`` of them: that run's verdicts by checker name.
    A bug that needs a race to land may miss one seed on a loaded machine, as the gate allows."""
    exe = Path(sys.executable).with_name("wd-chaos")
    outputs = []
    for seed in range(1, seeds + 1):
        reports = tmp_path / f"seed-{seed}"
        done = subprocess.run(
            [str(exe), "run", scenario, "--store", store, "--time-limit", "12", "--seed", str(seed),
             "--report-dir", str(reports)],
            cwd=tmp_path, env=_installed(tmp_path / f"site-{seed}"), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if done.returncode == 1:
            (summary,) = reports.glob("*/summary.json")
            return {v["name"]: v for v in json.loads(summary.read_text())["verdicts"]}
        assert done.returncode in (0, 2), f"a harness failure (exit {done.returncode}): {done.stdout[-3000:]}{done.stderr[-2000:]}"
        outputs.append(done.stdout[-2000:])
    raise AssertionError(f"expected INVALID (exit 1) within {seeds} seed(s), none was:\n" + "\n".join(outputs))


def test_a_queue_that_answers_by_id_is_invalid_under_stock_lease_stall(tmp_path: Path) -> None:
    verdicts = _run(tmp_path, "lease-stall", "byid", seeds=2)
    caught = [verdicts[n] for n in ("stale-answer", "wakeup-stands") if verdicts[n]["valid"] is False]
    assert caught, f"expected stale-answer or wakeup-stands to say no: {[(n, v['summary']) for n, v in verdicts.items()]}"
    for verdict in caught:  # the evidence names the calls: the take, and the answer that acted
        calls = {e.get("f") for e in verdict["evidence"]}
        assert {"take", "wake_at"} <= calls, verdict["evidence"]
        assert all(e.get("receipt") or e.get("got_receipt") for e in verdict["evidence"] if e.get("f") in ("take", "wake_at"))


@pytest.mark.parametrize("scenario", ["lease-stall", "kill-between-effect-and-record"])
def test_a_queue_that_adds_a_job_per_schedule_is_invalid_naming_the_second_entry(tmp_path: Path, scenario: str) -> None:
    """Every schedule a new job: a workflow scheduled while held gets a second entry, which a
    second worker takes while the first still holds the workflow (take-exclusive names both
    takes), and the entries outlive their workflows (queue-bounded, where one is left over)."""
    verdicts = _run(tmp_path, scenario, "jobs", seeds=2)
    caught = {n: v for n, v in verdicts.items() if v["valid"] is False}
    assert "take-exclusive" in caught or "queue-bounded" in caught, {n: v["summary"] for n, v in verdicts.items()}
    if "take-exclusive" in caught:
        takes = [e for e in caught["take-exclusive"]["evidence"] if e.get("f") == "take"]
        assert len(takes) >= 2 and len({e["got_workflow"] for e in takes[:2]}) == 1, takes


def test_a_queue_that_drops_a_wakeup_while_held_is_invalid_naming_the_lost_wakeup(tmp_path: Path) -> None:
    """One job per key, kept by dropping a schedule while the key has one: a wakeup that lands
    while the workflow is held is lost once its holder answers; wakeup-stands names the wakeup.
    (Under lease-stall the verdict depends on the seed: its writers nudge held workflows again and
    again, so a later nudge often finds the workflow and hides the lost one; seed 1 at its full
    24 s is INVALID, seed 2 VALID.)"""
    verdicts = _run(tmp_path, "kill-between-effect-and-record", "keyed-jobs", seeds=3)
    assert verdicts["wakeup-stands"]["valid"] is False, {n: v["summary"] for n, v in verdicts.items()}
    calls = {e.get("f") for e in verdicts["wakeup-stands"]["evidence"]}  # arrive and deliver record as supply and append
    assert {"take", "wake_at"} <= calls and calls & {"schedule", "supply", "append"}, verdicts["wakeup-stands"]["evidence"]


def test_a_queue_whose_receipt_is_its_visibility_in_seconds_is_invalid_naming_both_takes(tmp_path: Path) -> None:
    """Visibility kept in whole seconds and the receipt that visibility alone: a workflow woken
    while held and taken again within the second is handed out under its first receipt again.
    receipts-distinct names the two takes (and the first holder's late answer acts on the second
    delivery, which stale-answer may name too)."""
    verdicts = _run(tmp_path, "lease-stall", "secs", seeds=2)
    distinct = verdicts["receipts-distinct"]
    assert distinct["valid"] is False, {n: v["summary"] for n, v in verdicts.items()}
    takes = [e for e in distinct["evidence"] if e.get("f") == "take"]
    assert len(takes) >= 2, distinct["evidence"]
