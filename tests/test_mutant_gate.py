"""The mutant gate's own rules: what counts as a kill, which catalogue a run can name, and that a
mutant reaches a store the check builds itself. No server needed: these judge results and lookups."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import without_durability.sqlite
from wd_chaos.mutants import Mutant, catalogue, replaced
from wd_chaos.mutants.runner import CheckResult, _pytest_config, judge
from wd_chaos.mutation.catalogue import find_mutant
from without_durability.sqlite import SqliteCheckpointer

ROOT = Path(__file__).resolve().parents[1]


def _one(name: str) -> Mutant:
    return next(m for m in catalogue() if m.name == name)


def test_a_check_that_fails_on_the_real_store_too_kills_nothing() -> None:
    mutant = _one("sqlite-renew-past-budget")
    check = "test_renew_never_passes_the_budget"
    results = [CheckResult(check, mutant.name, "failed", 0.1), CheckResult(check, "sqlite", "failed", 0.1)]
    verdict = judge([mutant], results, 0.0).mutants[0]
    assert not verdict.killed, "a check failing on the real store as well was credited as a kill"
    assert "the real store failed it too" in verdict.evidence


def test_a_kill_needs_the_real_store_to_pass_the_same_check_and_is_counted_by_kind() -> None:
    mutant = _one("postgres-record-without-fence")
    test, chaos = "test_superseded_record_is_fenced_and_writes_nothing", "chaos:lease-stall:fencing"
    name = mutant.name
    results = [
        CheckResult(test, name, "failed", 0.1),
        CheckResult(chaos, name, "failed", 1.0),
        CheckResult(test, "postgres", "passed", 0.1),
        CheckResult(chaos, "postgres", "passed", 1.0),
    ]
    report = judge([mutant], results, 0.0)
    verdict = report.mutants[0]
    assert verdict.killed and verdict.killed_by_tests and verdict.killed_by_chaos
    assert (report.killed_by_tests, report.killed_by_chaos) == (1, 1)
    only_test = judge([mutant], [r for r in results if r.check == test], 0.0)
    assert (only_test.killed_by_tests, only_test.killed_by_chaos) == (1, 0)


def test_a_redis_set_mutant_runs_on_the_redis_chaos_store() -> None:
    pytest.importorskip("redis")
    assert find_mutant("redis-token-plain-counter", "redis").store == "redis-set"
    with pytest.raises(ValueError, match="breaks the redis-set store, not sqlite"):
        find_mutant("redis-token-plain-counter", "sqlite")


def test_a_catalogue_module_reaches_the_chaos_half(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_catalogue.py").write_text(
        "from wd_chaos.mutants import Mutant, swap\n"
        "from without_durability.kits.sqlite_mutants import RenewPastBudget\n"
        "MUTANTS = [Mutant('mine', 'sqlite', 'budget', 'mine', ('chaos:budget-overrun:fencing',),"
        " swap('checkpointer', RenewPastBudget))]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("WD_MUTANT_MODULES", "my_catalogue")
    assert find_mutant("mine", "sqlite").name == "mine"


def test_a_mutant_replaces_the_real_class_everywhere_while_its_check_runs() -> None:
    mutant, real = _one("sqlite-renew-past-budget"), SqliteCheckpointer
    with replaced(mutant):
        here = sys.modules[__name__].SqliteCheckpointer
        assert here.__name__ == "RenewPastBudget", "a test's own import still named the real class"
        assert without_durability.sqlite.SqliteCheckpointer is here, "the store's own module kept it"
    assert sys.modules[__name__].SqliteCheckpointer is real
    assert without_durability.sqlite.SqliteCheckpointer is real


def test_the_gate_runs_a_killer_file_under_its_projects_pytest_config(tmp_path: Path) -> None:
    args = _pytest_config([str(ROOT / "tests" / "test_worker.py")], tmp_path)
    assert args == ["--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml")]
    assert "asyncio_mode=auto" in _pytest_config([], tmp_path)


def test_a_wall_step_moves_the_clock_a_process_clock_store_reads_and_nothing_else(tmp_path: Path) -> None:
    from datetime import timedelta

    from wd_chaos.scenario import find, plan
    from wd_chaos.stores import WALL_OFFSET, stepped_clock
    from without_durability.clock import system_clock

    steps = [e for e in plan(find("lease-stall"), 1, 4, 24.0) if e["fault"] == "wall-step"]
    assert [e["seconds"] for e in steps] == [30.0, -3.0, 30.0], steps
    clock = stepped_clock(str(tmp_path / WALL_OFFSET))
    assert abs(clock() - system_clock()) < timedelta(seconds=1), "no step yet, no offset"
    (tmp_path / WALL_OFFSET).write_text("30.0")
    assert clock() - system_clock() > timedelta(seconds=29), "the step did not reach the store's clock"


def test_a_process_a_check_starts_meets_the_mutant_through_the_environment() -> None:
    import os
    import subprocess

    probe = (
        "from wd_chaos.mutants import install_from_env\n"
        "install_from_env()\n"
        "from without_durability.sqlite import SqliteCheckpointer\n"
        "print(SqliteCheckpointer.__name__)\n"
    )
    env = {**os.environ, "WD_MUTANT": "sqlite-renew-past-budget"}
    got = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert got.stdout.strip() == "RenewPastBudget", got.stderr
    env.pop("WD_MUTANT")
    got = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert got.stdout.strip() == "SqliteCheckpointer", "a process outside a mutant's check met a mutant"


def _stored_run(folder: Path, name: str, stamp: str, **summary: object) -> Path:
    import json

    run_dir = folder / name
    run_dir.mkdir(parents=True)
    fields: dict[str, object] = {
        "scenario": "lease-stall",
        "store": "sqlite",
        "mutant": None,
        "client": "harness",
        "schedule_from": "seed",
        "valid": True,
        "analyzed_at": stamp,
        "verdicts": [{"name": "fencing", "valid": True}],
    }
    (run_dir / "summary.json").write_text(json.dumps({**fields, **summary}))
    (run_dir / "final.json").write_text(json.dumps({"fast_failover": summary.get("ff", False)}))
    return run_dir


def test_real_runs_reuse_only_a_shipped_stores_valid_run_and_judge_from_it(tmp_path: Path) -> None:
    """``--real-runs``: a real store's run of the scenario that was valid, on the harness's client,
    with no mutant, no fast failover and its seed's own schedule, the newest of them; the chaos
    runner then judges the real store from it without running, and still runs every mutant."""
    from wd_chaos.mutants.command import chaos_runner, stored_real_runs

    old = _stored_run(tmp_path / "a", "old", "2026-01-01")
    new = _stored_run(tmp_path / "b", "new", "2026-02-01")
    _stored_run(tmp_path / "b", "unknown", "2026-03-01", valid="unknown")
    _stored_run(tmp_path / "b", "mutant", "2026-03-01", mutant="sqlite-record-without-fence")
    _stored_run(tmp_path / "b", "worker", "2026-03-01", client="worker")
    _stored_run(tmp_path / "b", "replay", "2026-03-01", schedule_from="schedule.json")
    _stored_run(tmp_path / "b", "ff", "2026-03-01", ff=True, store="postgres")
    found = stored_real_runs([tmp_path / "a", tmp_path / "b"])
    assert found == {("lease-stall", "sqlite"): new}, found
    assert old != new
    verdicts = chaos_runner(8, found)("lease-stall", "sqlite", None, tmp_path / "out")
    assert verdicts["fencing"] == "valid" and str(new) in verdicts["__evidence__"]
    assert not (tmp_path / "out").exists(), "the real store's run was made again"


def test_a_simulation_kill_is_counted_apart_and_needs_the_real_store_to_pass_the_same_seeds() -> None:
    """``sim:<scenario>:<checker>`` killers (wd-chaos sim) are harness checks of their own: kept out
    of the pytest session, counted as sim kills (not tests, not wd-chaos runs), and void when the
    real store failed the same simulation."""
    from wd_chaos.mutants.runner import check_name

    mutant = _one("memory-batch-sends-cancelled")
    sim = "sim:lease-stall:cancelled-calls"
    assert sim in mutant.killers and check_name(sim) == sim
    results = [CheckResult(sim, mutant.name, "failed", 1.0), CheckResult(sim, "memory", "passed", 1.0)]
    report = judge([mutant], results, 0.0)
    assert report.mutants[0].killed and report.mutants[0].killed_by_sim
    assert (report.killed_by_tests, report.killed_by_chaos, report.killed_by_sim) == (0, 0, 1)
    void = judge([mutant], [results[0], CheckResult(sim, "memory", "failed", 1.0)], 0.0)
    assert not void.mutants[0].killed


def test_a_sim_killer_must_name_a_simulated_store_and_a_checker_it_judges() -> None:
    from wd_chaos.mutants import CatalogueError, check_killers

    memory = _one("memory-batch-sends-cancelled")
    postgres = _one("postgres-record-without-fence")  # a server's store: no simulation of it
    for mutant, killer, why in (
        (memory, "sim:lease-stall:no-such-checker", "judges no"),
        (memory, "sim:no-such-scenario:fencing", "no-such-scenario"),
        (postgres, "sim:lease-stall:fencing", "not 'postgres'"),
    ):
        broken = Mutant(
            mutant.name, mutant.store, mutant.guarantee, mutant.description, (killer,), mutant.wrap
        )
        with pytest.raises(CatalogueError, match=why):
            check_killers([broken])


def test_a_chaos_killer_runs_again_on_a_miss_but_never_past_a_verdict() -> None:
    """A mutant's run that came out valid, or any run that came out unknown, gets another seed; a
    real store's valid run and every invalid run are final (a real store is never run until it fails)."""
    from wd_chaos.mutants.command import another_seed

    assert another_seed({"valid": True}, "redis-appendfsync-everysec") == "valid (the mutant was not caught)"
    assert another_seed({"valid": "unknown"}, "redis-appendfsync-everysec") == "unknown"
    assert another_seed({"valid": "unknown"}, None) == "unknown"
    assert another_seed({"valid": True}, None) is None
    assert another_seed({"valid": False}, None) is None
    assert another_seed({"valid": False}, "redis-appendfsync-everysec") is None
