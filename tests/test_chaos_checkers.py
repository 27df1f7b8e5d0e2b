"""The chaos checkers on hand-made histories: each must say yes to a correct history and no to
one that breaks its guarantee (a checker that cannot say no is a defect)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from wd_chaos import checks, wallclock
from wd_chaos.checks.at_least_once import at_least_once
from wd_chaos.checks.exactly_once import exactly_once
from wd_chaos.checks.fencing import fencing
from wd_chaos.checks.first_writer_wins import first_writer_wins
from wd_chaos.checks.liveness import liveness
from wd_chaos.checks.order import order
from wd_chaos.checks.take_exclusive import take_exclusive
from wd_chaos.history import Op


class H:
    """Builds a history: ``call`` writes an invoke and (unless ``outcome`` is None) a complete,
    one tick apart; ``begin``/``end`` split them for overlapping operations."""

    def __init__(self) -> None:
        self.lines: list[Op] = []
        self.t = 0
        self.n = 0

    def _tick(self) -> int:
        self.t += 1000
        return self.t

    def begin(self, f: str, proc: str = "w1", pid: int = 1, **inv: Any) -> str:
        self.n += 1
        op = f"{proc}:{pid}:{self.n}"
        self.lines.append(
            {"type": "invoke", "op": op, "f": f, "process": proc, "pid": pid, "mono": self._tick(), **inv}
        )
        return op

    def end(self, op: str, f: str, outcome: str = "ok", **res: Any) -> None:
        proc, pid, _ = op.split(":")
        self.lines.append(
            {
                "type": "complete",
                "op": op,
                "f": f,
                "outcome": outcome,
                "process": proc,
                "pid": int(pid),
                "mono": self._tick(),
                **res,
            }
        )

    def call(
        self,
        f: str,
        proc: str = "w1",
        pid: int = 1,
        outcome: str | None = "ok",
        res: dict[str, Any] | None = None,
        **inv: Any,
    ) -> str:
        op = self.begin(f, proc, pid, **inv)
        if outcome is not None:
            self.end(op, f, outcome, **(res or {}))
        return op

    def event(self, kind: str, proc: str = "w1", pid: int = 1, **fields: Any) -> None:
        self.lines.append({"type": kind, "process": proc, "pid": pid, "mono": self._tick(), **fields})


WF = "wf"


def final(
    records: list[tuple[str, Any]],
    *,
    ledger: list[dict[str, Any]] | None = None,
    workflows: list[str] | None = None,
) -> dict[str, Any]:
    hist = [[k, v, f"2030-01-01T00:00:{i:02d}+00:00"] for i, (k, v) in enumerate(records)]
    return {
        "workflows": {WF: {"history": hist, "load_keys": [k for k, _ in records]}},
        "ledger": ledger or [],
        "expected_workflows": workflows or [WF],
    }


def stale_write(h: H, *, outcome: str) -> str:
    """A claims (token 1), B claims (token 2), then A writes with token 1."""
    h.call("claim", "A", 1, workflow=WF, res={"token": 1})
    h.call("claim", "B", 2, workflow=WF, res={"token": 2})
    return h.call(
        "record",
        "A",
        1,
        outcome,
        workflow=WF,
        token=1,
        key="k",
        value=1,
        res={"value": 1, "won": True} if outcome == "ok" else {},
    )


# -- fencing --------------------------------------------------------------------------------


def test_fencing_accepts_a_refused_stale_write() -> None:
    h = H()
    stale_write(h, outcome="fenced")
    v = fencing(h.lines, final([]))
    assert v.valid is True, v
    assert v.counts["refused_fenced"] == 1


def test_fencing_refuses_an_accepted_stale_write_and_names_it() -> None:
    h = H()
    op = stale_write(h, outcome="ok")
    v = fencing(h.lines, final([("k", 1)]))
    assert v.valid is False, v
    assert v.evidence[0]["op"] == op, v.evidence


def test_fencing_refuses_a_token_issued_twice() -> None:
    h = H()
    h.call("claim", "A", 1, workflow=WF, res={"token": 3})
    h.call("claim", "B", 2, workflow=WF, res={"token": 3})
    assert fencing(h.lines, final([])).valid is False


def test_fencing_refuses_a_fence_with_no_newer_claim() -> None:
    h = H()
    h.call("claim", "A", 1, workflow=WF, res={"token": 1})
    h.call("record", "A", 1, "fenced", workflow=WF, token=1, key="k", value=1)
    assert fencing(h.lines, final([])).valid is False


def test_fencing_lets_an_indeterminate_claim_explain_a_fence() -> None:
    h = H()
    h.call("claim", "A", 1, workflow=WF, res={"token": 1})
    h.call("claim", "B", 2, None, workflow=WF)  # B was killed mid-claim: it may hold token 2
    h.call("record", "A", 1, "fenced", workflow=WF, token=1, key="k", value=1)
    assert fencing(h.lines, final([])).valid is True


def test_fencing_lets_a_sweep_or_a_discard_begun_before_it_explain_a_fence() -> None:
    for forget in ({"f": "sweep"}, {"f": "discard", "workflow": WF}):
        h = H()
        h.call("claim", "A", 1, workflow=WF, res={"token": 1})
        h.call(forget["f"], "S", 3, **{k: v for k, v in forget.items() if k != "f"})
        h.call("renew", "A", 1, "fenced", workflow=WF, token=1)
        assert fencing(h.lines, final([])).valid is True, forget
    h = H()  # a sweep begun only after the refusal ended explains nothing
    h.call("claim", "A", 1, workflow=WF, res={"token": 1})
    h.call("renew", "A", 1, "fenced", workflow=WF, token=1)
    h.call("sweep", "S", 3)
    assert fencing(h.lines, final([])).valid is False


def test_fencing_allows_overlapping_writes_of_the_old_pass() -> None:
    h = H()
    h.call("claim", "A", 1, workflow=WF, res={"token": 1})
    w = h.begin("record", "A", 1, workflow=WF, token=1, key="k", value=1)
    h.call("claim", "B", 2, workflow=WF, res={"token": 2})  # concurrent with A's write
    h.end(w, "record", "ok", value=1, won=True)
    assert fencing(h.lines, final([("k", 1)])).valid is True


# -- first writer wins ------------------------------------------------------------------------


def test_fww_accepts_a_loser_handed_the_winner() -> None:
    h = H()
    h.call("record", "A", 1, workflow=WF, token=1, key="k", value="a", res={"value": "a", "won": True})
    h.call("record", "B", 2, workflow=WF, token=2, key="k", value="b", res={"value": "a", "won": False})
    assert first_writer_wins(h.lines, final([("k", "a")])).valid is True


def test_fww_refuses_two_winners() -> None:
    h = H()
    h.call("record", "A", 1, workflow=WF, token=1, key="k", value="a", res={"value": "a", "won": True})
    h.call("record", "B", 2, workflow=WF, token=2, key="k", value="b", res={"value": "b", "won": True})
    v = first_writer_wins(h.lines, final([("k", "a")]))
    assert v.valid is False
    assert any(e.get("process") == "B" for e in v.evidence)


def test_fww_refuses_a_wrong_won_flag() -> None:
    h = H()
    h.call("supply", "A", 1, workflow=WF, key="k", value="a", res={"value": "a", "won": False})
    assert first_writer_wins(h.lines, final([("k", "a")])).valid is False


def test_fww_refuses_a_lost_acknowledged_write() -> None:
    h = H()
    h.call("supply", "A", 1, workflow=WF, key="k", value="a", res={"value": "a", "won": True})
    assert first_writer_wins(h.lines, final([])).valid is False


def test_fww_refuses_a_value_nobody_offered() -> None:
    h = H()
    h.call("supply", "A", 1, "fenced", workflow=WF, key="k", value="a")
    assert first_writer_wins(h.lines, final([("k", "zzz")])).valid is False


def test_fww_refuses_two_winning_transacts() -> None:
    h = H()
    for proc in ("A", "B"):
        h.call("transact", proc, 1, workflow=WF, token=1, key="t", res={"value": {"row": 1}, "won": True})
    assert first_writer_wins(h.lines, final([("t", {"row": 1})])).valid is False


# -- order -----------------------------------------------------------------------------------


def _appends(h: H, keys: list[str]) -> None:
    for i, key in enumerate(keys):
        h.call("append", f"W{i}", i, workflow=WF, value={"n": i}, res={"key": key})


def test_order_accepts_appends_in_order() -> None:
    h = H()
    keys = ["inbox/01", "inbox/02"]
    _appends(h, keys)
    v = order(h.lines, final([(keys[0], {"n": 0}), (keys[1], {"n": 1})]))
    assert v.valid is True, v


def test_order_refuses_a_key_handed_out_twice() -> None:
    h = H()
    _appends(h, ["inbox/01", "inbox/01"])
    assert order(h.lines, final([("inbox/01", {"n": 0})])).valid is False


def test_order_refuses_keys_against_real_time() -> None:
    h = H()
    _appends(h, ["inbox/02", "inbox/01"])
    f = final([("inbox/01", {"n": 1}), ("inbox/02", {"n": 0})])
    assert order(h.lines, f).valid is False


def test_order_refuses_a_lost_append() -> None:
    h = H()
    _appends(h, ["inbox/01"])
    assert order(h.lines, final([])).valid is False


def test_order_refuses_load_disagreeing_with_history() -> None:
    f = final([("a", 1), ("b", 2)])
    f["workflows"][WF]["load_keys"] = ["b", "a"]
    assert order([], f).valid is False


def test_order_refuses_written_at_going_backward_between_ordered_writes() -> None:
    h = H()
    h.call("supply", "A", 1, workflow=WF, key="a", value=1, res={"value": 1, "won": True})
    h.call("supply", "B", 2, workflow=WF, key="b", value=2, res={"value": 2, "won": True})
    f = final([("a", 1), ("b", 2)])
    f["workflows"][WF]["history"][1][2] = "2029-01-01T00:00:00+00:00"
    assert order(h.lines, f).valid is False


def test_order_lets_concurrent_writes_be_stamped_either_way() -> None:
    h = H()
    a = h.begin("append", "A", 1, workflow=WF, value=1)
    b = h.begin("append", "B", 2, workflow=WF, value=2)
    h.end(a, "append", key="inbox/1")
    h.end(b, "append", key="inbox/2")
    f = final([("inbox/1", 1), ("inbox/2", 2)])
    f["workflows"][WF]["history"][1][2] = "2029-01-01T00:00:00+00:00"
    v = order(h.lines, f)
    assert v.valid is True, v
    assert v.counts["written_at inversions between concurrent writes"] == 1


def test_order_refuses_a_later_write_loading_first() -> None:
    h = H()
    h.call("supply", "A", 1, workflow=WF, key="a", value=1, res={"value": 1, "won": True})
    h.call("supply", "A", 1, workflow=WF, key="b", value=2, res={"value": 2, "won": True})
    assert order(h.lines, final([("b", 2), ("a", 1)])).valid is False


def test_order_counts_a_retried_write_from_its_attempt_of_unknown_outcome() -> None:
    """store-restart on Redis: B's first arrive of "b" landed but its reply was lost in the
    restart (unknown); A's write of "a" was acknowledged; B's retry found "b" stored (won). "b"
    loads first, which is right: it landed during the attempt that began before "a" was acked."""
    h = H()
    h.call("supply", "B", 2, outcome="unknown", workflow=WF, key="b", value=2)
    h.call("supply", "A", 1, workflow=WF, key="a", value=1, res={"value": 1, "won": True})
    h.call("supply", "B", 2, workflow=WF, key="b", value=2, res={"value": 2, "won": True})
    v = order(h.lines, final([("b", 2), ("a", 1)]))
    assert v.valid is True, v


def test_order_still_refuses_a_retry_whose_earlier_attempt_wrote_something_else() -> None:
    """The earlier attempt of unknown outcome offered another value, or was refused outright: it
    cannot be what landed "b", so "b" loading before "a" is still a violation."""
    for outcome, value in (("unknown", 3), ("failed", 2)):
        h = H()
        h.call("supply", "B", 2, outcome=outcome, workflow=WF, key="b", value=value)
        h.call("supply", "A", 1, workflow=WF, key="a", value=1, res={"value": 1, "won": True})
        h.call("supply", "B", 2, workflow=WF, key="b", value=2, res={"value": 2, "won": True})
        assert order(h.lines, final([("b", 2), ("a", 1)])).valid is False, (outcome, value)


# -- exactly once ------------------------------------------------------------------------------


def _transact(h: H, outcome: str = "ok") -> None:
    h.call(
        "transact",
        "A",
        1,
        outcome,
        workflow=WF,
        token=1,
        key="t",
        res={"value": {"row": 7}, "won": True} if outcome == "ok" else {},
    )


def test_exactly_once_accepts_one_row_per_recorded_key() -> None:
    h = H()
    _transact(h)
    f = final([("t", {"row": 7})], ledger=[{"workflow": WF, "key": "t", "token": 1, "row": 7}])
    assert exactly_once(h.lines, f).valid is True


def test_exactly_once_refuses_two_rows() -> None:
    h = H()
    _transact(h)
    rows = [{"workflow": WF, "key": "t", "token": t, "row": r} for t, r in ((1, 7), (2, 8))]
    assert exactly_once(h.lines, final([("t", {"row": 7})], ledger=rows)).valid is False


def test_exactly_once_refuses_a_row_for_an_unrecorded_key() -> None:
    h = H()
    _transact(h, "fenced")
    f = final([], ledger=[{"workflow": WF, "key": "t", "token": 1, "row": 7}])
    assert exactly_once(h.lines, f).valid is False


def test_exactly_once_refuses_a_record_naming_another_row() -> None:
    h = H()
    _transact(h)
    f = final([("t", {"row": 7})], ledger=[{"workflow": WF, "key": "t", "token": 1, "row": 9}])
    assert exactly_once(h.lines, f).valid is False


# -- at least once -----------------------------------------------------------------------------


def _pass(h: H, proc: str, pid: int, token: int, nonce: str, outcome: str | None) -> None:
    h.call("claim", proc, pid, workflow=WF, res={"token": token})
    h.call("load", proc, pid, workflow=WF, token=token, res={"keys": []})
    h.event("effect", proc, pid, workflow=WF, key="s", token=token, nonce=nonce)
    if outcome is not None:
        value = {"nonce": nonce}
        res = {"value": value, "won": True} if outcome == "ok" else {}
        h.call("record", proc, pid, outcome, workflow=WF, token=token, key="s", value=value, res=res)


def test_at_least_once_accepts_a_repeat_after_a_fence() -> None:
    h = H()
    _pass(h, "A", 1, 1, "n1", "fenced")
    _pass(h, "B", 2, 2, "n2", "ok")
    v = at_least_once(h.lines, final([("s", {"nonce": "n2"})]))
    assert v.valid is True, v
    assert v.counts["repeat: fence"] == 1


def test_at_least_once_accepts_a_repeat_after_a_kill() -> None:
    h = H()
    _pass(h, "A", 1, 1, "n1", None)
    h.event("fault", "A", 1, fault="kill", phase="start", failpoint="after-effect-before-record")
    _pass(h, "B", 2, 2, "n2", "ok")
    v = at_least_once(h.lines, final([("s", {"nonce": "n2"})]))
    assert v.valid is True, v
    assert v.counts["repeat: kill"] == 1


def test_at_least_once_refuses_a_record_whose_effect_never_ran() -> None:
    assert at_least_once([], final([("s", {"nonce": "ghost"})])).valid is False


def test_at_least_once_refuses_a_rerun_after_an_acknowledged_record() -> None:
    h = H()
    _pass(h, "A", 1, 1, "n1", "ok")
    _pass(h, "B", 2, 2, "n2", None)  # loaded after A's record was acknowledged, ran it again
    assert at_least_once(h.lines, final([("s", {"nonce": "n1"})])).valid is False


def test_at_least_once_refuses_an_unexplained_repeat() -> None:
    h = H()
    h.call("claim", "A", 1, workflow=WF, res={"token": 1})
    h.event("effect", "A", 1, workflow=WF, key="s", token=1, nonce="n1")  # then nothing at all
    _pass(h, "B", 2, 2, "n2", "ok")
    assert at_least_once(h.lines, final([("s", {"nonce": "n2"})])).valid is False


# -- liveness, take exclusivity, bite, crashes ---------------------------------------------------


def test_liveness() -> None:
    assert liveness([], final([("done", 1)])).valid is True
    v = liveness([], final([("charge", 1)]))
    assert v.valid is False
    assert v.evidence[0]["workflow"] == WF


def test_take_exclusive_refuses_a_double_delivery() -> None:
    h = H()
    h.call("take", "A", 1, visibility=30.0, res={"workflow": WF})
    h.call("take", "B", 2, visibility=30.0, res={"workflow": WF})
    assert take_exclusive(h.lines, final([])).valid is False
    h2 = H()
    h2.call("take", "A", 1, visibility=30.0, res={"workflow": WF})
    h2.call("wake_at", "A", 1, workflow=WF)
    h2.call("take", "B", 2, visibility=30.0, res={"workflow": WF})
    assert take_exclusive(h2.lines, final([])).valid is True


def _stall(h: H, refused: bool) -> None:
    h.call("claim", "A", 1, workflow=WF, res={"token": 1})
    h.event("fault", "controller", 9, fault="stall", phase="start", id="s0", target_pid=1, duration=3)
    h.call("claim", "B", 2, workflow=WF, res={"token": 2})
    h.event("fault", "controller", 9, fault="stall", phase="stop", id="s0", target_pid=1)
    h.call(
        "record",
        "A",
        1,
        "fenced" if refused else "ok",
        workflow=WF,
        token=1,
        key="k",
        value=1,
        res={} if refused else {"value": 1, "won": True},
    )


def test_stall_bite() -> None:
    h = H()
    _stall(h, refused=True)
    assert checks.bite("stall-fenced")(h.lines, final([])).valid is True
    h2 = H()
    _stall(h2, refused=False)
    v = checks.bite("stall-fenced")(h2.lines, final([]))
    # the stall bit (the stalled pass woke behind a newer claim); the store's acceptance of its
    # write is fencing's verdict, not the bite's
    assert v.valid is True and v.counts["bit"] == 1, v
    assert "none was refused" in v.summary


def _stall_between_passes(h: H, pid: int) -> None:
    """A stall of a worker that held no pass (it caught the worker between passes): nothing to
    refuse on waking, so it bit nothing."""
    h.event("fault", "controller", 9, fault="stall", phase="start", id="s0", target_pid=pid, duration=3)
    h.event("fault", "controller", 9, fault="stall", phase="stop", id="s0", target_pid=pid)


def test_a_stall_that_bit_nothing_is_not_tested_so_the_run_is_unknown() -> None:
    h = H()
    h.call("claim", "A", 1, workflow=WF, res={"token": 1})
    h.call("record", "A", 1, workflow=WF, token=1, key="k", value=1, res={"value": 1, "won": True})
    _stall_between_passes(h, pid=1)
    verdicts = checks.check(h.lines, final([("k", 1)]), ["fencing"], "stall-fenced")
    fenced, bite = verdicts
    assert fenced.valid is True, fenced
    assert bite.name == "bite: stall-fenced" and bite.valid == checks.UNKNOWN, bite
    assert bite.summary.startswith(checks.NOT_TESTED) and bite.counts == {"faults": 1, "bit": 0}, bite
    assert checks.not_bitten(bite.name, bite.valid, bite.counts)
    assert checks.overall(verdicts) == checks.UNKNOWN
    assert checks.exit_code(checks.overall(verdicts)) == 2  # unknown, never invalid


def test_a_real_violation_beside_a_fault_that_did_not_bite_is_still_invalid() -> None:
    h = H()
    stale_write(h, outcome="ok")  # the store took a superseded pass's write
    _stall_between_passes(h, pid=3)  # a stall of another worker, which touched nothing
    verdicts = checks.check(h.lines, final([("k", 1)]), ["fencing"], "stall-fenced")
    fenced, bite = verdicts
    assert fenced.valid is False, fenced
    assert bite.valid == checks.UNKNOWN and checks.not_bitten(bite.name, bite.valid, bite.counts), bite
    assert checks.overall(verdicts) is False
    assert checks.exit_code(checks.overall(verdicts)) == 1


def test_only_a_bite_check_that_found_no_bite_is_not_tested() -> None:
    def crash(ops: list[Op], final: dict[str, Any]) -> checks.Verdict:
        raise RuntimeError("a bite check with a bug")

    crashed = checks.run_checker("bite: stall-fenced", crash, [], {})
    assert crashed.valid == checks.UNKNOWN, crashed  # unknown, but not "the fault did not bite"
    assert not checks.not_bitten(crashed.name, crashed.valid, crashed.counts)
    assert not checks.not_bitten("fencing", checks.UNKNOWN, {"bit": 0})
    assert not checks.not_bitten("bite: storm", True, {"bit": 0})


def test_a_crashing_checker_is_unknown_never_valid() -> None:
    v = checks.run_checker("liveness", liveness, [], {"expected_workflows": 5})
    assert v.valid == checks.UNKNOWN
    assert "traceback" in v.evidence[0]


@pytest.mark.parametrize(("valid", "code"), [(True, 0), (False, 1), ("unknown", 2)])
def test_exit_codes(valid: checks.Valid, code: int) -> None:
    assert checks.exit_code(valid) == code


def test_overall_prefers_invalid_then_unknown() -> None:
    v = [checks.Verdict("a", True, ""), checks.Verdict("b", "unknown", "")]
    assert checks.overall(v) == "unknown"
    assert checks.overall([*v, checks.Verdict("c", False, "")]) is False


def test_kill_bite_counts_only_kills_between_effect_and_record() -> None:
    h = H()
    h.event("fault", "controller", 9, fault="kill", phase="armed", failpoint="inside-transact")
    h.event("fault", "A", 1, fault="kill", phase="start", failpoint="after-claim")
    assert checks.bite("kill-between")(h.lines, final([])).valid == checks.UNKNOWN
    h.event("effect", "B", 2, workflow=WF, key="s", token=1, nonce="n")
    h.event("fault", "B", 2, fault="kill", phase="start", failpoint="after-effect-before-record", key="s")
    assert checks.bite("kill-between")(h.lines, final([])).valid is True


def _claim(h: H, proc: str, pid: int, token: int) -> None:
    h.call("claim", proc, pid, workflow=WF, alive=1.0, budget=4.0, res={"token": token})


def test_fencing_refuses_a_claim_granted_while_another_pass_is_alive() -> None:
    h = H()  # ticks are 1 µs: everything below happens well inside one 1 s liveness window
    _claim(h, "A", 1, 1)
    h.call("record", "A", 1, workflow=WF, token=1, key="k", value=1, res={"value": 1, "won": True})
    _claim(h, "B", 2, 2)
    v = fencing(h.lines, final([("k", 1)]))
    assert v.valid is False, v
    assert "while token 1 was alive" in v.evidence[0]["why"]


def test_fencing_allows_a_claim_after_release_or_after_the_window() -> None:
    h = H()
    _claim(h, "A", 1, 1)
    h.call("release", "A", 1, workflow=WF, token=1)
    _claim(h, "B", 2, 2)
    assert fencing(h.lines, final([])).valid is True
    h2 = H()
    _claim(h2, "A", 1, 1)
    h2.t += 2_000_000_000  # two seconds of silence: the 1 s window has lapsed
    _claim(h2, "B", 2, 2)
    assert fencing(h2.lines, final([])).valid is True


def test_fencing_refuses_contended_after_the_holders_budget() -> None:
    h = H()
    _claim(h, "A", 1, 1)
    h.t += 5_000_000_000  # five seconds: past A's four-second budget, whatever it renewed
    h.call("claim", "B", 2, "contended", workflow=WF, alive=1.0, budget=4.0)
    v = fencing(h.lines, final([]))
    assert v.valid is False, v
    h2 = H()
    _claim(h2, "A", 1, 1)
    h2.t += 2_000_000_000  # within the budget: a renewing holder may still be alive
    h2.call("claim", "B", 2, "contended", workflow=WF, alive=1.0, budget=4.0)
    assert fencing(h2.lines, final([])).valid is True


def test_fencing_lets_a_claim_whose_reply_was_lost_explain_a_contended_one() -> None:
    # found by wd-chaos sim (lease-stall seed 77): a newer claim that landed, its reply lost, holds
    # the workflow; its token is unknown, so it may be newer than the last claim seen
    h = H()
    _claim(h, "A", 1, 1)
    h.t += 3_000_000_000
    h.call("claim", "C", 3, "unknown", workflow=WF, alive=1.0, budget=4.0, error="StoreUnavailable: lost")
    h.t += 1_500_000_000  # past A's budget, within C's liveness
    h.call("claim", "B", 2, "contended", workflow=WF, alive=1.0, budget=4.0)
    assert fencing(h.lines, final([])).valid is True


def test_fww_refuses_a_supply_gated_on_the_claim() -> None:
    h = H()
    h.call("supply", "W", 1, "contended", workflow=WF, key="k", value=1)
    assert first_writer_wins(h.lines, final([])).valid is False


# -- wall-clock steps -------------------------------------------------------------------------


LOCAL_WALL = {"store_clock": "local", "lease_clock": "wall"}
MONOTONIC = {"store_clock": "local", "lease_clock": "monotonic"}
REMOTE = {"store_clock": "remote", "lease_clock": "wall"}


def _walls(h: H, *, step_after: int | None = None, seconds: float = 0.0) -> None:
    """Stamp every line's ``wall`` as the harness does: the monotonic time plus a fixed offset,
    which jumps by ``seconds`` for lines after monotonic ``step_after``."""
    base = datetime(2030, 1, 1, tzinfo=UTC)
    for line in h.lines:
        shift = seconds if step_after is not None and line["mono"] > step_after else 0.0
        line["wall"] = (base + timedelta(microseconds=line["mono"] / 1000, seconds=shift)).isoformat()


def _breach_across(step_after: int | None, seconds: float) -> H:
    """A renews at 0; the wall clock may step; B claims 0.3 s later, inside A's 1 s window; the
    run goes on another second."""
    h = H()
    _claim(h, "A", 1, 1)
    h.call("renew", "A", 1, workflow=WF, token=1)
    h.t += 300_000_000
    _claim(h, "B", 2, 2)
    h.t += 1_000_000_000
    h.event("info", what="exit")
    _walls(h, step_after=step_after, seconds=seconds)
    return h


def test_wallclock_finds_a_step_and_not_a_line_preempted_between_its_two_reads() -> None:
    h = H()
    for _ in range(30):
        h.event("info")
        h.t += 100_000_000
    _walls(h, step_after=1_500_000_000, seconds=1.5)
    h.lines[4]["wall"] = (datetime.fromisoformat(h.lines[4]["wall"]) + timedelta(seconds=0.2)).isoformat()
    found = wallclock.steps(h.lines)
    assert [round(s["seconds"], 3) for s in found] == [1.5], found
    lo, hi = found[0]["between"]
    assert lo <= 1_500_000_000 <= hi, found
    assert wallclock.jumped(found, 0, 1_000_000_000) == 0
    assert wallclock.jumped(found, 1_400_000_000, 1_600_000_000) == pytest.approx(1.5)
    assert wallclock.jumped(found, 0, 3e9, ahead=False) == 0


def test_fencing_calls_a_breach_a_forward_wall_clock_step_explains_unknown_not_valid() -> None:
    h = _breach_across(step_after=100_000_000, seconds=2.0)
    v = fencing(h.lines, {**final([]), **LOCAL_WALL})
    assert v.valid == checks.UNKNOWN, v
    assert "wall clock stepped" in v.summary and "+2.000s" in v.summary, v.summary
    assert any("wall_clock_step" in e for e in v.evidence), v.evidence


@pytest.mark.parametrize(
    ("clocks", "step_after", "seconds"),
    [
        (MONOTONIC, 100_000_000, 2.0),  # leases on a clock the step does not move: a real breach
        (REMOTE, 100_000_000, 2.0),  # a server elsewhere: this machine's clock says nothing of it
        (LOCAL_WALL, None, 0.0),  # no step at all
        (LOCAL_WALL, 100_000_000, 0.05),  # a step too small to account for a 0.7 s shortfall
        (LOCAL_WALL, 100_000_000, -2.0),  # a step back only makes a wall-clock lease last longer
        (LOCAL_WALL, 1_000_000_000, 2.0),  # a step after the breach
    ],
)
def test_fencing_still_refuses_a_breach_no_wall_clock_step_explains(
    clocks: dict[str, str], step_after: int | None, seconds: float
) -> None:
    h = _breach_across(step_after, seconds)
    v = fencing(h.lines, {**final([]), **clocks})
    assert v.valid is False, v
    assert "while token 1 was alive" in v.evidence[0]["why"]


def test_fencing_calls_contended_past_the_budget_after_a_step_back_unknown() -> None:
    h = H()
    _claim(h, "A", 1, 1)
    h.t += 5_000_000_000  # five seconds by the monotonic clock, three by a wall stepped back 2 s
    h.call("claim", "B", 2, "contended", workflow=WF, alive=1.0, budget=4.0)
    h.t += 1_000_000_000
    h.event("info", what="exit")
    _walls(h, step_after=2_000_000_000, seconds=-2.0)
    assert fencing(h.lines, {**final([]), **LOCAL_WALL}).valid == checks.UNKNOWN
    assert fencing(h.lines, {**final([]), **MONOTONIC}).valid is False


def test_order_calls_written_at_going_back_across_a_step_back_unknown() -> None:
    h = H()
    h.call("supply", "A", 1, workflow=WF, key="a", value=1, res={"value": 1, "won": True})
    h.t += 1_000_000_000
    h.call("supply", "B", 2, workflow=WF, key="b", value=2, res={"value": 2, "won": True})
    h.t += 1_000_000_000
    h.event("info", what="exit")
    _walls(h, step_after=500_000_000, seconds=-5.0)
    f = {**final([("a", 1), ("b", 2)]), **LOCAL_WALL}
    f["workflows"][WF]["history"][0][2] = "2030-01-01T00:00:10+00:00"
    f["workflows"][WF]["history"][1][2] = "2030-01-01T00:00:06+00:00"  # 4 s back, within the 5 s step
    v = order(h.lines, f)
    assert v.valid == checks.UNKNOWN, v
    f["workflows"][WF]["history"][1][2] = "2030-01-01T00:00:01+00:00"  # 9 s back: more than the step
    assert order(h.lines, f).valid is False
    assert order(h.lines, {**f, **REMOTE}).valid is False


def test_take_exclusive_calls_a_double_delivery_across_a_step_ahead_unknown() -> None:
    h = H()
    h.call("take", "A", 1, visibility=3.0, res={"workflow": WF})
    h.t += 1_000_000_000
    h.call("take", "B", 2, visibility=3.0, res={"workflow": WF})
    h.t += 1_000_000_000
    h.event("info", what="exit")
    _walls(h, step_after=500_000_000, seconds=2.5)
    assert take_exclusive(h.lines, {**final([]), **LOCAL_WALL}).valid == checks.UNKNOWN
    assert take_exclusive(h.lines, {**final([]), **REMOTE}).valid is False
    _walls(h, step_after=500_000_000, seconds=0.5)  # 1 s apart, 3 s hidden: 0.5 s explains nothing
    assert take_exclusive(h.lines, {**final([]), **LOCAL_WALL}).valid is False


def test_fencing_takes_a_transact_of_a_recorded_key_as_a_read() -> None:
    """transact of a key already recorded returns it without checking the fence (won false): a
    superseded pass may get that answer, and it renews nobody."""
    h = H()
    _claim(h, "A", 1, 1)
    h.t += 2_000_000_000  # A's 1 s window lapses
    _claim(h, "B", 2, 2)
    h.t += 500_000_000
    h.call("transact", "A", 1, workflow=WF, token=1, key="ledger", res={"value": {"row": 1}, "won": False})
    h.t += 600_000_000  # B's window lapses; a renewal by A's transact would still cover this
    _claim(h, "C", 3, 3)
    v = fencing(h.lines, {**final([]), **MONOTONIC})
    assert v.valid is True, v
    h.call("transact", "A", 1, workflow=WF, token=1, key="other", res={"value": {"row": 2}, "won": True})
    v = fencing(h.lines, {**final([]), **MONOTONIC})
    assert v.valid is False and "superseded token 1 was accepted" in v.evidence[0]["why"], v


def test_fencing_allows_a_claim_in_flight_when_the_holder_released() -> None:
    """B asks while A holds; A releases; the store decides B's claim after the release."""
    h = H()
    _claim(h, "A", 1, 1)
    b = h.begin("claim", "B", 2, workflow=WF, alive=1.0, budget=4.0)
    h.call("release", "A", 1, workflow=WF, token=1)
    h.end(b, "claim", token=2)
    assert fencing(h.lines, {**final([]), **MONOTONIC}).valid is True
    h2 = H()  # but a claim granted before the release was even asked for is a breach
    _claim(h2, "A", 1, 1)
    _claim(h2, "B", 2, 2)
    h2.call("release", "A", 1, workflow=WF, token=1)
    v = fencing(h2.lines, {**final([]), **MONOTONIC})
    assert v.valid is False and "while token 1 was alive" in v.evidence[0]["why"], v


# -- coverage windows ---------------------------------------------------------------------------


def test_coverage_counts_each_window_and_is_unknown_when_one_was_never_reached() -> None:
    from wd_chaos.checks.coverage import coverage, windows

    assert {"stale-write-refused", "takeover-during-stall", "call-cancelled"} <= set(windows())
    h = H()
    stale_write(h, outcome="fenced")
    reached = coverage(h.lines, ["stale-write-refused"])
    assert reached.valid is True and reached.counts == {"stale-write-refused": 1}, reached
    missed = coverage(h.lines, ["stale-write-refused", "call-cancelled"])
    assert missed.valid == checks.UNKNOWN and missed.counts == {"stale-write-refused": 1, "call-cancelled": 0}
    assert "call-cancelled" in missed.summary and "not tested" in missed.summary


def test_a_scenario_naming_an_unknown_window_is_refused() -> None:
    from wd_chaos.scenario import ScenarioError, parse

    with pytest.raises(ScenarioError, match="coverage"):
        parse('name = "x"\ncoverage = ["no-such-window"]\n', "x.toml")


def test_fencing_excuses_a_takeover_only_from_a_faulted_holder_under_fast_failover() -> None:
    """With fast failover a claim inside a live holder's window is the design once a fault struck
    the holder's process (here a failpoint kill); without that fault, or without fast failover, it
    is still a breach."""

    def run(*, fault: bool, fast: bool) -> checks.Verdict:
        h = H()
        _claim(h, "A", 1, 1)
        h.call("record", "A", 1, workflow=WF, token=1, key="k", value=1, res={"value": 1, "won": True})
        if fault:
            h.event(
                "fault", "A", 1, phase="start", fault="kill", id="after-claim.kill-0", workflow=WF, token=1
            )
        _claim(h, "B", 2, 2)
        return fencing(h.lines, {**final([("k", 1)]), "fast_failover": fast})

    assert run(fault=True, fast=True).valid is True
    assert "taken over from a faulted holder" in run(fault=True, fast=True).summary
    assert run(fault=False, fast=True).valid is False
    assert run(fault=True, fast=False).valid is False


def test_fencing_excuses_a_takeover_after_a_restart_ended_the_holders_session_under_fast_failover() -> None:
    """store-restart on Postgres with fast failover: the restart ended every session, so the live
    holder's presence lock was free and another worker took its claim over. That is the trade fast
    failover documents, when the restart fell inside the holder's window; a restart before the
    holder's claim, or a run without fast failover, still makes the takeover a breach."""

    def run(*, restart: str, fast: bool) -> checks.Verdict:
        h = H()

        def restarted() -> None:
            h.event("fault", "controller", 9, phase="start", fault="restart", id="restart-0",
                    target="store", target_pid=99, ends_sessions=True)  # fmt: skip

        if restart == "before":
            restarted()
        _claim(h, "A", 1, 1)
        if restart == "inside":
            restarted()
        _claim(h, "B", 2, 2)
        return fencing(h.lines, {**final([]), "fast_failover": fast})

    assert run(restart="inside", fast=True).valid is True
    assert run(restart="before", fast=True).valid is False
    assert run(restart="inside", fast=False).valid is False
