"""Checkers are found, not listed: a module dropped into ``wd_chaos.checks`` is a checker the
scenario loader accepts and a run judges by, with no other file touched."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import wd_chaos.checks
from wd_chaos.checks import registry
from wd_chaos.scenario import ScenarioError, parse

TOY = """
from wd_chaos.checks.core import Verdict, checker, operations


@checker("toy-count")
def toy(ops, final):
    return Verdict("toy-count", len(operations(ops)) < 2, f"{len(operations(ops))} operations")
"""


@pytest.fixture
def dropped_in(tmp_path: Path) -> Iterator[Path]:
    """A folder on ``wd_chaos.checks``'s path, as if its modules were files of the package."""
    wd_chaos.checks.__path__.append(str(tmp_path))
    registry._found.cache_clear()
    try:
        yield tmp_path
    finally:
        wd_chaos.checks.__path__.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.startswith("wd_chaos.checks.toy")]:
            del sys.modules[name]
        registry._found.cache_clear()


def test_the_built_in_checkers_are_all_found() -> None:
    assert set(registry.checkers()) == {
        "fencing", "first-writer-wins", "order", "exactly-once", "at-least-once", "liveness",
        "take-exclusive", "monotonic-loads", "durability", "ledger-once", "no-rerun",
        "nothing-lost", "arrivals", "attempt-limit", "lifecycle-liveness",
    }  # fmt: skip
    assert {"stall-fenced", "kill-between", "partition-refused", "restart-survived", "storm"} <= set(
        registry.bites()
    )
    assert {"budget-fenced", "long-wait", "failover-promoted", "clock-step", "none"} <= set(registry.bites())


def test_a_new_checker_is_one_new_module(dropped_in: Path) -> None:
    text = 'name = "x"\nchecks = ["fencing", "toy-count"]'
    with pytest.raises(ScenarioError, match=r"checks\[1\]: expected one of .*'fencing'"):
        parse(text, "x.toml")  # not yet there: refused, naming what is
    (dropped_in / "toy.py").write_text(TOY)
    registry._found.cache_clear()
    assert parse(text, "x.toml").checks == ["fencing", "toy-count"]
    two = [
        {"type": "invoke", "op": f"w:1:{n}", "f": "load", "process": "w", "pid": 1, "mono": n} for n in (1, 2)
    ]
    verdicts = registry.check(two, {}, ["toy-count"], "none")
    assert [(v.name, v.valid, v.summary) for v in verdicts] == [
        ("toy-count", False, "2 operations"),
        ("bite: none", True, "this scenario injects no fault"),
    ]


def test_two_checkers_of_one_name_are_refused(dropped_in: Path) -> None:
    (dropped_in / "toy_twice.py").write_text(TOY.replace("toy-count", "fencing"))
    with pytest.raises(RuntimeError, match="two checks are named 'fencing'"):
        registry.checkers()
