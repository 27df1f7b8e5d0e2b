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
        "nothing-lost", "arrivals", "attempt-limit", "lifecycle-liveness", "tokens-rise",
        "lease-lapses", "cancel-sticks", "own-receipt", "answer-then-take", "misuse", "written-at",
        "stale-landing", "tokens-unique", "errors-classified", "cancelled-calls", "no-hung-pass",
        "half-open-gives-up", "stale-answer", "wakeup-stands", "queue-bounded", "pickup", "wakeup-pickup",
        "receipts-distinct",
    }  # fmt: skip
    assert {"stall-fenced", "kill-between", "partition-refused", "restart-survived", "storm"} <= set(
        registry.bites()
    )
    assert {"budget-fenced", "long-wait", "failover-promoted", "clock-step", "none"} <= set(registry.bites())
    network = {"latency-lapsed", "reset-unknown", "half-open-replaced", "slow-close-waited", "bandwidth-slowed"}
    assert network | {"slow-network"} <= set(registry.bites())


def test_a_new_checker_is_one_new_module(dropped_in: Path) -> None:
    text = 'name = "x"\nchecks = ["fencing", "toy-count"]'
    with pytest.raises(ScenarioError, match=r"checks\[1\]: expected one of .*'fencing'"):
        parse(text, "x.toml")  # not yet there: refused, naming what is
    (dropped_in / "toy.py").write_text(TOY)
    registry._found.cache_clear()
    assert parse(text, "x.toml").checks == ["fencing", "toy-count", *registry.CORE]
    two = [
        {"type": "invoke", "op": f"w:1:{n}", "f": "load", "process": "w", "pid": 1, "mono": n} for n in (1, 2)
    ]
    verdicts = wd_chaos.checks.check(two, {}, ["toy-count"], "none")
    assert [(v.name, v.valid, v.summary) for v in verdicts] == [
        ("toy-count", False, "2 operations"),
        ("bite: none", True, "this scenario injects no fault"),
    ]


def test_two_checkers_of_one_name_are_refused(dropped_in: Path) -> None:
    (dropped_in / "toy_twice.py").write_text(TOY.replace("toy-count", "fencing"))
    with pytest.raises(RuntimeError, match="two checks are named 'fencing'"):
        registry.checkers()


TOY_FAULT = """
from typing import Literal

from wd_chaos.checks.bitten import bit
from wd_chaos.checks.core import Verdict, bite_check
from wd_chaos.faults.base import EventSpec, FaultKind, FaultSpec


class ToyFault(FaultSpec):
    kind: Literal["toy"]
    loudness: int = 1


class ToyEvent(EventSpec):
    NEEDS = ("loudness",)
    fault: Literal["toy"]
    loudness: int | None = None


def plan(fault, scenario):
    return {"loudness": fault.loudness, "target": "store"}


def start(nemesis, ev, elapsed):
    nemesis._line(ev, "start")
    return True


@bite_check("toy-heard")
def heard(ops, final):
    hits = [o for o in ops if o.get("type") == "fault" and o.get("fault") == "toy"]
    return bit("toy-heard", hits, len(hits), "toy fault(s) heard")


TOY = FaultKind("toy", ToyFault, ToyEvent, plan, start, requires=lambda f: frozenset({"proxy"}))
"""

USE_TOY = """
import json, sys
from pathlib import Path
import wd_chaos.faults

wd_chaos.faults.__path__.append(sys.argv[1])  # as if toy.py were a file of the package
from wd_chaos import checks
from wd_chaos.faults import Nemesis
from wd_chaos.history import HistoryWriter, read_lines
from wd_chaos.scenario import parse, parse_schedule, plan

sc = parse('name = "x"\\nbite = "toy-heard"\\n[[faults]]\\nkind = "toy"\\nat = 1\\nloudness = 3', "x.toml")
events = plan(sc, 1, 2, 10.0)
assert parse_schedule(events, "replay") == events
run = Path(sys.argv[1]).parent / "run"
hist = HistoryWriter(run / "controller.jsonl", "controller")
nemesis = Nemesis(events, hist, run, pids=dict, busy=lambda _: set(), seed=1)
nemesis.tick(2.0)
nemesis.heal()
ops = list(read_lines(run / "controller.jsonl"))
print(json.dumps({"events": events, "requires": sorted(sc.requires()),
                  "bite": checks.check(ops, {}, [], "toy-heard")[0].valid}))
"""


def test_a_new_fault_kind_is_one_new_module(tmp_path: Path) -> None:
    """The toy kind's module is the only file: the scenario loader, ``plan``, the schedule replay,
    the nemesis and the bite registry all take it (run in a fresh process, since scenario models
    are built when ``wd_chaos.scenario`` is imported)."""
    import json
    import subprocess

    (tmp_path / "script.py").write_text(USE_TOY)
    kinds = tmp_path / "kinds"
    kinds.mkdir()
    refused = subprocess.run(
        [sys.executable, str(tmp_path / "script.py"), str(kinds)], capture_output=True, text=True
    )
    assert refused.returncode != 0 and "faults[0]: expected a 'kind' field" not in refused.stderr
    assert "kind = one of" in refused.stderr and "'clock-step'" in refused.stderr, refused.stderr
    (kinds / "toy.py").write_text(TOY_FAULT)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "script.py"), str(kinds)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["events"] == [{"fault": "toy", "index": 0, "at": 1.0, "target": "store", "loudness": 3}]
    assert got["requires"] == ["proxy", "workers"]
    assert got["bite"] is True


# where a kind's name may still appear outside its module, and why
NAMED_OUTSIDE = {
    ("kill", "client/testflow.py"): "the failpoints a kill arms run inside the worker processes",
    ("kill", "control/cluster.py"): "the supervisor logs the restart of a worker a failpoint killed",
    ("kill", "checks/at_least_once.py"): "a kill is one of the causes that explain a repeated effect",
    ("latency", "control/toxi.py"): "toxiproxy's own toxic, which a partition's latency mode adds as the latency kind does",
    ("clock-step", "checks/fault_reads.py"): "fencing and at-least-once read its steps; the reader sits below both floors",
    ("reboot", "checks/fault_reads.py"): "fencing reads whom a reboot killed; the reader sits below both floors",
}


def test_no_module_outside_a_kinds_own_names_it() -> None:
    from wd_chaos.faults import kinds

    src = Path(wd_chaos.checks.__file__).parents[1]
    found = set()
    for path in src.rglob("*.py"):
        rel = path.relative_to(src).as_posix()
        if rel.startswith("faults/"):
            continue
        text = path.read_text()
        found |= {(name, rel) for name in kinds() if f'"{name}"' in text or f"'{name}'" in text}
    assert found == set(NAMED_OUTSIDE), (
        "a fault kind is named outside its module: move that knowledge into it"
    )
