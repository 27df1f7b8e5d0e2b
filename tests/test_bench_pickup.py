"""The pickup benchmark as an operator runs it against their own Postgres (issue #48 item 10): poll
intervals of their choosing, percentiles in JSON and CSV."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

from without_durability.testing.kit import find_kit
from without_durability.testing.servers import provide

ROOT = Path(__file__).resolve().parents[1]


def test_pickup_measures_given_poll_intervals_on_a_given_postgres(tmp_path: Path) -> None:
    recipe = find_kit("postgres").recipe
    assert recipe is not None
    out = tmp_path / "bench"
    with provide(recipe, private=True) as server:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.pickup", "--poll", "0.01,0.05,0.25", "--postgres-url", server.url,
             "--only", "postgres", "--samples", "4", "--out", str(out)],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result = json.loads((out / "pickup.json").read_text())
    assert result["servers"] == {"postgres": "given"}, result["servers"]
    rows = result["rows"]
    assert [r.get("error") for r in rows] == [None] * len(rows), rows
    assert sorted({r["poll_ms"] for r in rows}) == [10.0, 50.0, 250.0], rows
    assert {(r["store"], r["wakeup"]) for r in rows} == {("postgres", False), ("postgres", True)}, rows
    for r in rows:
        assert r["samples"] == 4 and r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"], r
    with (out / "pickup.csv").open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) and {"p50_ms", "p90_ms", "p99_ms"} <= set(table[0]), table[:1]
    assert all(float(row["p90_ms"]) > 0 for row in table), table


def test_pickup_refuses_a_bad_poll_interval() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.pickup", "--poll", "0.01,soon"], cwd=ROOT, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "'soon' is not a number of seconds" in done.stderr, done.stderr
