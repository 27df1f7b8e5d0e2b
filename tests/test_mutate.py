"""wd-chaos mutate: the operators derive the edits they promise, ids are stable, and one generated
mutant, applied through WD_MUTANT_EDIT in a real pytest session on the real SQLite store, is killed
by the check named for its guarantee while the real store passes that check."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from wd_chaos.mutate.operators import LUA_OPERATORS, SQL_OPERATORS, edits
from wd_chaos.mutate.runner import _first, plan_for, run_tests, targets_of
from wd_chaos.mutate.targets import mutants, script_targets, statement_targets
from wd_chaos.mutation import patch

ROOT = Path(__file__).resolve().parent.parent


def _changes(text: str, operators: tuple[object, ...]) -> set[str]:
    return {e.apply(text) for e in edits(text, operators)}  # type: ignore[arg-type]


def test_sql_operators_flip_drop_and_swap() -> None:
    text = "UPDATE t SET a = LEAST(now() + x, b) WHERE w = :w AND t <= :now FOR UPDATE SKIP LOCKED -- a < b"
    got = _changes(text, SQL_OPERATORS)
    assert (
        "UPDATE t SET a = GREATEST(now() + x, b) WHERE w = :w AND t <= :now FOR UPDATE SKIP LOCKED -- a < b"
        in got
    )
    assert (
        "UPDATE t SET a = LEAST(clock_timestamp() + x, b) WHERE w = :w AND t <= :now FOR UPDATE SKIP LOCKED -- a < b"
        in got
    )
    assert (
        "UPDATE t SET a = LEAST(now() + x, b) WHERE w = :w AND t < :now FOR UPDATE SKIP LOCKED -- a < b"
        in got
    )
    assert "UPDATE t SET a = LEAST(now() + x, b) WHERE t <= :now FOR UPDATE SKIP LOCKED -- a < b" in got
    assert "UPDATE t SET a = LEAST(now() + x, b) WHERE w = :w FOR UPDATE SKIP LOCKED -- a < b" in got
    assert "UPDATE t SET a = LEAST(now() + x, b) WHERE w = :w AND t <= :now FOR UPDATE -- a < b" in got
    assert "UPDATE t SET a = LEAST(now() + x, b) WHERE w = :w AND t <= :now -- a < b" in got
    assert all(g.endswith("-- a < b") for g in got), "a comment is never mutated"
    assert len(got) == 7


def test_sql_conflict_arms_and_arithmetic() -> None:
    text = "INSERT INTO c VALUES (1) ON CONFLICT (w) DO UPDATE SET token = c.token + 1 WHERE c.x <= 0 RETURNING token"
    got = _changes(text, SQL_OPERATORS)
    assert "INSERT INTO c VALUES (1) ON CONFLICT (w) DO NOTHING RETURNING token" in got
    assert text.replace("+ 1", "+ 0") in got and text.replace("+ 1", "+ 2") in got
    put = "INSERT INTO c VALUES (1) ON CONFLICT (w) DO NOTHING"
    assert _changes(put, SQL_OPERATORS) == {
        "INSERT INTO c VALUES (1) ON CONFLICT (w) DO UPDATE SET value = excluded.value"
    }


def test_lua_operators_drop_conditions_and_flip() -> None:
    text = "if a == 1 and b < c then\n  return math.min(x + 1, y) -- a <= b\nend\n"
    got = _changes(text, LUA_OPERATORS)
    assert "if b < c then\n  return math.min(x + 1, y) -- a <= b\nend\n" in got
    assert "if a == 1 then\n  return math.min(x + 1, y) -- a <= b\nend\n" in got
    assert "if a ~= 1 and b < c then\n  return math.min(x + 1, y) -- a <= b\nend\n" in got
    assert "if a == 1 and b <= c then\n  return math.min(x + 1, y) -- a <= b\nend\n" in got
    assert "if a == 1 and b < c then\n  return math.max(x + 1, y) -- a <= b\nend\n" in got
    assert "if a == 1 and b < c then\n  return math.min(x + 0, y) -- a <= b\nend\n" in got


def test_every_store_yields_mutants_with_unique_stable_ids() -> None:
    for store, targets in (
        ("sqlite", statement_targets("without_durability.sqlite")),
        ("postgres", statement_targets("without_durability_postgres")),
        ("redis", script_targets("without_durability_redis")),
    ):
        found = mutants(store, targets)
        ids = [m.id for m in found]
        assert len(found) > 30 and len(set(ids)) == len(ids), store
        assert ids == [m.id for m in mutants(store, targets)]
    names = {t.short for t in statement_targets("without_durability_postgres")}
    assert {"CLAIM", "RECORD", "TAKE", "APPEND"} <= names
    assert "_THEN_TAKE" not in names, (
        "a constant only read at import is not a target: patching it changes nothing"
    )


def test_a_spec_in_the_environment_patches_module_and_class_alike() -> None:
    spec = next(
        m
        for m in mutants("sqlite", statement_targets("without_durability.sqlite"))
        if m.target.endswith(":CLAIM")
    )
    code = (
        "from wd_chaos.mutants import install_from_env; install_from_env()\n"
        "from without_durability import sqlite\n"
        f"print(sqlite.CLAIM == sqlite.SqliteCheckpointer.CLAIM, sqlite.CLAIM.count({spec.new!r}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**_env(), patch.EDIT_ENV: spec.to_json()},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", str(spec.edit.apply(_claim()).count(spec.new))]
    bad = {**json.loads(spec.to_json()), "old": "no such text"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**_env(), patch.EDIT_ENV: json.dumps(bad)},
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "expected 'no such text'" in done.stderr


def _claim() -> str:
    from without_durability import sqlite

    return sqlite.CLAIM


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != patch.EDIT_ENV}


SCRIPT_READER = """
from functools import cache
from importlib.resources import files


@cache
def read(name: str) -> str:
    return (files(__package__) / "scripts" / f"{name}.lua").read_text()


@cache
def source(name: str) -> str:
    return "-- assembled\\n" + read(name)
"""


def test_a_script_mutant_reaches_any_kit_that_names_its_scripts_package_and_reader(tmp_path: Path) -> None:
    """Generated script mutants are not Redis's alone: a toy scripts package whose kit would name
    its reader gets its script replaced in a fresh process, its assembled (cached) source included;
    a spec naming no reader is refused with what to declare."""
    package = tmp_path / "toy_scripts"
    (package / "scripts").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "reader.py").write_text(SCRIPT_READER)
    (package / "scripts" / "claim.lua").write_text("if a == 1 and b < c then return 1 end\n")
    (package / "scripts" / "other.lua").write_text("return 2\n")
    env = {**_env(), "PYTHONPATH": str(tmp_path)}
    listed = subprocess.run(
        [sys.executable, "-c", "from wd_chaos.mutate.targets import mutants, script_targets\n"
         "for m in mutants('toy', script_targets('toy_scripts', 'toy_scripts.reader:read')): print(m.to_json())"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    spec = next(
        patch.Spec.from_json(line)
        for line in listed.stdout.splitlines()
        if '"target": "lua:claim"' in line and '"operator": "comparison"' in line
    )
    assert spec.reader == "toy_scripts.reader:read" and spec.id.startswith("toy:claim:comparison:")
    code = (
        "from toy_scripts import reader\n"
        "before = reader.source('claim')\n"  # cached before the mutant arrives
        "from wd_chaos.mutants import install_from_env; install_from_env()\n"
        "import json; print(json.dumps([before, reader.source('claim'), reader.source('other')]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, patch.EDIT_ENV: spec.to_json()},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    before, after, other = json.loads(done.stdout)
    assert after == "-- assembled\n" + spec.edit.apply(before.removeprefix("-- assembled\n")) != before
    assert other == "-- assembled\nreturn 2\n"
    unread = patch.Spec(**{**json.loads(spec.to_json()), "reader": ""})
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, patch.EDIT_ENV: unread.to_json()},
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "MutatePlan.script_reader" in done.stderr


def test_one_generated_mutant_is_killed_where_the_real_store_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    check = "tests/test_conformance.py::test_superseded_record_is_fenced_and_writes_nothing"
    plan = replace(plan_for("sqlite"), tests=(check,))
    spec = next(
        m
        for m in mutants("sqlite", statement_targets("without_durability.sqlite"))
        if m.target.endswith(":FENCE_AND_RENEW") and m.old.strip() == "AND token = :token"
    )
    real = run_tests(plan, None, timeout=120)
    assert real.code == 0, real.tail
    broken = run_tests(plan, spec, timeout=120)
    assert broken.code == 1 and broken.failed.startswith(check), broken.tail
    # on pytest-xdist too, where a -x session ends "interrupted" (exit 2) at the first failure
    spread = run_tests(replace(plan, tests=(check, "tests/test_sqlite.py")), spec, timeout=120, jobs=2)
    assert spread.code == 1 and spread.failed.startswith(check), spread.tail


def test_the_command_lists_mutants_and_refuses_an_unknown_store_clearly() -> None:
    from click.testing import CliRunner

    from wd_chaos.cli import main

    listed = CliRunner().invoke(main, ["mutate", "--store", "sqlite", "--list"])
    assert listed.exit_code == 0, listed.output
    assert "sqlite:FENCE_AND_RENEW:drop-and:" in listed.output and "=>" in listed.output
    unknown = CliRunner().invoke(main, ["mutate", "--store", "mine"])
    assert (
        unknown.exit_code == 64 and "--statements MODULE, --tests PATH and --wd-store NAME" in unknown.output
    )


def test_equivalents_name_real_mutants_each_with_a_reason() -> None:
    """Each built-in kit ships its own list of equivalent mutants, in its own package, and every
    statement or script entry in it names a mutant its plan generates."""
    from wd_chaos.mutate.runner import equivalents, plan_equivalents

    for store in ("sqlite", "postgres", "redis"):
        plan = plan_for(store)
        known = {k for k in equivalents(plan_equivalents(plan)) if ":py:" not in k}
        ids = {m.id for m in mutants(plan.name, targets_of(plan))}
        assert known and known <= ids, f"{plan.equivalents} names no such mutant: {sorted(known - ids)}"


def test_each_built_in_kit_declares_its_plan_and_the_flags_still_replace_its_parts() -> None:
    from wd_chaos.mutate.command import _plan
    from without_durability.testing.kit import KitError

    sqlite, postgres, redis = plan_for("sqlite"), plan_for("postgres"), plan_for("redis")
    assert (sqlite.name, sqlite.wd_stores, sqlite.server) == ("sqlite", ("sqlite",), None)
    assert (postgres.name, postgres.server, postgres.server_env) == (
        "postgres",
        "postgres",
        "WD_POSTGRES_URL",
    )
    assert (redis.name, redis.wd_stores, redis.server_env) == (
        "redis",
        ("redis-set", "redis-stream"),
        "WD_REDIS_URL",
    )
    stream = plan_for("redis-stream")  # either scheduler's kit: the same scripts, the same ids
    assert (stream.name, stream.scripts, stream.wd_stores) == (redis.name, redis.scripts, redis.wd_stores)
    for plan in (sqlite, postgres, redis):
        assert plan.tests and all((ROOT / t).is_file() for t in plan.tests), plan.tests
    # the kit's own statements (its ledger, its superseding claim) are the tests' harness, not the store
    names = {t.name.partition(":")[0] for t in targets_of(postgres)}
    assert (
        "without_durability_postgres.checkpointer" in names and "without_durability_postgres.kit" not in names
    )
    with pytest.raises(KitError, match="declares no mutate_plan"):
        plan_for("memory")
    flagged = _plan("postgres", (), ("tests/test_postgres.py",), (), ("-p", "x"))
    assert flagged.tests == ("tests/test_postgres.py",) and flagged.pytest_args == ("-p", "x")
    assert flagged.statements == postgres.statements


MINE = """
CLAIM = "UPDATE claim SET token = token + 1 WHERE workflow = ? AND held_until < ?"
SETUP = "CREATE TABLE claim (workflow TEXT)"


def claim(conn, workflow, now):
    return conn.execute(CLAIM, (workflow, now))
"""


def test_a_third_party_kit_declares_its_plan_and_mutate_asks_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from wd_chaos.cli import main
    from without_durability.testing import MutatePlan, StoreKit
    from without_durability.testing import kit as kit_module

    (tmp_path / "mine_statements.py").write_text(MINE)
    monkeypatch.syspath_prepend(str(tmp_path))

    class MineKit(StoreKit):
        name = "mine"
        mutate_plan = MutatePlan(statements=("mine_statements",), tests=("tests/test_mine.py",))

    monkeypatch.setattr(kit_module, "_KITS", {**kit_module.kits(), "mine": MineKit()})
    plan = plan_for("mine")
    assert (plan.name, plan.wd_stores, plan.tests) == ("mine", ("mine",), ("tests/test_mine.py",))
    listed = CliRunner().invoke(main, ["mutate", "--store", "mine", "--list"])
    assert listed.exit_code == 0, listed.output
    ids = [line.split("\t")[0] for line in listed.output.splitlines()]
    # CLAIM (read when the store runs) is mutated; SETUP (never read by a function) is not
    assert ids and all(i.startswith("mine:CLAIM:") for i in ids), ids
    assert any(":drop-and:" in i for i in ids) and any(":comparison:" in i for i in ids), ids


def test_a_mutant_meets_its_statements_killers_first_then_the_others_fastest_first() -> None:
    killers = {"m:A": ["t::slow_a", "t::fast_a"], "m:B": ["t::b"]}
    timings = {"t::slow_a": 9.0, "t::fast_a": 1.0, "t::b": 0.5}
    assert _first("m:A", killers, timings) == ("t::fast_a", "t::slow_a", "t::b")
    assert _first("m:C", killers, timings) == ("t::b", "t::fast_a", "t::slow_a")
    assert _first("m:C", {}, timings) == ()


def test_the_confirm_step_rechecks_this_jobs_kills_only_and_says_when_it_cannot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kill kept from a resumed report is not run again (its test may have been renamed since,
    and one unknown node id makes pytest refuse the whole session: every kill of a fast-failover
    sweep was once taken back so); a session that ends with no verdict is said, not silent."""
    from wd_chaos.mutate import runner
    from wd_chaos.mutation.session import Session

    def outcomes() -> dict[str, runner.Outcome]:
        fresh = runner.Outcome("m1", "t", "op", "a", "b", verdict="killed", killed_by="tests/x.py::test_now")
        kept = runner.Outcome(
            "m2", "t", "op", "a", "b", verdict="killed", killed_by="tests/x.py::test_renamed_since",
            why=f"{runner.RESUMED}reports/baseline/mutate-postgres.json",
        )  # fmt: skip
        return {"m1": fresh, "m2": kept}

    asked: list[tuple[str, ...]] = []
    said: list[str] = []

    def real(code: int) -> Any:
        def run(plan: Any, spec: Any, *, tests: tuple[str, ...], **kw: Any) -> Session:
            asked.append(tests)
            return Session(code, 1.0, stdout="ERROR: not found: tests/x.py::test_now" if code == 4 else "")

        return run

    monkeypatch.setattr(runner, "run_tests", real(0))
    got = outcomes()
    runner._confirm(plan_for("sqlite"), got, said.append)
    assert asked == [("tests/x.py::test_now",)] and [o.verdict for o in got.values()] == ["killed", "killed"]
    assert said == ["confirmed 1/1 killing tests pass on the real store"], said
    monkeypatch.setattr(runner, "run_tests", real(4))
    got = outcomes()
    runner._confirm(plan_for("sqlite"), got, said.append)
    assert got["m1"].verdict == "survived" and got["m2"].verdict == "killed"
    assert "could not confirm the kills" in said[1] and "not found" in said[1], said
