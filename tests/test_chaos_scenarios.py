"""Scenario files: every shipped one validates; a bad one is refused naming file, field and the
expected form; the seed fixes the fault schedule."""

from __future__ import annotations

from pathlib import Path

import pytest

from wd_chaos.scenario import ScenarioError, UnknownName, available, load_file, parse, plan


def test_every_shipped_scenario_validates() -> None:
    names = available()
    assert "lease-stall" in names
    for path in names.values():
        load_file(path)


@pytest.mark.parametrize(
    ("text", "field", "expected"),
    [
        ('name = "x"\ntime_limit = "soon"', "time_limit", "a number"),
        ('name = "x"\n[lease]\nalive = -1', "lease.alive", "greater than 0"),
        ('name = "x"\nstores = ["oracle"]', "stores", "no store kit 'oracle'; installed: memory,"),
        ('name = "x"\n[[faults]]\nkind = "flood"\nat = 1', "faults[0]", "kind = one of"),
        ('name = "x"\n[[faults]]\nkind = "stall"\nat = 1', "faults[0]", "exactly one of"),
        ('name = "x"\n[[faults]]\nkind = "kill"\nat = 1\nfailpoint = "nowhere"',
         "faults[0].failpoint", "after-effect-before-record"),
        ("description = 1", "name", "this field is required"),
    ],
)
def test_a_bad_scenario_names_file_field_and_form(text: str, field: str, expected: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse(text, "scenarios/x.toml")
    message = str(caught.value)
    assert message.startswith("scenarios/x.toml: "), message
    assert f": {field}: expected " in message, message
    assert expected in message, message


def test_a_misspelt_key_is_an_unknown_name_with_a_suggestion() -> None:
    # a usage error (wd-chaos exits 64), not a broken file: the message names the key and the
    # key it was probably meant to be
    with pytest.raises(UnknownName) as caught:
        parse('name = "x"\ntime_limt = 3', "scenarios/x.toml")
    assert str(caught.value).startswith("scenarios/x.toml: time_limt: no such key; did you mean 'time_limit'?")


def test_bad_toml_is_refused_with_the_file() -> None:
    with pytest.raises(ScenarioError, match=r"^scenarios/x.toml: not valid TOML"):
        parse("name = ", "scenarios/x.toml")


def test_the_name_must_match_the_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('name = "other"')
    with pytest.raises(ScenarioError, match="name: expected 'mine'"):
        load_file(path)


def test_the_seed_fixes_the_schedule() -> None:
    sc = load_file(available()["lease-stall"])
    assert plan(sc, 7, 4, 60.0) == plan(sc, 7, 4, 60.0)
    assert plan(sc, 7, 4, 60.0) != plan(sc, 8, 4, 60.0)
    events = plan(sc, 7, 4, 60.0)
    assert events and all(0 <= float(str(e["at"])) < 60.0 for e in events)
    stall = next(e for e in events if e.get("over") == "alive")
    assert float(str(stall["duration"])) > sc.lease.alive
    assert any(float(str(e.get("duration", 0))) > sc.lease.budget for e in events)
