"""The checkers of careless clients' classes of bug (tokens-unique, errors-classified,
cancelled-calls, no-hung-pass) on hand-made histories: each says yes to a clean history, no to one
shaped like the bug it closes (naming the operations), and unknown when there is nothing to judge."""

from __future__ import annotations

from typing import Any

from test_chaos_checkers import WF, H, final
from wd_chaos import checks
from wd_chaos.checks.cancelled_calls import cancelled_calls
from wd_chaos.checks.core import UNKNOWN
from wd_chaos.checks.errors_classified import errors_classified
from wd_chaos.checks.no_hung_pass import MARGIN_NS, no_hung_pass
from wd_chaos.checks.tokens_unique import tokens_unique
from wd_chaos.history import digest


def test_the_new_checkers_are_registered() -> None:
    found = checks.checkers()
    for name in ("tokens-unique", "errors-classified", "cancelled-calls", "no-hung-pass"):
        assert name in found, name
        assert found[name].__doc__, name


# -- tokens-unique ------------------------------------------------------------------------------


def test_tokens_unique_passes_rising_tokens_across_a_sweep() -> None:
    h = H()
    h.call("claim", "A", 1, workflow=WF, res={"token": 1})
    h.call("sweep", "C", 3, res={"swept": 0})
    h.call("claim", "B", 2, workflow=WF, res={"token": 2})
    h.call("claim", "A", 1, workflow="other", res={"token": 1})  # another id may reuse a number
    v = tokens_unique(h.lines, final([]))
    assert v.valid is True, v
    assert v.counts["claims"] == 3


def test_tokens_unique_refuses_a_token_minted_again_after_a_sweep() -> None:
    """Postgres's sweep dropped the claim row of a pass still renewing: the next claim got token 1,
    the token the running pass holds."""
    h = H()
    first = h.call("claim", "A", 1, workflow=WF, res={"token": 1})
    h.call("renew", "A", 1, workflow=WF, token=1)
    sweep = h.call("sweep", "C", 3, res={"swept": 0})
    again = h.call("claim", "B", 2, workflow=WF, res={"token": 1})
    v = tokens_unique(h.lines, final([]))
    assert v.valid is False, v
    ev = v.evidence[0]
    assert [c["op"] for c in ev["claims"]] == [first, again]
    assert any(b.get("op") == sweep for b in ev["between"]), ev
    assert v.counts["tokens handed out twice"] == 1


def test_tokens_unique_refuses_a_take_and_claim_token_handed_out_again_after_an_expiry() -> None:
    """Redis: the claim hash expired under a short TTL and a take_and_claim got a token already
    handed out (its workflow is on the complete line only)."""
    h = H()
    h.call("claim", "A", 1, workflow=WF, res={"token": 5})
    h.call("claim", "A", 1, workflow=WF, res={"token": 7})
    h.event("info", "ctl", 9, what="expired, say")
    later = h.call("claim", "B", 2, via="take_and_claim", res={"workflow": WF, "token": 6})
    v = tokens_unique(h.lines, final([]))
    assert v.valid is False, v
    assert v.evidence[0]["claims"][1]["op"] == later
    assert "not higher" in v.evidence[0]["why"]


def test_tokens_unique_refuses_two_overlapping_claims_with_one_token() -> None:
    h = H()
    a = h.begin("claim", "A", 1, workflow=WF)
    b = h.begin("claim", "B", 2, workflow=WF)
    h.end(a, "claim", token=3)
    h.end(b, "claim", token=3)
    assert tokens_unique(h.lines, final([])).valid is False


def test_tokens_unique_has_nothing_to_judge_without_claims() -> None:
    h = H()
    h.call("append", workflow=WF, value=1, res={"key": "inbox/1"})
    assert tokens_unique(h.lines, final([])).valid == UNKNOWN


# -- errors-classified ----------------------------------------------------------------------------


def _burst(
    h: H, message: str, types: list[str], beside_outcome: str = "ok", **beside_res: Any
) -> tuple[str, str]:
    bad = h.begin("append", "cc", 7, workflow="x" * 40, refused="oversize-id", burst="b1")
    ok = h.begin("append", "cc", 7, workflow=WF, value={"n": 1}, beside="b1")
    h.end(
        bad,
        "append",
        "failed" if "InvalidWorkflowId" in types else "unknown",
        error=message,
        error_types=types,
    )
    h.end(ok, "append", beside_outcome, **({"key": "inbox/1"} if beside_outcome == "ok" else beside_res))
    return bad, ok


def test_errors_classified_passes_a_refusal_as_invalid_input() -> None:
    h = H()
    _burst(
        h,
        "InvalidWorkflowId: too long",
        ["InvalidWorkflowId", "InvalidInput", "WithoutDurabilityError", "ValueError"],
    )
    h.call("supply", "cc", 7, workflow=WF, key="k" * 40, refused="oversize-key", burst="b1",
           res={"value": 1, "won": True})  # fmt: skip  # a store that can hold it may
    v = errors_classified(h.lines, final([]))
    assert v.valid is True, v
    assert v.counts["refused as input"] == 1 and v.counts["accepted"] == 1


def test_errors_classified_refuses_refused_input_reported_as_unreachable_and_its_batch_failed() -> None:
    """Postgres: an id too long for the index (SQLSTATE 54000) reported as StoreUnavailable, and
    the valid append in its batch failed with it."""
    h = H()
    bad, ok = _burst(
        h,
        "StoreUnavailable: could not be reached",
        ["StoreUnavailable", "StoreError", "WithoutDurabilityError"],
        "unknown",
        error="StoreUnavailable: could not be reached",
    )
    v = errors_classified(h.lines, final([]))
    assert v.valid is False, v
    assert [e["op"] for e in v.evidence] == [bad, ok]
    assert "StoreUnavailable" in v.evidence[0]["why"]


def test_errors_classified_refuses_an_accepted_value_the_codec_cannot_encode() -> None:
    h = H()
    op = h.call("append", "cc", 7, workflow=WF, refused="codec", burst="b2", res={"key": "inbox/2"})
    v = errors_classified(h.lines, final([]))
    assert v.valid is False and v.evidence[0]["op"] == op, v


def test_errors_classified_reads_the_error_name_when_types_were_not_recorded() -> None:
    h = H()
    h.call("append", "cc", 7, workflow=WF, refused="deep", burst="b3", outcome="failed",
           res={"error": "InvalidValue: nested too deep"})  # fmt: skip
    assert errors_classified(h.lines, final([])).valid is True


def test_errors_classified_excuses_what_a_fault_overlapped() -> None:
    h = H()
    h.event("fault", "ctl", 9, fault="restart", phase="start", id="r1")
    _burst(
        h, "StoreUnavailable: down", ["StoreUnavailable", "StoreError"], "unknown", error="StoreUnavailable"
    )
    h.event("fault", "ctl", 9, fault="restart", phase="stop", id="r1")
    assert errors_classified(h.lines, final([])).valid == UNKNOWN


def test_errors_classified_has_nothing_to_judge_without_refused_input() -> None:
    h = H()
    h.call("append", workflow=WF, value=1, res={"key": "inbox/1"})
    assert errors_classified(h.lines, final([])).valid == UNKNOWN


# -- cancelled-calls ------------------------------------------------------------------------------


def _read(h: H, values: list[Any], keys: list[str] | None = None) -> None:
    keys = keys or [f"inbox/{i}" for i in range(len(values))]
    h.call("history", "cc", 7, workflow=WF, via="writer",
           res={"keys": keys, "digests": [digest(v) for v in values]})  # fmt: skip


def test_cancelled_calls_passes_a_cancelled_append_that_landed_once_and_an_unsent_one_absent() -> None:
    h = H()
    h.call("append", "cc", 7, "unknown", workflow=WF, value={"c": 1}, timeout=0.01,
           res={"cancelled": True, "error": "TimeoutError"})  # fmt: skip
    h.call("append", "cc", 7, "unknown", workflow=WF, value={"c": 2}, timeout=0.01,
           res={"cancelled": True, "unsent": True, "error": "TimeoutError"})  # fmt: skip
    h.call("append", "cc", 7, workflow=WF, value={"ok": 1}, res={"key": "inbox/1"})
    _read(h, [{"c": 1}, {"ok": 1}])
    v = cancelled_calls(h.lines, final([]))
    assert v.valid is True, v
    assert v.counts["landed"] == 1 and v.counts["absent"] == 1 and v.counts["unsent"] == 1


def test_cancelled_calls_refuses_an_unsent_append_that_landed() -> None:
    """Postgres group commit: the caller was cancelled while its batch waited for the pool's only
    connection, and the batch committed it anyway."""
    h = H()
    op = h.call("append", "cc", 7, "unknown", workflow=WF, value={"c": 2}, timeout=0.1,
                res={"cancelled": True, "unsent": True, "error": "TimeoutError"})  # fmt: skip
    _read(h, [{"c": 2}])
    v = cancelled_calls(h.lines, final([]))
    assert v.valid is False, v
    assert v.evidence[0]["op"] == op and "landed" in v.evidence[0]["why"]


def test_cancelled_calls_refuses_a_cancelled_append_that_landed_twice() -> None:
    h = H()
    op = h.call("append", "cc", 7, "unknown", workflow=WF, value={"c": 3},
                res={"cancelled": True, "error": "TimeoutError"})  # fmt: skip
    _read(h, [{"c": 3}, {"c": 3}])
    v = cancelled_calls(h.lines, final([]))
    assert v.valid is False and v.evidence[0]["op"] == op, v


def test_cancelled_calls_refuses_a_swallowed_cancellation() -> None:
    """Redis on Python 3.11: a cancel accepted by the call's task, and the call returned anyway."""
    h = H()
    op = h.call("renew", "cc", 7, workflow=WF, token=2, res={"cancel_swallowed": True})
    v = cancelled_calls(h.lines, final([]))
    assert v.valid is False and v.evidence[0]["op"] == op, v
    assert v.counts["swallowed"] == 1


def test_cancelled_calls_has_nothing_to_judge_without_cancellations() -> None:
    h = H()
    h.call("append", workflow=WF, value=1, res={"key": "inbox/1"})
    assert cancelled_calls(h.lines, final([])).valid == UNKNOWN


# -- no-hung-pass --------------------------------------------------------------------------------


def _pass(h: H, *, ticker_ends: bool, pid: int = 7) -> tuple[str, str]:
    h.event("info", "cc", pid, what="start", role="careless")
    p = h.begin("pass", "cc", pid, workflow=WF, token=1)
    body = h.call("body", "cc", pid, workflow=WF, token=1)
    h.call("renew", "cc", pid, workflow=WF, token=1)  # in flight as the body ended: allowed
    if ticker_ends:
        h.end(p, "pass", token=1)
    else:
        h.t += MARGIN_NS  # the ticker goes on renewing, the pass never ends
        h.call("renew", "cc", pid, workflow=WF, token=1)
    h.event("info", "controller", 1, what="stop")
    if ticker_ends:
        h.event("info", "cc", pid, what="exit", role="careless")
    return p, body


def test_no_hung_pass_passes_a_pass_whose_ticker_ended() -> None:
    h = H()
    _pass(h, ticker_ends=True)
    v = no_hung_pass(h.lines, final([]))
    assert v.valid is True, v
    assert v.counts["judged"] == 1


def test_no_hung_pass_refuses_a_ticker_that_outlived_its_body_and_a_process_that_never_exited() -> None:
    """Redis on Python 3.11: the ticker's in-flight renew swallowed its cancel and renewed on."""
    h = H()
    p, body = _pass(h, ticker_ends=False)
    v = no_hung_pass(h.lines, final([]))
    assert v.valid is False, v
    whys = " | ".join(str(e["why"]) for e in v.evidence)
    assert "renewal(s) of this pass invoked" in whys and "never ended" in whys and "never finished" in whys
    assert v.evidence[0]["op"] == body and v.evidence[1]["op"] == p


def test_no_hung_pass_excuses_a_pass_whose_process_was_stopped_by_a_fault() -> None:
    h = H()
    h.event("fault", "ctl", 9, fault="stall", phase="start", id="s1", target_pid=7)
    h.call("body", "cc", 7, workflow=WF, token=1)
    h.t += 2 * MARGIN_NS
    h.call("renew", "cc", 7, workflow=WF, token=1)
    h.event("fault", "ctl", 9, fault="stall", phase="stop", id="s1", target_pid=7)
    assert no_hung_pass(h.lines, final([])).valid is True


def test_no_hung_pass_has_nothing_to_judge_without_passes() -> None:
    h = H()
    h.call("append", workflow=WF, value=1, res={"key": "inbox/1"})
    assert no_hung_pass(h.lines, final([])).valid == UNKNOWN
