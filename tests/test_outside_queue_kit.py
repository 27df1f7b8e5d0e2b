"""A queue kit from outside whose answers act by id, without the receipt check: the stock
``lease-stall`` finds it INVALID with the core scheduler checkers, naming the calls (issue 44)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

OUTSIDE = Path(__file__).parent / "outside_kit"


def _installed(tmp_path: Path) -> dict[str, str]:
    """An environment in which the outside kit is installed: its module and a ``.dist-info``
    declaring its entry point, both on PYTHONPATH, as ``pip install`` would leave them."""
    info = tmp_path / "site" / "byid_queue-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: byid-queue\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[without_durability.stores]\nbyid = byid_queue:KIT\n")
    path = os.pathsep.join([str(tmp_path / "site"), str(OUTSIDE), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def test_a_queue_that_answers_by_id_is_invalid_under_stock_lease_stall(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("wd-chaos")
    done = subprocess.run(
        [str(exe), "run", "lease-stall", "--store", "byid", "--time-limit", "12"],
        cwd=tmp_path, env=_installed(tmp_path), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, f"expected INVALID (exit 1), got {done.returncode}: {done.stdout[-3000:]}{done.stderr[-2000:]}"
    (summary,) = tmp_path.glob("reports/*/summary.json")
    verdicts = {v["name"]: v for v in json.loads(summary.read_text())["verdicts"]}
    caught = [verdicts[n] for n in ("stale-answer", "wakeup-stands") if verdicts[n]["valid"] is False]
    assert caught, f"expected stale-answer or wakeup-stands to say no: {[(n, v['summary']) for n, v in verdicts.items()]}"
    for verdict in caught:  # the evidence names the calls: the take, and the answer that acted
        calls = {e.get("f") for e in verdict["evidence"]}
        assert {"take", "wake_at"} <= calls, verdict["evidence"]
        assert all(e.get("receipt") or e.get("got_receipt") for e in verdict["evidence"] if e.get("f") in ("take", "wake_at"))
