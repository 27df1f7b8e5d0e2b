"""Upstream reports reproduced under a stock scenario (slow lane: ``python -m pytest -m slow`` here,
about 45 s). procrastinate's issues #1446 and #1543: a job whose ``retry_job`` meets a waiting job
of the same ``queueing_lock`` is refused (``UniqueViolation`` on
``procrastinate_jobs_queueing_lock_idx_v1``) and stays ``doing``, and with a ``lock`` its waiting
job is never fetched: the workflow is stuck. Both are open: no fixed version exists, so the
comparison is with the kit's own mapping (``procrastinate``), which ends the refused job instead.
docs/peers/procrastinate.md publishes the same runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCENARIO = "kill-between-effect-and-record"


def _run(tmp_path: Path, store: str) -> tuple[dict[str, Any], str]:
    exe = Path(sys.executable).with_name("wd-chaos")
    reports = tmp_path / store
    done = subprocess.run(
        [str(exe), "run", SCENARIO, "--store", store, "--seed", "1", "--time-limit", "8", "--report-dir", str(reports)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), (
        f"the run did not finish (exit {done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}"
    )
    (summary,) = reports.glob("*/summary.json")
    return json.loads(summary.read_text()), (summary.parent / "history.jsonl").read_text()


@pytest.mark.slow
def test_issues_1446_and_1543_a_retry_refused_by_the_queueing_lock_strands_the_workflow(
    tmp_path: Path,
) -> None:
    summary, history = _run(tmp_path, "procrastinate-recipe")
    said_no = {v["name"]: v for v in summary["verdicts"] if v["valid"] is False}
    assert summary["verdict"] == "invalid" and {"liveness", "queue-bounded"} <= set(said_no), summary[
        "verdicts"
    ]
    stuck = {e["workflow"] for e in said_no["liveness"]["evidence"]}
    doubled = {e["workflow"] for e in said_no["queue-bounded"]["evidence"]}
    assert stuck and stuck <= doubled, (
        stuck,
        doubled,
    )  # each stuck workflow: a doing job and its waiting one
    refused = [
        json.loads(line) for line in history.splitlines()
        if "procrastinate_jobs_queueing_lock_idx_v1" in line and '"f": "wake_at"' in line
    ]  # fmt: skip
    assert refused, "expected a holder's retry refused by the queueing lock in the history"
    assert all("UniqueViolation" in e["error"] for e in refused)


@pytest.mark.slow
def test_the_kits_mapping_ends_the_refused_job_and_the_same_run_is_valid(tmp_path: Path) -> None:
    summary, _ = _run(tmp_path, "procrastinate")
    said_no = [v["name"] for v in summary["verdicts"] if v["valid"] is False]
    assert summary["verdict"] == "valid", said_no
