"""The report's pieces, from a hand-made history (no browser): the legend names only the faults that
happened, every run carries the command that runs it again, evidence is a table, and the run's raw
files are linked. And ``serve``'s index and file routes over such a folder, through a real socket."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from wd_chaos import history
from wd_chaos.faults import kinds
from wd_chaos.report import reproduce_command, write_report
from wd_chaos.serve import make_server, stored_runs
from wd_chaos.timeline import fault_kinds_seen


def _history(tmp_path: Path) -> tuple[list[dict[str, Any]], str]:
    """A stalled worker's pass is taken over and its late write fenced; a writer supplies."""
    h = history.HistoryWriter(tmp_path / "p.jsonl", "worker-0")
    op = h.invoke("claim", workflow="wf-0001")
    h.complete(op, "claim", "ok", token=1)
    h.event("fault", fault="stall", phase="start", id="s0", target="worker-0", target_pid=1, duration=3.0)
    h.event("fault", fault="stall", phase="stop", id="s0", target="worker-0", target_pid=1, duration=3.0)
    h.event("fault", fault="kill", phase="disarmed", id="k0")  # armed, never reached: did not happen
    late = h.invoke("record", workflow="wf-0001", key="charge", value={"n": 1}, token=1)
    h.complete(late, "record", "fenced", error="Fenced: token 1 is fenced")
    w = history.HistoryWriter(tmp_path / "w.jsonl", "writer-0")
    sup = w.invoke("supply", workflow="wf-0002", key="approve", value=True)
    w.complete(sup, "supply", "ok", value=True, won=True)
    h.close()
    w.close()
    ops = history.merge([tmp_path / "p.jsonl", tmp_path / "w.jsonl"], tmp_path / "history.jsonl")
    return ops, late


def _summary(ops: list[dict[str, Any]], valid: object, evidence: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "scenario": "lease-stall", "store": "sqlite", "seed": 7, "time_limit": 6.0, "workers": 3,
        "workflows": 2, "exit_code": 0 if valid is True else 1, "valid": valid, "schedule_from": "seed",
        "client": "harness", "mutant": None, "wall_seconds": 9.5,
        "counts": {"claim:ok": 1, "record:fenced": 1, "supply:ok": 1},
        "coverage": {"takeover-during-stall": 1},
        "faults": [o for o in ops if o["type"] == "fault"],
        "versions": {"wd-chaos": "0.1.0"},
        "verdicts": [{"name": "fencing", "valid": valid, "summary": "1 stale write refused",
                      "evidence": evidence, "evidence_total": len(evidence),
                      "counts": {"writes": 1, "refused_fenced": 1}}],
    }  # fmt: skip


def test_the_legend_lists_only_the_faults_that_happened(tmp_path: Path) -> None:
    ops, _ = _history(tmp_path)
    assert fault_kinds_seen(ops) == ["stall"]
    text = write_report(tmp_path, _summary(ops, True, []), ops, {}).read_text()
    legend = re.search(r'<p class="legend">(.*?)</p>', text, re.S)
    assert legend is not None, "the timeline has no legend"
    shown = legend.group(1)
    assert "stall" in shown and "fenced write" in shown, shown
    for other in set(kinds()) - {"stall"}:
        assert f"</i>{other}</span>" not in shown, f"legend lists {other!r}, which never happened: {shown}"


def test_a_valid_run_says_how_to_run_it_again(tmp_path: Path) -> None:
    ops, _ = _history(tmp_path)
    summary = _summary(ops, True, [])
    text = write_report(tmp_path, summary, ops, {}).read_text()
    want = "wd-chaos run lease-stall --store sqlite --seed 7 --time-limit 6 --workers 3"
    assert reproduce_command(tmp_path, summary) == want
    assert want in text, "a valid run's report must carry its reproduce command"
    assert "wd-chaos shrink" not in text  # that is for a failing run
    assert 'href="summary.json"' in text and 'href="history.jsonl"' in text


def test_the_reproduce_command_replays_a_given_schedule_and_names_a_custom_scenario(tmp_path: Path) -> None:
    ops, _ = _history(tmp_path)
    summary = {**_summary(ops, False, []), "scenario": "my-own", "schedule_from": "s.json", "mutant": "m1"}
    (tmp_path / "scenario.json").write_text("{}")
    got = reproduce_command(tmp_path, summary)
    assert got.startswith(f"wd-chaos run {tmp_path / 'scenario.json'} --store sqlite --seed 7"), got
    assert got.endswith(f"--mutant m1 --schedule {tmp_path / 'run.json'}"), got


def test_evidence_and_counts_are_tables_not_json(tmp_path: Path) -> None:
    ops, late = _history(tmp_path)
    evidence = [{"op": late, "f": "record", "token": 1, "why": "written after a newer claim"}]
    text = write_report(tmp_path, _summary(ops, False, evidence), ops, {}).read_text()
    table = re.search(r'<table class="evidence">(.*?)</table>', text, re.S)
    assert table is not None, "evidence is not a table"
    assert "<th>why</th>" in table.group(1) and "<td>written after a newer claim</td>" in table.group(1)
    assert '{"op"' not in text and "&quot;op&quot;" not in text, "evidence is still a JSON dump"
    assert "<th>operation</th>" in text and "<td>claim</td>" in text  # operation counts, one row each
    # the starred operation is the one the verdict names, and the y-axis title is drawn whole
    assert 'class="violation"' in text and ">workflow (wf-000...)</text>" in text


@pytest.fixture
def served_folder(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    reports = tmp_path / "reports"
    run_dir = reports / "20261203T120000-lease-stall-sqlite"
    run_dir.mkdir(parents=True)
    ops, _ = _history(run_dir)
    summary = _summary(ops, True, [])
    (run_dir / "summary.json").write_text(json.dumps(summary))
    write_report(run_dir, summary, ops, {})
    (reports / "mutants").mkdir()
    (reports / "mutants" / "summary.json").write_text('{"gate": "not a run"}')
    stopped = reports / "20261203T130000-lease-stall-redis"
    stopped.mkdir()
    (stopped / "run.json").write_text(json.dumps({"scenario": "lease-stall", "store": "redis", "seed": 3}))
    (stopped / "INTERRUPTED").write_text("Stopped: SIGINT\n")
    server = make_server(reports, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", run_dir
    finally:
        server.shutdown()
        server.server_close()


def test_serve_lists_a_stored_run_and_serves_its_files(served_folder: tuple[str, Path]) -> None:
    url, run_dir = served_folder
    stopped, run = stored_runs(run_dir.parent)  # newest first
    assert (stopped.store, stopped.verdict) == ("redis", "INTERRUPTED"), stopped
    assert (run.scenario, run.store, run.verdict, run.started) == (
        "lease-stall", "sqlite", "VALID", "2026-12-03 12:00:00",
    )  # fmt: skip
    index = urllib.request.urlopen(url + "/").read().decode()
    assert f'href="/runs/{run_dir.name}/report.html"' in index and ">VALID<" in index
    assert "takeover-during-stall 1" in index and "not a run" not in index
    with urllib.request.urlopen(f"{url}/runs/{run_dir.name}/history.jsonl") as got:
        assert got.headers["Content-Type"].startswith("text/plain")
        assert got.read() == (run_dir / "history.jsonl").read_bytes()
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{url}/runs/{run_dir.name}/nothing.txt")
    assert missing.value.code == 404


def test_serve_refuses_a_folder_that_is_not_there(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "wd_chaos.cli", "serve", str(tmp_path / "nowhere"), "--port", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 64, f"expected a usage error (64), got {done.returncode}: {done.stderr}"
    assert "is not a folder" in done.stderr, done.stderr
