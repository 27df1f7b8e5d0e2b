"""Scenarios ship inside the package and users bring their own: ``wd-chaos run path/to/my.toml``
and ``--scenario-dir DIR``, each refused with one line naming the file when it is missing, not
TOML, or named like another scenario."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

import wd_chaos
from wd_chaos.cli import CRASHED, USAGE, main
from wd_chaos.scenario import BUILT_IN, ScenarioError, available, find

ROOT = Path(__file__).resolve().parents[1]
MINE = 'name = "mine"\ndescription = "a user scenario"\nstores = ["sqlite"]\ntime_limit = 5\n'


def _mine(folder: Path, name: str = "mine") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(MINE.replace('"mine"', f'"{name}"'))
    return path


def test_the_built_in_scenarios_are_the_package_s_own_files() -> None:
    folder = Path(wd_chaos.__file__).parent / "scenarios"
    assert Path(str(BUILT_IN)).resolve() == folder.resolve()
    shipped = sorted(p.stem for p in folder.glob("*.toml"))
    assert shipped and "lease-stall" in shipped
    assert sorted(available()) == shipped


def test_no_scenario_is_left_in_the_old_top_level_folder() -> None:
    # a file there would be silently ignored: nothing reads that folder any more
    stray = sorted(p.name for p in (ROOT / "scenarios").glob("*.toml"))
    assert not stray, f"move {stray} to src/wd_chaos/scenarios/ (git mv): only the package's are read"


def test_a_user_file_is_run_by_path(tmp_path: Path) -> None:
    path = _mine(tmp_path)
    assert find(str(path)).name == "mine"
    result = CliRunner().invoke(main, ["run", str(path), "--check", "--report-dir", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "mine on sqlite: would run" in result.output


def test_a_scenario_dir_adds_its_scenarios_to_list_and_run(tmp_path: Path) -> None:
    _mine(tmp_path / "mine")
    listed = CliRunner().invoke(main, ["list", "--scenario-dir", str(tmp_path / "mine")], env={"COLUMNS": "240"})
    assert listed.exit_code == 0, listed.output
    assert "a user scenario" in listed.output and "lease-stall" in listed.output
    args = ["run", "mine", "--check", "--report-dir", str(tmp_path / "r")]
    assert CliRunner().invoke(main, args).exit_code == USAGE  # not found without the folder
    ran = CliRunner().invoke(main, [*args, "--scenario-dir", str(tmp_path / "mine")])
    assert ran.exit_code == 0, ran.output


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", r"nope\.toml: no such scenario file"),
        ("bad-toml", r"broken\.toml: not valid TOML"),
        ("clash-path", r"lease-stall\.toml: scenario name 'lease-stall' is already a built-in scenario"),
        ("clash-dir", r"lease-stall\.toml: scenario name 'lease-stall' is already a built-in scenario"),
        ("clash-two-dirs", r"b/mine\.toml: scenario name 'mine' is already the scenario in .*a/mine\.toml"),
        ("no-dir", r"--scenario-dir .*absent: no such directory"),
    ],
)
def test_a_bad_user_scenario_exits_255_with_one_line_naming_it(
    tmp_path: Path, case: str, expected: str
) -> None:
    args = ["run", "--check", "--report-dir", str(tmp_path / "r")]
    if case == "missing":
        args += [str(tmp_path / "nope.toml")]
    elif case == "bad-toml":
        (tmp_path / "broken.toml").write_text("name = ")
        args += [str(tmp_path / "broken.toml")]
    elif case == "bad-field":
        (tmp_path / "odd.toml").write_text('name = "odd"\ntime_limt = 3\n')
        args += [str(tmp_path / "odd.toml")]
    elif case == "clash-path":
        args += [str(_mine(tmp_path, "lease-stall"))]
    elif case == "clash-dir":
        _mine(tmp_path / "d", "lease-stall")
        args += ["lease-stall", "--scenario-dir", str(tmp_path / "d")]
    elif case == "clash-two-dirs":
        _mine(tmp_path / "a")
        _mine(tmp_path / "b")
        args += ["mine", "--scenario-dir", str(tmp_path / "a"), "--scenario-dir", str(tmp_path / "b")]
    elif case == "no-dir":
        args += ["lease-stall", "--scenario-dir", str(tmp_path / "absent")]
    else:
        args += ["nosuch"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == CRASHED, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("wd-chaos: error: ")]
    assert len(errors) == 1, result.output
    assert "Traceback" not in result.output
    import re

    assert re.search(expected, errors[0]), errors[0]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("bad-field", r"odd\.toml: time_limt: no such key; did you mean 'time_limit'\?"),
        ("unknown-name", r"no scenario 'nosuch'; available: .*lease-stall"),
    ],
)
def test_an_unknown_name_or_key_is_a_usage_error(tmp_path: Path, case: str, expected: str) -> None:
    """Nothing started and nothing is broken: the user typed a name that is not there (exit 64)."""
    args = ["run", "--check", "--report-dir", str(tmp_path / "r")]
    if case == "bad-field":
        (tmp_path / "odd.toml").write_text('name = "odd"\ntime_limt = 3\n')
        args += [str(tmp_path / "odd.toml")]
    else:
        args += ["nosuch"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == USAGE, result.output
    import re

    assert re.search(expected, result.output), result.output


def test_the_library_call_raises_scenario_error_for_a_clash(tmp_path: Path) -> None:
    _mine(tmp_path, "partition")
    with pytest.raises(ScenarioError, match="already a built-in scenario"):
        available([tmp_path])


def test_a_shrink_replays_a_user_scenario_from_the_run_s_own_copy(tmp_path: Path) -> None:
    from wd_chaos.shrink import replay_command

    copy = tmp_path / "shrink" / "scenario.json"
    copy.parent.mkdir()
    copy.write_text(find(str(_mine(tmp_path / "mine"))).model_dump_json(indent=2))
    schedule = tmp_path / "schedule.json"
    schedule.write_text("[]")
    meta = {"scenario": "mine", "store": "sqlite", "seed": 3, "workers": 2}
    command = replay_command(meta, schedule, 5.0, copy)
    assert command.startswith(f"wd-chaos run {copy} --store sqlite"), command
    assert replay_command(meta, schedule, 5.0).startswith("wd-chaos run mine --store sqlite")
    args = [*shlex.split(command)[1:], "--check", "--report-dir", str(tmp_path / "r")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "mine on sqlite: would run" in result.output


def test_a_json_that_is_not_a_run_s_scenario_is_refused(tmp_path: Path) -> None:
    (tmp_path / "scenario.json").write_text('{"name": "x", "lease": {"alive": -1}}')
    with pytest.raises(ScenarioError, match=r"scenario\.json: not a run's scenario\.json: lease\.alive"):
        find(str(tmp_path / "scenario.json"))
