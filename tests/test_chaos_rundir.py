"""The run-folder records at the bottom of the harness: ``FinalState`` keeps ``final.json`` as it
was written, reads as the mapping checkers expect, and refuses reads in a partial analysis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wd_chaos import checks
from wd_chaos.rundir import DamagedRun, FinalState, FinalUnread, read_final, read_objects

WRITTEN = {
    "workflows": {
        "w-1": {"history": [["charge", {"nonce": "n"}, "2026-12-03T00:00:00+00:00"]], "load_keys": ["charge"]}
    },
    "ledger": [{"row": 1, "workflow": "w-1", "key": "ledger", "token": 1}],
    "expected_workflows": ["w-1"],
    "store_clock": "local",
    "lease_clock": "wall",
    "a_key_from_later": 3,
}


def test_final_json_round_trips_with_unknown_keys_kept(tmp_path: Path) -> None:
    (tmp_path / "final.json").write_text(json.dumps(WRITTEN))
    final = read_final(tmp_path)
    assert final.to_json() == WRITTEN, f"expected {WRITTEN!r}, got {final.to_json()!r}"
    assert final.ledger == WRITTEN["ledger"] and final.extra == {"a_key_from_later": 3}


def test_the_mapping_view_holds_only_what_was_recorded() -> None:
    final = FinalState.from_json(WRITTEN)
    assert final["store_clock"] == "local" and final.get("lifecycle") is None
    assert "lifecycle" not in final and "failing" not in final and "ledger" in final
    with pytest.raises(KeyError):
        final["failing"]
    assert dict(final) == WRITTEN


def test_a_partial_analysis_refuses_every_read_of_the_store() -> None:
    final = FinalState.unread_with([])
    assert final["wall_clock_steps"] == [] and final.get("store_clock") == "unrecorded"
    for read in (lambda: final["ledger"], lambda: final.get("workflows"), lambda: "ledger" in final):
        with pytest.raises(FinalUnread):
            read()


def test_a_checker_needing_the_store_is_unknown_in_a_partial_analysis() -> None:
    lines = [
        {"type": "invoke", "op": "w:1:1", "f": "claim", "process": "w", "pid": 1, "mono": 1, "wall": "x"},
    ]
    (verdict, _bite) = checks.check(lines, FinalState.unread_with([]), ["durability"], "none")
    assert verdict.valid == checks.UNKNOWN and "FinalUnread" in str(verdict.evidence[:1]), verdict


def test_a_folder_without_its_files_is_a_damaged_run(tmp_path: Path) -> None:
    with pytest.raises(DamagedRun, match="not a finished run's folder"):
        read_objects(tmp_path, "run.json")
    (tmp_path / "run.json").write_text("[]")
    with pytest.raises(DamagedRun, match="must each hold a JSON object"):
        read_objects(tmp_path, "run.json")
