"""The server-backed store tutorial's example (``examples/server_store``) does what the page says:
its two kits are registered, its scheduler passes the conformance suite's queue tests on a real
Postgres, and ``wd-chaos run lease-stall --store pgqueue`` on a user's server is valid and drops the
run's schema afterwards. The example is not installed here: each check runs in a process of its own
that finds the package on PYTHONPATH and its entry points in a dist-info folder made for it, as an
install would leave them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "server_store"


def _entry_points() -> dict[str, str]:
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    return dict(project["entry-points"]["without_durability.stores"])


def _env(tmp: Path, **more: str) -> dict[str, str]:
    """An environment in which the example is importable and its kits registered, as installed."""
    info = tmp / "wd_pgqueue_store-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: wd-pgqueue-store\nVersion: 0.1.0\n")
    lines = "".join(f"{name} = {value}\n" for name, value in _entry_points().items())
    (info / "entry_points.txt").write_text(f"[without_durability.stores]\n{lines}")
    path = os.pathsep.join([str(tmp), str(EXAMPLE / "src"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **more}


def test_the_examples_two_kits_are_registered_and_declare_the_same_store(tmp_path: Path) -> None:
    assert _entry_points() == {
        "pgqueue": "pgqueue_store.kit:KIT",
        "pgqueue-by-hand": "pgqueue_store.kit_by_hand:KIT",
    }
    code = (
        "from without_durability.testing.kit import find_kit\n"
        "short, by_hand = find_kit('pgqueue'), find_kit('pgqueue-by-hand')\n"
        "assert short.server_key == by_hand.server_key == 'postgres', (short.server_key, by_hand.server_key)\n"
        "assert short.provides == by_hand.provides, (short.provides, by_hand.provides)\n"
        "assert short.mutant_modules == by_hand.mutant_modules == (), short.mutant_modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"the example's kits: {done.stderr}"


@pytest.mark.wd_store(["postgres"])
def test_the_examples_scheduler_passes_the_conformance_suites_queue_tests(
    wd_factory: Any, tmp_path: Path
) -> None:
    _, server = wd_factory
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:xdist",
            "--wd-store", "pgqueue-by-hand",
            "-k", "take or wake or schedule or cancel or arrive or deliver or discard",
        ],
        cwd=EXAMPLE,
        env=_env(tmp_path, WD_POSTGRES_URL=server.url),
        capture_output=True,
        text=True,
        timeout=500,
    )
    tail = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, f"the conformance suite on pgqueue-by-hand failed:\n{tail}"
    assert "[pgqueue-by-hand] PASSED" in done.stdout, f"no test ran on pgqueue-by-hand:\n{tail}"


@pytest.mark.wd_store(["postgres"])
def test_lease_stall_on_the_example_is_valid_and_drops_its_schema_from_the_users_server(
    wd_factory: Any, tmp_path: Path
) -> None:
    import psycopg

    _, server = wd_factory
    reports = tmp_path / "reports"
    done = subprocess.run(
        [sys.executable, "-m", "wd_chaos.cli", "run", "lease-stall", "--store", "pgqueue", "--json", "--report-dir", str(reports)],
        env=_env(tmp_path / "ep", WD_POSTGRES_URL=server.url),  # the server stands for the user's own
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"lease-stall on pgqueue: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    (run_json,) = reports.glob("*/run.json")
    cleanup = json.loads(run_json.read_text())["store_cleanup"]
    assert [e["outcome"] for e in cleanup] == ["removed"] * len(cleanup) and cleanup, cleanup
    with psycopg.connect(server.url) as conn:
        for entry in cleanup:
            left = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (entry["namespace"],)).fetchone()
            assert left is None, f"run.json says {entry}, and schema {entry['namespace']} is still on the server"
