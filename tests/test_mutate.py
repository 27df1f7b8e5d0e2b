"""wd-chaos mutate: the operators derive the edits they promise, ids are stable, and one generated
mutant, applied through WD_MUTANT_EDIT in a real pytest session on the real SQLite store, is killed
by the check named for its guarantee while the real store passes that check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from wd_chaos.mutate import patch
from wd_chaos.mutate.operators import LUA_OPERATORS, SQL_OPERATORS, edits
from wd_chaos.mutate.runner import PLANS, StorePlan, run_tests
from wd_chaos.mutate.targets import mutants, script_targets, statement_targets

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
        ("redis", script_targets()),
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


def test_one_generated_mutant_is_killed_where_the_real_store_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    check = "tests/test_conformance.py::test_superseded_record_is_fenced_and_writes_nothing"
    plan = StorePlan(**{**PLANS["sqlite"].__dict__, "tests": (check,)})
    spec = next(
        m
        for m in mutants("sqlite", statement_targets("without_durability.sqlite"))
        if m.target.endswith(":FENCE_AND_RENEW") and m.old.strip() == "AND token = :token"
    )
    real = run_tests(plan, None, timeout=120)
    assert real.code == 0, real.tail
    broken = run_tests(plan, spec, timeout=120)
    assert broken.code == 1 and broken.failed.startswith(check), broken.tail


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
    from wd_chaos.mutate.runner import equivalents

    known = equivalents()
    ids = {
        m.id
        for store, targets in (
            ("sqlite", statement_targets("without_durability.sqlite")),
            ("postgres", statement_targets("without_durability_postgres")),
            ("redis", script_targets()),
        )
        for m in mutants(store, targets)
    }
    assert known and set(known) <= ids, f"equivalent.toml names no such mutant: {sorted(set(known) - ids)}"
