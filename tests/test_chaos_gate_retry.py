"""The chaos gate's retry (``chaos/test_chaos.py``'s ``_run_judged``) on made-up runs: an unknown
run is run again on another seed, at most ``RUNS`` runs in all; a real verdict ends it at once, and
runs that were all unknown fail the case naming each one and why."""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

GATE = Path(__file__).resolve().parents[1] / "chaos" / "test_chaos.py"


@pytest.fixture
def gate() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("chaos_gate_under_test", GATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():  # chaos/conftest.py registers the gate's "longest" mark
        warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
        spec.loader.exec_module(module)
    yield module


NOT_BITTEN = {
    "name": "bite: stall-fenced",
    "valid": "unknown",
    "summary": "not tested: the fault did not bite (2 injected, 0 stalled pass(es) refused on waking)",
    "counts": {"faults": 2, "bit": 0},
}
FENCING_HELD = {"name": "fencing", "valid": True, "summary": "3 stale write(s) refused", "counts": {}}
FENCING_BROKEN = {"name": "fencing", "valid": False, "summary": "1 stale write accepted", "counts": {}}


def _runs(gate: ModuleType, codes: list[int], monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """Make ``gate._run`` answer ``codes`` in turn (2: the stall did not bite; 1: fencing failed
    and the stall did not bite; 0: all valid); returns the extra arguments of each call."""
    calls: list[tuple[str, ...]] = []

    def fake(name: str, store: str, *extra: str, **_: Any) -> tuple[int, dict[str, Any], str]:
        calls.append(extra)
        code = codes[len(calls) - 1]
        verdicts = {
            0: [FENCING_HELD, {**NOT_BITTEN, "valid": True, "counts": {"bit": 1}}],
            1: [FENCING_BROKEN, NOT_BITTEN],
            2: [FENCING_HELD, NOT_BITTEN],
        }[code]
        seed = extra[extra.index("--seed") + 1] if "--seed" in extra else "1"
        summary = {"seed": int(seed), "verdicts": verdicts, "run_dir": f"reports/run-{len(calls)}"}
        return code, summary, f"output of run {len(calls)}"

    monkeypatch.setattr(gate, "_run", fake)
    return calls


def test_an_unknown_run_is_run_again_on_another_seed(
    gate: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _runs(gate, [2, 2, 0], monkeypatch)
    with pytest.warns(UserWarning, match="unknown, running it again on another seed") as warned:
        code, summary, _ = gate._run_judged("lease-stall", "sqlite", "--client", "worker")
    assert code == 0 and summary["run_dir"] == "reports/run-3"
    # the scenario's own seed (1) first, then another seed each retry
    assert calls == [
        ("--client", "worker"),
        ("--client", "worker", "--seed", "2"),
        ("--client", "worker", "--seed", "3"),
    ]
    assert len(warned) == 2 and "reports/run-1" in str(warned[0].message)


def test_a_real_verdict_ends_the_runs_at_once(gate: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _runs(gate, [1], monkeypatch)
    code, _, _ = gate._run_judged("lease-stall", "sqlite", "--mutant", "sqlite-record-without-fence")
    assert code == 1 and len(calls) == 1  # a real violation beside a non-bite is a verdict: not retried
    calls = _runs(gate, [2, 1], monkeypatch)
    with pytest.warns(UserWarning):
        code, _, _ = gate._run_judged("lease-stall", "sqlite", seed=7)
    assert code == 1 and calls == [("--seed", "7"), ("--seed", "8")]


def test_runs_that_are_all_unknown_fail_naming_each(
    gate: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _runs(gate, [2, 2, 2, 0], monkeypatch)
    with pytest.warns(UserWarning), pytest.raises(pytest.fail.Exception) as failed:
        gate._run_judged("lease-stall", "sqlite")
    assert len(calls) == gate.RUNS == 3
    text = str(failed.value)
    assert f"unknown in all {gate.RUNS} runs" in text
    for n, seed in ((1, 1), (2, 2), (3, 3)):
        assert f"reports/run-{n} (seed {seed}): bite: stall-fenced: not tested" in text, text
