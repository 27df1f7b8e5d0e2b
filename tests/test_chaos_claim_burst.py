"""The claim-burst scenario's pieces: the ``claim-ahead-after-retention`` coverage window (reached
only by a claim after a quiet spell past the retention, measured from the history, while the
tokens were still ahead of the clock), ``tokens-unique`` saying no on a history shaped like the
bug it is there for, and the careless clients' round names."""

from __future__ import annotations

import typing
from typing import Any

from wd_chaos.checks.core import UNKNOWN
from wd_chaos.checks.coverage import coverage
from wd_chaos.checks.tokens_unique import tokens_unique
from wd_chaos.client.clients import DEFAULT_ROUNDS, ROUNDS
from wd_chaos.scenario import CarelessRound, find

WINDOW = "claim-ahead-after-retention"
WF = "careless-burst-1"
MS = 1_000_000  # monotonic nanoseconds


class History:
    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.n = 0

    def claim(self, proc: str, start_ms: float, end_ms: float, token: int, **inv: Any) -> None:
        self.n += 1
        op = f"{proc}:1:{self.n}"
        common = {"op": op, "f": "claim", "process": proc, "pid": 1}
        self.lines.append(
            {"type": "invoke", **common, "mono": int(start_ms * MS), "workflow": WF, "alive": 1e-6, **inv}
        )
        self.lines.append(
            {"type": "complete", **common, "mono": int(end_ms * MS), "outcome": "ok", "token": token}
        )

    def burst(self, proc: str, first: int, count: int, at_ms: float = 0.0) -> float:
        """``count`` claims a tenth of a millisecond apart, tokens ``first``, ``first + 1``, ...;
        returns when the last returned."""
        t = at_ms
        for i in range(count):
            self.claim(proc, t, t + 0.05, first + i)
            t += 0.1
        return t - 0.05


def after(h: History, at_ms: float, token: int, lead_ms: float, proc: str = "careless-0") -> None:
    h.claim(proc, at_ms, at_ms + 1, token, after_burst=True, lead_ms=lead_ms, retention_ms=1000.0)


def test_the_window_is_reached_by_a_claim_after_the_retention_with_tokens_still_ahead() -> None:
    h = History()
    last = h.burst("careless-0", 5_000, 3_000)
    after(h, last + 1_300, 8_000, lead_ms=700)
    v = coverage(h.lines, [WINDOW])
    assert v.valid is True and v.counts == {WINDOW: 1}, v


def test_the_window_is_not_reached_when_the_clock_caught_up_or_the_quiet_was_too_short() -> None:
    caught_up = History()
    last = caught_up.burst("careless-0", 5_000, 3_000)
    after(caught_up, last + 1_300, 8_000, lead_ms=-20)
    short = History()
    last = short.burst("careless-0", 5_000, 3_000)
    after(short, last + 900, 8_000, lead_ms=700)
    other = History()  # this process was quiet long enough, the other careless process was not
    last = other.burst("careless-0", 5_000, 3_000)
    other.claim("careless-1", last + 600, last + 601, 8_000)
    after(other, last + 1_300, 8_001, lead_ms=700)
    for h in (caught_up, short, other):
        v = coverage(h.lines, [WINDOW])
        assert v.valid == UNKNOWN and v.counts == {WINDOW: 0}, v


def test_tokens_unique_says_no_when_the_claim_after_the_retention_mints_a_burst_token_again() -> None:
    """The bug: the claim record expired while the burst's tokens (5,000..7,999) were ahead of the
    clock; the next claim minted the bare clock, 7,200, handed out during the burst."""
    h = History()
    last = h.burst("careless-0", 5_000, 3_000)
    after(h, last + 1_300, 7_200, lead_ms=700)
    v = tokens_unique(h.lines, {})
    assert (
        v.valid is False and "token 7200 of this workflow was handed out 2 times" in v.evidence[0]["why"]
    ), v
    fine = History()
    last = fine.burst("careless-0", 5_000, 3_000)
    after(fine, last + 1_300, 8_000, lead_ms=700)
    assert tokens_unique(fine.lines, {}).valid is True


def test_every_round_a_scenario_may_name_is_one_the_careless_client_runs() -> None:
    assert set(typing.get_args(CarelessRound)) == set(ROUNDS)
    assert set(DEFAULT_ROUNDS) == set(ROUNDS) - {"claim-burst", "plain-claims"}  # the opt-in rounds


def test_the_claim_burst_scenario_runs_only_the_burst_on_redis_and_declares_its_window() -> None:
    scenario = find("claim-burst")
    assert scenario.workload.careless_rounds == ["claim-burst"]
    assert scenario.coverage == [WINDOW] and "tokens-unique" in scenario.checks
    assert scenario.stores is not None and all(s.startswith("redis") for s in scenario.stores), (
        scenario.stores
    )
