"""``wd-chaos show NAME``: a built-in scenario as TOML a user starts their own from."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from wd_chaos.cli import main
from wd_chaos.scenario import BUILT_IN, parse


def _wd_chaos(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # the console script as a user runs it, in a folder of their own
    exe = Path(sys.executable).with_name("wd-chaos")
    return subprocess.run(
        [str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )


def test_show_renamed_passes_run_check(tmp_path: Path) -> None:
    shown = _wd_chaos("show", "lease-stall", cwd=tmp_path)
    assert shown.returncode == 0, f"show: expected exit 0, got {shown.returncode}: {shown.stderr}"
    line = 'name = "lease-stall"'
    assert line in shown.stdout.splitlines(), f"show: expected a line {line!r} to rename"
    (tmp_path / "my.toml").write_text(shown.stdout.replace(line, 'name = "my"', 1))
    checked = _wd_chaos("run", "my.toml", "--check", cwd=tmp_path)
    assert checked.returncode == 0, (
        f"run my.toml --check: expected exit 0, got {checked.returncode}: {checked.stdout}{checked.stderr}"
    )
    assert "my on sqlite: would run" in checked.stdout, f"run --check printed {checked.stdout!r}"


def test_show_prints_every_built_in_scenario_as_valid_toml() -> None:
    for path in BUILT_IN.iterdir():
        if not path.name.endswith(".toml"):
            continue
        name = path.name.removesuffix(".toml")
        result = CliRunner().invoke(main, ["show", name], standalone_mode=False)
        assert result.exit_code == 0, f"show {name}: expected exit 0, got {result.exit_code}"
        assert parse(result.output, name).name == name, f"show {name}: its name key changed"


def test_show_unknown_name_is_a_usage_error_naming_the_known_ones() -> None:
    result = CliRunner().invoke(main, ["show", "no-such-scenario"])
    assert result.exit_code == 64, f"expected exit 64, got {result.exit_code}"
    assert "lease-stall" in result.output, f"expected the built-in names, got {result.output!r}"


def test_show_names_the_core_checkers() -> None:
    from wd_chaos.checks import CORE

    result = CliRunner().invoke(main, ["show", "append-storm"], standalone_mode=False)
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("# core checkers:") and all(name in last for name in CORE), last
    assert set(CORE) <= set(parse(result.output, "append-storm").checks)
