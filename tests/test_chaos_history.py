"""The history files: per-process writers, the merge, the tail the nemesis reads, and the report
drawn from a hand-made history."""

from __future__ import annotations

import json
import os
from pathlib import Path

from wd_chaos import history
from wd_chaos.client.workload import classify
from wd_chaos.report import write_report
from without_durability import Contended, Fenced, InvalidKey, StoreUnavailable


def test_writers_merge_by_monotonic_time_and_pair(tmp_path: Path) -> None:
    a = history.HistoryWriter(tmp_path / "a.jsonl", "worker-0")
    b = history.HistoryWriter(tmp_path / "b.jsonl", "worker-1")
    op_a = a.invoke("record", workflow="w", key="k", value=(1, 2), token=3)
    op_b = b.invoke("claim", workflow="w")
    b.complete(op_b, "claim", "ok", token=4)
    a.complete(op_a, "record", "fenced", error="Fenced")
    b.invoke("append", workflow="w", value="m")  # b is killed here: no complete
    a.close()
    b.close()
    merged = history.merge([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], tmp_path / "h.jsonl")
    assert [line["mono"] for line in merged] == sorted(line["mono"] for line in merged)
    assert history.load(tmp_path / "h.jsonl") == merged
    assert merged[0]["value"] == [1, 2] and merged[0]["pid"] == os.getpid()
    ops = history.pair(merged)
    assert [o["complete"] is None for o in ops] == [False, False, True]


def test_tail_reads_only_whole_new_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    tail = history.Tail(path)
    assert tail.read() == []
    with path.open("ab") as handle:
        handle.write(b'{"a": 1}\n{"b"')
    assert tail.read() == [{"a": 1}]
    with path.open("ab") as handle:
        handle.write(b": 2}\n")
    assert tail.read() == [{"b": 2}]


def test_outcomes_of_errors() -> None:
    assert classify(Fenced("w", 1), "record") == "fenced"
    assert classify(Contended("w"), "claim") == "contended"
    assert classify(InvalidKey("bad"), "record") == "failed"
    assert classify(StoreUnavailable("gone"), "record") == "unknown"
    assert classify(StoreUnavailable("gone"), "load") == "failed"


def test_a_report_is_written_from_a_hand_made_history(tmp_path: Path) -> None:
    h = history.HistoryWriter(tmp_path / "p.jsonl", "worker-0")
    op = h.invoke("claim", workflow="w")
    h.complete(op, "claim", "ok", token=1)
    bad = h.invoke("record", workflow="w", key="k", value=1, token=1)
    h.complete(bad, "record", "fenced", error="Fenced")
    h.event("fault", fault="stall", phase="start", id="s0", target="worker-0", target_pid=1)
    h.event("fault", fault="stall", phase="stop", id="s0", target="worker-0", target_pid=1)
    h.close()
    ops = history.load(tmp_path / "p.jsonl")
    summary = {
        "scenario": "x", "store": "sqlite", "seed": 1, "time_limit": 1, "workers": 1,
        "workflows": 1, "exit_code": 1, "valid": False, "counts": {},
        "faults": [o for o in ops if o["type"] == "fault"],
        "verdicts": [{"name": "fencing", "valid": False, "summary": "1 violation",
                      "evidence": [{"op": bad, "why": "accepted"}], "evidence_total": 1,
                      "counts": {}}],
    }  # fmt: skip
    out = write_report(tmp_path, summary, ops, {})
    text = out.read_text()
    assert "INVALID" in text and "data:image/png;base64," in text and "plots failed" not in text
    assert json.dumps("accepted")[1:-1] in text
