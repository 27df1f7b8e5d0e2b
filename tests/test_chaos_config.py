"""The run config (config.json) and the history line, each defined once in ``wd_chaos.config``:
the shapes the files always had are kept, a bad one is refused naming the file and field, and the
worker process refuses a bad config before it touches the store."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from wd_chaos import history
from wd_chaos.config import ConfigError, RunConfig, check_line, load, validate
from wd_chaos.scenario import find


def _as_the_runner_writes_it(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    sc = find("long-wait")
    work = sc.workload.model_dump()
    work["workers"] = 3
    cfg: dict[str, Any] = {
        "run_dir": str(tmp_path),
        "store": {"store": "sqlite", "path": str(tmp_path / "store.db"), "namespace": "chaos"},
        "lifecycle": sc.lifecycle.model_dump() if sc.lifecycle else None,
        "failing": ["w-1"],
        "worker_urls": {},
        "wakeup_urls": {},
        "worker_specs": {},
        "lease": sc.lease.model_dump(),
        "workload": work,
        "seed": 7,
        "workflows": ["w-0", "w-1"],
        "starts": [0.0, 1.5],
        "t0": 1_700_000_000.25,
        "retry_seconds": sc.lease.budget * 2 + 10,
        "storm": None,
    }
    cfg.update(changes)
    return cfg


def test_the_config_json_keeps_its_keys_and_shapes(tmp_path: Path) -> None:
    written = _as_the_runner_writes_it(tmp_path)
    typed = validate(written, "config.json")
    assert json.loads(typed.to_json()) == written
    assert typed.lease.alive == written["lease"]["alive"] and typed.workload.workers == 3
    assert typed.lifecycle is not None and typed.lifecycle.max_attempts == written["lifecycle"]["max_attempts"]


def test_a_key_not_yet_typed_travels_and_reads_as_before(tmp_path: Path) -> None:
    typed = validate(_as_the_runner_writes_it(tmp_path, clock_offset={"worker-0": 3.0}), "config.json")
    assert typed["clock_offset"] == {"worker-0": 3.0}
    assert json.loads(typed.to_json())["clock_offset"] == {"worker-0": 3.0}
    assert typed["seed"] == 7 and typed.get("failing") == ["w-1"] and typed.get("nothing", 1) == 1
    assert typed["workload"]["writers"] == typed.workload.writers
    with pytest.raises(KeyError):
        typed["nothing"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"seed": "seven"}, r"config\.json: seed: .*integer"),
        ({"lease": {"alive": -1.0}}, r"config\.json: lease\.alive: .*greater than 0"),
        ({"workload": {"writers": 2, "wrtiers": 3}}, r"config\.json: workload\.wrtiers: Extra inputs"),
        ({"starts": [0.0]}, r"config\.json: starts: expected one per workflow \(2\), got 1"),
        ({"failing": ["nobody"]}, r"failing: \['nobody'\] are not among the workflows"),
        ({"store": {"path": "x"}}, r"store: expected a spec with a 'store'"),
        ({"retry_seconds": 0}, r"retry_seconds: .*greater than 0"),
    ],
)
def test_a_bad_config_is_refused_naming_file_and_field(
    tmp_path: Path, change: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected):
        validate(_as_the_runner_writes_it(tmp_path, **change), "config.json")


def test_a_missing_field_and_bad_json_name_the_file(tmp_path: Path) -> None:
    cfg = _as_the_runner_writes_it(tmp_path)
    del cfg["workflows"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"config\.json: workflows: Field required"):
        load(path)
    path.write_text("{")
    with pytest.raises(ConfigError, match=r"config\.json: not valid JSON"):
        load(path)


def test_a_worker_process_refuses_a_bad_config_before_the_store(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_as_the_runner_writes_it(tmp_path, lease={"alive": "soon"})))
    done = subprocess.run(
        [sys.executable, "-m", "wd_chaos.client.workload", "worker", str(path), "worker-0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "lease.alive" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "store.db").exists() and not (tmp_path / "procs").exists()


def test_a_good_config_reads_back_as_the_same_record(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(validate(_as_the_runner_writes_it(tmp_path), "x").to_json())
    assert load(path) == RunConfig.model_validate(_as_the_runner_writes_it(tmp_path))


# -- the history line ------------------------------------------------------------------------------


def test_the_writer_refuses_a_line_that_is_not_a_history_line(tmp_path: Path) -> None:
    writer = history.HistoryWriter(tmp_path / "p.jsonl", "worker-0")
    with pytest.raises(ConfigError, match=r"a invoke line needs op, f"):
        writer.write({"type": "invoke"})
    with pytest.raises(ConfigError, match=r"type: String should match pattern"):
        writer.write({"type": "Not A Kind"})
    writer.event("info", what="fine")
    writer.close()
    lines = (tmp_path / "p.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["what"] == "fine"


def test_check_line_needs_an_outcome_on_a_complete() -> None:
    line = {"type": "complete", "op": "a:1:1", "f": "claim", "process": "a", "pid": 1, "mono": 1, "wall": "t"}
    with pytest.raises(ConfigError, match="needs outcome"):
        check_line(line, "here")
    check_line({**line, "outcome": "ok"}, "here")
    with pytest.raises(ConfigError, match=r"here: outcome: Input should be 'ok'"):
        check_line({**line, "outcome": "maybe"}, "here")


def _sealed(path: Path, lines: list[dict[str, Any]]) -> None:
    body = b"".join((json.dumps(line, sort_keys=True) + "\n").encode() for line in lines)
    end = {"type": "end", "lines": len(lines), "sha256": hashlib.sha256(body).hexdigest()}
    path.write_bytes(body + (json.dumps(end) + "\n").encode())


def test_a_finished_history_whose_line_is_malformed_is_refused_naming_it(tmp_path: Path) -> None:
    writer = history.HistoryWriter(tmp_path / "p.jsonl", "worker-0")
    op = writer.invoke("claim", workflow="w")
    writer.complete(op, "claim", "ok", token=1)
    writer.close()
    merged = history.merge([tmp_path / "p.jsonl"], tmp_path / "h.jsonl")
    assert history.load_finished(tmp_path / "h.jsonl") == merged
    broken = [dict(merged[0]), dict(merged[1])]
    del broken[1]["mono"]  # sealed with a matching digest: only the line check can see it
    _sealed(tmp_path / "bad.jsonl", broken)
    with pytest.raises(history.DamagedHistory, match=r"bad\.jsonl: line 2: mono: Field required"):
        history.load_finished(tmp_path / "bad.jsonl")


def test_merge_refuses_a_process_file_with_a_malformed_line(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text(json.dumps({"type": "info", "process": "x", "pid": 1, "wall": "t"}) + "\n")
    with pytest.raises(history.DamagedHistory, match=r"p\.jsonl: line 1: mono: Field required"):
        history.merge([tmp_path / "p.jsonl"], tmp_path / "h.jsonl")
