"""The retry every chaos case takes (``wd_chaos.gate.run_judged``: the chaos gate's, and the pytest
plugin's ``--wd-chaos`` cases and ``wd_chaos_run``) on made-up runs: an unknown run is run again on
another seed, at most ``RUNS`` runs in all; a real verdict ends it at once, and runs that were all
unknown fail the case naming each one and why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from wd_chaos import gate
from wd_chaos.checks import Verdict
from wd_chaos.control.runner import Options, Outcome
from wd_chaos.control.toxi import ToxiproxyStuck
from wd_chaos.scenario import find

NOT_BITTEN = Verdict(
    "bite: stall-fenced",
    "unknown",
    "not tested: the fault did not bite (2 injected, 0 stalled pass(es) refused on waking)",
    counts={"faults": 2, "bit": 0},
)
BITTEN = Verdict("bite: stall-fenced", True, "2 stalled pass(es) refused on waking", counts={"bit": 2})
FENCING_HELD = Verdict("fencing", True, "3 stale write(s) refused")
FENCING_BROKEN = Verdict("fencing", False, "1 stale write accepted", [{"why": "superseded token wrote"}])


def _runs(codes: list[int], monkeypatch: pytest.MonkeyPatch) -> list[Options]:
    """Make the gate's runs answer ``codes`` in turn (2: the stall did not bite; 1: fencing failed
    and the stall did not bite; 0: all valid; 3: toxiproxy got stuck under it); returns the
    options of each run."""
    calls: list[Options] = []

    def fake(scenario: Any, opts: Options, progress: Any = None) -> Outcome:
        calls.append(opts)
        code = codes[len(calls) - 1]
        if code == 3:
            stuck = ToxiproxyStuck("toxiproxy did not answer 'add toxic bandwidth-4-1 to proxy p' within 15 s")
            stuck.run_dir = Path(f"reports/run-{len(calls)}")
            raise stuck
        verdicts, valid = {
            0: ([FENCING_HELD, BITTEN], True),
            1: ([FENCING_BROKEN, NOT_BITTEN], False),
            2: ([FENCING_HELD, NOT_BITTEN], "unknown"),
        }[code]
        seed = scenario.seed if opts.seed is None else opts.seed
        summary = {"scenario": scenario.name, "store": opts.store, "seed": seed, "time_limit": 8, "workers": 4}
        return Outcome(Path(f"reports/run-{len(calls)}"), verdicts, valid, summary)  # type: ignore[arg-type]

    monkeypatch.setattr(gate, "run", fake)
    monkeypatch.setattr(gate, "check_available", lambda store, **needs: None)
    return calls


def test_an_unknown_run_is_run_again_on_another_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _runs([2, 2, 0], monkeypatch)
    with pytest.warns(UserWarning, match="unknown, running it again on another seed") as warned:
        judged = gate.run_judged(find("lease-stall"), Options(store="sqlite", client="worker"))
    assert judged.outcome.valid is True and judged.outcome.run_dir == Path("reports/run-3")
    # the scenario's own seed first, then another seed each retry; the rest of the options kept
    assert [c.seed for c in calls] == [None, 2, 3] and {c.client for c in calls} == {"worker"}
    assert len(warned) == 2 and "reports/run-1" in str(warned[0].message)
    assert len(judged.misses) == 2 and "reports/run-2 (seed 2)" in judged.misses[1]


def test_a_run_toxiproxy_got_stuck_under_is_run_again_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault injector failing is no verdict on the store: the case runs again on another
    seed, and runs that all failed so name each folder and the cause."""
    calls = _runs([3, 0], monkeypatch)
    with pytest.warns(UserWarning, match="could not finish, running it again on another seed"):
        judged = gate.run_judged(find("slow-network"), Options(store="postgres"))
    assert judged.outcome.valid is True and [c.seed for c in calls] == [None, 2]
    assert judged.misses == [
        "reports/run-1 (seed 1): toxiproxy did not answer 'add toxic bandwidth-4-1 to proxy p' within 15 s"
    ]
    _runs([3, 3, 3], monkeypatch)
    with pytest.warns(UserWarning), pytest.raises(gate.AllUnknown, match="reports/run-3 \\(seed 3\\): toxiproxy"):
        gate.run_judged(find("slow-network"), Options(store="postgres"))


def test_a_real_verdict_ends_the_runs_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _runs([1], monkeypatch)
    judged = gate.run_judged(find("lease-stall"), Options(store="sqlite", mutant="sqlite-record-without-fence"))
    # a real violation beside a non-bite is a verdict: not retried
    assert judged.outcome.valid is False and len(calls) == 1
    calls = _runs([2, 1], monkeypatch)
    with pytest.warns(UserWarning):
        judged = gate.run_judged(find("lease-stall"), Options(store="sqlite", seed=7))
    assert judged.outcome.valid is False and [c.seed for c in calls] == [7, 8]
    failure = gate.unexpected(judged)
    assert failure is not None and "INVALID, expected VALID" in failure, failure
    assert '"why": "superseded token wrote"' in failure, failure  # the evidence, as JSON
    assert "reproduce: wd-chaos run lease-stall --store sqlite --seed 8" in failure, failure


def test_runs_that_are_all_unknown_fail_naming_each(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _runs([2, 2, 2, 0], monkeypatch)
    with pytest.warns(UserWarning), pytest.raises(gate.AllUnknown) as failed:
        gate.run_judged(find("lease-stall"), Options(store="sqlite"))
    assert len(calls) == gate.RUNS == 3
    text = str(failed.value)
    assert f"unknown in all {gate.RUNS} runs" in text
    for n, seed in ((1, 1), (2, 2), (3, 3)):
        assert f"reports/run-{n} (seed {seed}): bite: stall-fenced: not tested" in text, text


def test_all_selects_what_wd_chaos_run_all_runs_and_a_named_scenario_skips_where_it_does_not_apply() -> None:
    cases = gate.select(["all"], ["sqlite", "postgres"])
    assert gate.Case("lease-stall", "sqlite") in cases and gate.Case("transact-stall", "postgres") in cases
    assert not [c for c in cases if c.scenario == "failover-async"]  # loses writes by design: by name only
    assert not [c for c in cases if c.skip]
    named = gate.select(["transact-stall"], ["sqlite", "postgres"])
    assert [c.store for c in named] == ["sqlite", "postgres"]
    assert named[0].skip and "transact-stall" in named[0].skip and named[1].skip is None
    with pytest.raises(gate.SelectionError, match="did you mean 'sqlite'"):
        gate.select(["lease-stall"], ["sqlitee"])
