"""The docs page's scenario table reads as ``check_verdict.py`` (CI's step) reads it: a row per
scenario, the verdict and the checkers that said no, and the time limit every run had."""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("check_verdict", Path(__file__).parents[1] / "check_verdict.py")
assert spec is not None and spec.loader is not None
check_verdict = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_verdict)


def test_the_page_publishes_the_ci_scenario_and_the_runs_it_reports() -> None:
    assert check_verdict.published("take-storm") == (
        1,
        "INVALID",
        {"take-exclusive", "own-receipt", "stale-answer"},
        8.0,
    )
    assert check_verdict.published("slow-network")[1:3] == ("INVALID", {"liveness", "stale-answer"})
    assert check_verdict.published("lease-stall")[1:3] == ("VALID", set())
