"""wd-chaos mutate --python: cosmic-ray mutates a toy store's decision module in a copy of its
project, runs the toy's test against each mutant, and the report names a killed mutant and the
survivor the test misses (the boundary it never checks), skips by count the mutants that cannot
change behaviour (annotations, a docstring, a keyword-only ``*`` made into a binary operator), and
a resumed job keeps the kill under the same id after an unrelated edit; the real tree stays
untouched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cosmic_ray", reason="wd-chaos mutate --python needs cosmic-ray (the dev extra)")

# two decisions, one behavioural mutant each (cosmic-ray drops the `not`), so the test stays short:
# the test asks `expired` and never `idle`, so the first mutant must die and the second survive;
# the annotations, the docstring and the bare `*` yield mutants that must be skipped, not run
DECIDE = (
    "def expired(fresh: bool | None, *, now: int) -> bool | None:\n"
    '    """True when not fresh."""\n'
    "    return not fresh\n\n\n"
    "def idle(busy):\n"
    "    return not busy\n"
)
TEST = "from toyclaims import expired\n\n\ndef test_expired():\n    assert expired(False, now=1)\n"


def _toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from without_durability.testing import MutatePlan, StoreKit
    from without_durability.testing import kit as kit_module

    project = tmp_path / "toy"
    (project / "src").mkdir(parents=True)
    (project / "tests").mkdir()
    (project / "src" / "toyclaims.py").write_text(DECIDE)
    (project / "tests" / "test_toy.py").write_text(TEST)

    class ToyKit(StoreKit):
        name = "toy"
        mutate_plan = MutatePlan(
            tests=("tests/test_toy.py",), stores=("memory",), python=("src/toyclaims.py",)
        )

    monkeypatch.setattr(kit_module, "_KITS", {**kit_module.kits(), "toy": ToyKit()})
    monkeypatch.chdir(project)
    return project


def _job(project: Path, report_dir: str, *args: str) -> tuple[Path, dict[str, Any], str]:
    from click.testing import CliRunner

    from wd_chaos.cli import main

    (project / report_dir).mkdir()
    result = CliRunner().invoke(
        main,
        ["mutate", "--store", "toy", "--python", "--budget-minutes", "2", "--report-dir", report_dir, *args],
    )
    assert result.exit_code == 1, result.output  # a survivor: not a clean bill
    (job,) = (project / report_dir).iterdir()
    return job, json.loads((job / "mutate.json").read_text())["python"], result.output


def test_python_mutants_of_a_toy_store_are_killed_and_survive_where_its_test_is_blind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = _toy(tmp_path, monkeypatch)
    job, found, output = _job(project, "first")
    assert found["tool"] == "cosmic-ray"
    assert (found["killed"], found["not_run"], found["errors"], found["equivalent"]) == (1, [], [], []), found
    # the annotations' `|` swaps and the bare `*` made an operator are counted, never run
    assert found["skipped"]["annotation"] >= 2 and found["skipped"]["does not compile"] >= 1, found["skipped"]
    # `*` made `/` compiles (a positional-only marker: `now` may then be passed by position), and
    # the test never passes it so: a survivor too
    assert found["generated"] == 3 + sum(found["skipped"].values())
    assert "skipped (" in output and "annotation" in output
    ran = [m for m in found["mutants"] if m["verdict"] not in ("skipped",)]
    assert {(m["line"], m["verdict"]) for m in ran} == {(1, "survived"), (3, "killed"), (7, "survived")}, ran
    (survivor,) = (m for m in found["survived"] if m["line"] == 7)
    assert survivor["module"] == "src/toyclaims.py" and survivor["definition"] == "idle"
    assert "+    return  busy" in survivor["diff"], survivor
    assert survivor["mutant"].startswith("toy:py:toyclaims:idle:ReplaceUnaryOperator_Delete_Not:")
    (killed,) = (m for m in found["mutants"] if m["verdict"] == "killed")
    assert killed["killed_by"] == "tests/test_toy.py::test_expired"
    assert "Python decision code (cosmic-ray)" in (job / "mutate.html").read_text()
    assert (project / "src" / "toyclaims.py").read_text() == DECIDE, "the real tree was changed"

    # an unrelated edit above both functions moves every line; the ids hold, so a resumed job keeps
    # the kill without running it, runs the survivor again, and an equivalent entry is honoured
    (project / "src" / "toyclaims.py").write_text("# a comment\n\n" + DECIDE)
    listed = tmp_path / "equivalent.toml"
    listed.write_text(
        "[equivalent]\n" + "".join(f'"{m["mutant"]}" = "the toy never asks"\n' for m in found["survived"])
    )
    _, again, _ = _clean_job(project, "--resume", str(job / "mutate.json"), "--equivalent", str(listed))
    rows = {m["mutant"]: m for m in again["mutants"]}
    assert rows[killed["mutant"]]["verdict"] == "killed" and rows[killed["mutant"]]["seconds"] == 0
    assert rows[killed["mutant"]]["why"].startswith("killed in "), rows[killed["mutant"]]
    assert sorted(e["mutant"] for e in again["equivalent"]) == sorted(m["mutant"] for m in found["survived"])
    assert (again["survived"], again["not_run"]) == ([], [])


def _clean_job(project: Path, *args: str) -> tuple[Path, dict[str, Any], str]:
    """A second job that should end clean: every mutant killed, equivalent or skipped."""
    from click.testing import CliRunner

    from wd_chaos.cli import main

    (project / "second").mkdir()
    result = CliRunner().invoke(
        main,
        ["mutate", "--store", "toy", "--python", "--budget-minutes", "2", "--report-dir", "second", *args],
    )
    assert result.exit_code == 0, result.output
    (job,) = (project / "second").iterdir()
    return job, json.loads((job / "mutate.json").read_text())["python"], result.output


def test_python_mutation_refuses_a_file_outside_src_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wd_chaos.mutate.python import PythonMutateError, mutate_python

    (tmp_path / "flat.py").write_text(DECIDE)
    with pytest.raises(PythonMutateError, match="under the project's src/"):
        mutate_python(("flat.py",), ("tests/test_toy.py",), ("memory",), budget_seconds=30, project=tmp_path)


def test_inert_positions_are_annotations_and_docstrings_not_code() -> None:
    from wd_chaos.mutate.inert import Module, compiles

    module = Module(
        'def f(a: "int | None", *, b: int | None = 1 | 2) -> int | None:\n'
        '    """doc | string"""\n'
        "    x: int | None = a or 1 | 2\n"
        "    return x\n"
    )
    assert module.inert_kind((1, 14), (1, 15)) == "annotation"  # inside the string annotation
    assert module.inert_kind((1, 33), (1, 34)) == "annotation"  # b's annotation
    assert module.inert_kind((1, 44), (1, 45)) is None  # b's default is code
    assert module.inert_kind((1, 56), (1, 57)) == "annotation"  # the return annotation
    assert module.inert_kind((2, 4), (2, 22)) == "docstring"
    assert module.inert_kind((3, 11), (3, 12)) == "annotation"
    assert module.inert_kind((3, 27), (3, 28)) is None  # the value assigned is code
    assert module.definition((3, 4)) == "f" and module.definition((1, 0)) == "f"
    assert compiles("def f(a, *, b): pass\n") and not compiles("def f(a, <<, b): pass\n")


def test_a_failing_test_id_is_read_whole_spaces_included() -> None:
    from wd_chaos.mutation.session import FAILED as _FAILED

    tail = (
        "FAILED tests/test_sqlite.py::test_ends[sqlite-rollback, return] - AssertionError: a - b\n"
        "ERROR tests/test_x.py - ImportError: boom\n"
        "FAILED tests/test_a.py::test_b\n"
        "ERROR    without_durability.worker:worker.py:363 worker: workflow 'w' failed (attempt 1)\n"
    )
    # a cut id names no test: the confirming session would fail on it and take back every kill;
    # a captured ERROR log record (padded) is no test either: it once stood as a mutant's killer
    assert _FAILED.findall(tail) == [
        "tests/test_sqlite.py::test_ends[sqlite-rollback, return]",
        "tests/test_x.py",
        "tests/test_a.py::test_b",
    ]


def test_the_runtime_plan_names_files_and_tests_that_exist_and_its_equivalents_load() -> None:
    """``wd-chaos mutate --runtime``: the files it mutates and the tests it runs are the project's,
    and its shipped equivalents are the runtime's own, each with its reason."""
    from wd_chaos.mutate.runner import equivalents, plan_equivalents, runtime_plan

    RUNTIME = runtime_plan()
    assert {"memory", "sqlite"} <= set(RUNTIME.wd_stores), RUNTIME.wd_stores

    root = Path(__file__).resolve().parents[1]
    assert all((root / f).is_file() for f in (*RUNTIME.python, *RUNTIME.tests)), RUNTIME
    listed = equivalents(plan_equivalents(RUNTIME))
    assert listed and all(k.startswith("runtime:py:without_durability.") for k in listed), listed


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--runtime", "--store", "sqlite"], "drop --store"),
        ([], "--store"),
    ],
)
def test_runtime_and_store_are_one_or_the_other(args: list[str], says: str) -> None:
    from click.testing import CliRunner

    from wd_chaos.cli import main

    done = CliRunner().invoke(main, ["mutate", *args])
    assert done.exit_code == 64 and says in done.output, done.output  # a usage error


def test_a_mutant_that_breaks_loading_the_package_is_killed_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module-level type alias whose ``|`` becomes ``+`` fails at import; the tests' conftest
    imports the package, so pytest ends with exit 4 ("while loading conftest"): a kill (the same
    tests load on the real code), as the runtime's ``Outcome = Finished | Sleeping | Blocked``
    mutants are, never an error that keeps the job from a clean bill."""
    project = _toy(tmp_path, monkeypatch)
    (project / "src" / "toyclaims.py").write_text("Flag = bool | None\n\n\n" + DECIDE.replace("def idle(busy):", "def idle(busy: Flag):"))
    (project / "tests" / "conftest.py").write_text("import toyclaims  # noqa: F401\n")
    _, found, _ = _job(project, "first")
    broken = [m for m in found["mutants"] if m["line"] == 1 and m["verdict"] != "skipped"]
    assert broken and all(m["verdict"] == "killed" for m in broken), broken
    assert {m["killed_by"] for m in broken} == {"import: the package fails to load"}, broken
    assert found["errors"] == [], found["errors"]
