"""The mutant gate's own rules: what counts as a kill, which catalogue a run can name, and that a
mutant reaches a store the check builds itself. No server needed: these judge results and lookups."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import without_durability.sqlite
from wd_chaos.mutants import Mutant, catalogue, replaced
from wd_chaos.mutants.runner import CheckResult, _pytest_config, judge
from wd_chaos.stores import find_mutant
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
        "from wd_chaos.mutants.sqlite import RenewPastBudget\n"
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
