"""wd-chaos mutate --python: cosmic-ray mutates a toy store's decision module in a copy of its
project, runs the toy's test against each mutant, and the report names a killed mutant and the
survivor the test misses (the boundary it never checks), while the real tree stays untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("cosmic_ray", reason="wd-chaos mutate --python needs cosmic-ray (the dev extra)")

# two decisions, one mutant each (cosmic-ray drops the `not`), so the test stays short: the test
# asks `expired` and never `idle`, so the first mutant must die and the second survive
DECIDE = "def expired(fresh):\n    return not fresh\n\n\ndef idle(busy):\n    return not busy\n"
TEST = "from toyclaims import expired\n\n\ndef test_expired():\n    assert expired(False)\n"


def test_python_mutants_of_a_toy_store_are_killed_and_survive_where_its_test_is_blind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from wd_chaos.cli import main
    from without_durability.testing import MutatePlan, StoreKit
    from without_durability.testing import kit as kit_module

    project = tmp_path / "toy"
    (project / "src").mkdir(parents=True)
    (project / "tests").mkdir()
    (project / "src" / "toyclaims.py").write_text(DECIDE)
    (project / "tests" / "test_toy.py").write_text(TEST)
    (project / "reports").mkdir()

    class ToyKit(StoreKit):
        name = "toy"
        mutate_plan = MutatePlan(
            tests=("tests/test_toy.py",), stores=("memory",), python=("src/toyclaims.py",)
        )

    monkeypatch.setattr(kit_module, "_KITS", {**kit_module.kits(), "toy": ToyKit()})
    monkeypatch.chdir(project)
    result = CliRunner().invoke(main, ["mutate", "--store", "toy", "--python", "--budget-minutes", "1"])
    assert result.exit_code == 1, result.output  # a survivor: not a clean bill
    (job,) = (project / "reports").iterdir()
    found = json.loads((job / "mutate.json").read_text())["python"]
    assert found["tool"] == "cosmic-ray"
    assert (found["generated"], found["killed"], found["not_run"], found["errors"]) == (2, 1, 0, 0), found
    survivors = {(s["module"], s["line"]) for s in found["survived"]}
    assert survivors == {("src/toyclaims.py", 6)}, found["survived"]
    assert "+    return  busy" in found["survived"][0]["diff"], found["survived"]
    assert "Python decision code (cosmic-ray)" in (job / "mutate.html").read_text()
    assert (project / "src" / "toyclaims.py").read_text() == DECIDE, "the real tree was changed"


def test_python_mutation_refuses_a_file_outside_src_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wd_chaos.mutate.python import PythonMutateError, mutate_python

    (tmp_path / "flat.py").write_text(DECIDE)
    with pytest.raises(PythonMutateError, match="under the project's src/"):
        mutate_python(("flat.py",), ("tests/test_toy.py",), ("memory",), budget_seconds=30, project=tmp_path)
