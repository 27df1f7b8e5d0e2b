"""The clock-step fault's checks on hand-made histories: a lease breach the nemesis's own step
accounts for is the step's doing (fencing stays valid), the same breach with no step, or on a
store whose leases must not follow the wall clock, is a violation; the bite demands a live pass
lapsed and then refused; repeats of a lapsed pass are the step's."""

from __future__ import annotations

from typing import Any

from test_chaos_checkers import WF, H, final
from wd_chaos import checks
from wd_chaos.checks.at_least_once import at_least_once
from wd_chaos.checks.fencing import fencing

SERVER = {"store_clock": "local", "lease_clock": "wall"}
SQLITE = {"store_clock": "local", "lease_clock": "monotonic"}


def _step(h: H, seconds: float) -> None:
    """The nemesis's line: the control file changed between ``before_mono`` and ``mono``."""
    before = h.t + 1
    h.event("fault", "controller", 9, fault="clock-step", phase="start", seconds=seconds, before_mono=before)


def _lapse(h: H, *, step: float | None, next_outcome: str = "fenced") -> None:
    """A claims and renews; the store's clock may step ahead; 0.3 s later (inside A's 1 s window)
    B claims; A then writes once more."""
    h.call("claim", "A", 1, workflow=WF, alive=1.0, budget=4.0, res={"token": 1})
    h.call("renew", "A", 1, workflow=WF, token=1)
    if step is not None:
        _step(h, step)
    h.t += 300_000_000
    h.call("claim", "B", 2, workflow=WF, alive=1.0, budget=4.0, res={"token": 2})
    res: dict[str, Any] = {"value": 1, "won": True} if next_outcome == "ok" else {}
    h.call("record", "A", 1, next_outcome, workflow=WF, token=1, key="k", value=1, res=res)


def test_fencing_lays_a_breach_inside_an_injected_forward_step_on_the_step() -> None:
    h = H()
    _lapse(h, step=6.0)
    v = fencing(h.lines, {**final([]), **SERVER})
    assert v.valid is True, v
    assert v.counts["lease breaches caused by an injected clock step"] == 1, v.counts
    assert "lapsed early by an injected clock step" in v.summary, v.summary


def test_fencing_still_refuses_the_breach_without_a_step_or_on_a_monotonic_lease_store() -> None:
    h = H()
    _lapse(h, step=None)
    assert fencing(h.lines, {**final([]), **SERVER}).valid is False
    h2 = H()
    _lapse(h2, step=6.0)  # SQLite keeps leases on the monotonic clock: a step must not lapse one
    v = fencing(h2.lines, {**final([]), **SQLITE})
    assert v.valid is False, v
    assert "while token 1 was alive" in v.evidence[0]["why"], v.evidence
    h3 = H()
    _lapse(h3, step=-6.0)  # a step back cannot lapse a lease early
    assert fencing(h3.lines, {**final([]), **SERVER}).valid is False


def _renewed_after_the_step(h: H, step: float) -> None:
    """A claims; the store's clock steps ahead; 0.8 s later A's record lands and renews in the
    stepped frame; 0.3 s later (after A's claim's own window) B claims. The step ran A's budget
    (fixed at its claim) out, not the renewal's window."""
    h.call("claim", "A", 1, workflow=WF, alive=1.0, budget=4.0, res={"token": 1})
    _step(h, step)
    h.t += 800_000_000
    h.call("record", "A", 1, workflow=WF, token=1, key="k", value=1, res={"value": 1, "won": True})
    h.t += 300_000_000
    h.call("claim", "B", 2, workflow=WF, alive=1.0, budget=4.0, res={"token": 2})


def test_fencing_lays_a_breach_on_a_step_that_ran_the_budget_out_before_the_renewal() -> None:
    h = H()
    _renewed_after_the_step(h, 6.0)
    v = fencing(h.lines, {**final([]), **SERVER})
    assert v.valid is True, v
    assert v.counts["lease breaches caused by an injected clock step"] == 1, v.counts
    h2 = H()
    _renewed_after_the_step(h2, 1.0)  # too small to have run a 4 s budget out by B's claim (2.9 s)
    assert fencing(h2.lines, {**final([]), **SERVER}).valid is False


def test_the_bite_demands_a_lapsed_pass_refused_on_its_next_write() -> None:
    bite = checks.bite("clock-step")
    h = H()
    _lapse(h, step=6.0)
    v = bite(h.lines, {**final([]), **SERVER})
    assert v.valid is True, v
    assert v.counts["bit"] == 1 and "refused" in v.summary, v
    assert [e["f"] for e in v.evidence] == ["renew", "claim", "record"], v.evidence
    for step, outcome in ((None, "fenced"), (-6.0, "fenced"), (6.0, "ok")):
        h2 = H()
        _lapse(h2, step=step, next_outcome=outcome)
        v2 = bite(h2.lines, {**final([("k", 1)] if outcome == "ok" else []), **SERVER})
        assert v2.valid == checks.UNKNOWN and "not tested" in v2.summary, (step, outcome, v2)


def test_at_least_once_lays_a_lapsed_pass_repeat_on_the_step() -> None:
    h = H()
    h.call("claim", "A", 1, workflow=WF, alive=1.0, budget=4.0, res={"token": 1})
    h.call("renew", "A", 1, workflow=WF, token=1)
    h.event("effect", "A", 1, workflow=WF, key="s", token=1, nonce="a")
    _step(h, 6.0)
    h.t += 300_000_000
    h.call("claim", "B", 2, workflow=WF, alive=1.0, budget=4.0, res={"token": 2})
    h.event("effect", "B", 2, workflow=WF, key="s", token=2, nonce="b")
    h.call("record", "B", 2, workflow=WF, token=2, key="s", value={"nonce": "b"}, res={"won": True})
    h.call("record", "A", 1, "fenced", workflow=WF, token=1, key="s", value={"nonce": "a"})
    v = at_least_once(h.lines, {**final([("s", {"nonce": "b"})]), **SERVER})
    assert v.valid is True, v
    assert v.counts.get("repeat: clock step") == 1, v.counts
    # on a store whose leases do not follow the stepped clock the same repeat is a plain fence
    v2 = at_least_once(h.lines, {**final([("s", {"nonce": "b"})]), **SQLITE})
    assert v2.counts.get("repeat: fence") == 1 and "repeat: clock step" not in v2.counts, v2.counts
