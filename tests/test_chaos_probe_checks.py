"""The probe checkers on hand-made histories shaped like the take storm's probe sequences
(``wd_chaos.client.probes``): each says yes to what a correct store answers and no to what the catalogue
mutant it is named for answers."""

from __future__ import annotations

from typing import Any

from wd_chaos import checks
from wd_chaos.history import Op

WF = "probe/u0/1/x"
S = 1_000_000_000  # a second of the monotonic clock


class H:
    """A history whose clock moves only when told: ``call`` writes an invoke and, ``took`` later,
    its complete (``outcome`` None: no complete, as a killed process leaves)."""

    def __init__(self) -> None:
        self.lines: list[Op] = []
        self.t = 0
        self.n = 0

    def wait(self, seconds: float) -> None:
        self.t += int(seconds * S)

    def call(self, f: str, outcome: str | None = "ok", took: float = 0.01, res: Any = None, **inv: Any) -> None:
        self.n += 1
        base = {"op": f"u0:1:{self.n}", "f": f, "process": "u0", "pid": 1}
        self.lines.append({"type": "invoke", "mono": self.t, **base, **inv})
        self.wait(took)
        if outcome is not None:
            self.lines.append({"type": "complete", "outcome": outcome, "mono": self.t, **base, **(res or {})})

    def claim(self, token: int | None, alive: float = 0.3, outcome: str = "ok", wf: str = WF) -> None:
        res = {"token": token} if outcome == "ok" else {"error": f"{outcome}: {wf}"}
        self.call("claim", outcome, workflow=wf, alive=alive, budget=10.0, res=res)


def run(name: str, h: H) -> checks.Verdict:
    return checks.run_checker(name, checks.checkers()[name], h.lines, {})


def discard_then_claim(second_token: int) -> H:
    h = H()
    h.claim(1)
    h.call("release", workflow=WF, token=1)
    h.call("discard", workflow=WF)
    h.claim(second_token)
    return h


def test_tokens_rise_passes_a_discard_that_raised_the_fence() -> None:
    assert run("tokens-rise", discard_then_claim(3)).valid is True


def test_tokens_rise_fails_a_token_minted_again_after_a_discard() -> None:
    verdict = run("tokens-rise", discard_then_claim(1))
    assert verdict.valid is False, verdict.summary
    assert [e["why"] for e in verdict.evidence] == ["granted this token", "granted a token no higher, later"]


def test_tokens_rise_does_not_judge_concurrent_claims() -> None:
    h = H()
    h.call("claim", outcome=None, workflow=WF, alive=0.3, budget=10.0)  # never completed
    h.claim(1)
    assert run("tokens-rise", h).valid is True


def lapse(last: str) -> H:
    """The probe's ``lapse``: old lapses, new claims (alive 1 s), old's write is refused, then a
    claim 1.25 s after new's claim completed gets ``last``."""
    h = H()
    h.claim(1, alive=0.3)
    h.wait(0.45)
    h.claim(2, alive=1.0)
    h.wait(0.5)
    h.call("record", "fenced", workflow=WF, token=1, key="stale", value={}, res={"error": "Fenced"})
    h.wait(0.75)
    h.claim(3 if last == "ok" else None, outcome=last)
    return h


def test_lease_lapses_passes_a_claim_granted_after_the_holder_lapsed() -> None:
    assert run("lease-lapses", lapse("ok")).valid is True


def test_lease_lapses_fails_a_claim_refused_when_only_a_refused_write_kept_the_holder() -> None:
    verdict = run("lease-lapses", lapse("contended"))
    assert verdict.valid is False, verdict.summary
    assert verdict.evidence[1]["f"] == "claim" and verdict.evidence[1]["got_token"] == 2  # the silent holder


def test_lease_lapses_lets_a_write_that_may_have_landed_renew() -> None:
    h = H()
    h.claim(1, alive=1.0)
    h.wait(0.5)
    h.call("record", "unknown", workflow=WF, token=1, key="k", value={})  # may have renewed
    h.wait(1.2)
    h.claim(None, outcome="contended")
    assert run("lease-lapses", h).valid is False  # 1.2 s after it: past its renewal too
    h2 = H()
    h2.claim(1, alive=1.0)
    h2.wait(0.5)
    h2.call("record", None, workflow=WF, token=1, key="k", value={})  # still in flight
    h2.wait(1.2)
    h2.claim(None, outcome="contended")
    assert run("lease-lapses", h2).valid is True


def test_lease_lapses_passes_a_claim_refused_while_the_holder_renewed() -> None:
    h = H()
    h.claim(1, alive=1.0)
    h.wait(0.8)
    h.call("renew", workflow=WF, token=1)
    h.wait(0.8)
    h.claim(None, outcome="contended")
    assert run("lease-lapses", h).valid is True


def cancelled(again: bool, wakeup: bool = False) -> H:
    """The probe's ``cancel``: take, cancel, a stale answer due now, then a take."""
    h = H()
    h.call("schedule", workflow=WF)
    h.call("take", visibility=5.0, res={"workflow": WF, "receipt": "r1"})
    h.call("cancel", workflow=WF)
    h.call("wake_at", workflow=WF, at="2030-01-01T00:00:00+00:00", receipt="r1")
    if wakeup:
        h.call("schedule", workflow=WF)
    h.call("take", visibility=5.0, res={"workflow": WF if again else None, "receipt": "r2" if again else None})
    return h


def test_cancel_sticks_passes_a_cancel_the_stale_answer_left_alone() -> None:
    assert run("cancel-sticks", cancelled(again=False)).valid is True


def test_cancel_sticks_fails_a_cancelled_workflow_handed_out_again() -> None:
    verdict = run("cancel-sticks", cancelled(again=True))
    assert verdict.valid is False, verdict.summary


def test_cancel_sticks_lets_a_wakeup_since_the_cancel_bring_it_back() -> None:
    assert run("cancel-sticks", cancelled(again=True, wakeup=True)).valid is True


def stale_answer(again: bool, current: bool = False) -> H:
    """The probe's ``answer``: two takes (the first's receipt ran out), the first receipt answered
    due now through answer_and_take, then a take while the second still hides the workflow."""
    h = H()
    h.call("schedule", workflow=WF)
    h.call("take", visibility=0.2, res={"workflow": WF, "receipt": "r1"})
    h.wait(0.3)
    h.call("take", visibility=5.0, res={"workflow": WF, "receipt": "r2"})
    receipt = "r2" if current else "r1"
    h.call("wake_at", workflow=WF, at="2030", receipt=receipt, via="answer_and_take", call="c1")
    h.call("take", visibility=5.0, res={"workflow": WF if again else None, "receipt": "r3" if again else None})
    return h


def test_own_receipt_passes_a_stale_answer_that_acted_on_nothing() -> None:
    assert run("own-receipt", stale_answer(again=False)).valid is True


def test_own_receipt_fails_a_stale_answer_that_released_the_newer_delivery() -> None:
    verdict = run("own-receipt", stale_answer(again=True))
    assert verdict.valid is False, verdict.summary


def test_own_receipt_lets_the_current_receipt_release_it() -> None:
    assert run("own-receipt", stale_answer(again=True, current=True)).valid is True


def answered(handed_back: bool) -> H:
    h = H()
    h.call("take", visibility=5.0, res={"workflow": WF, "receipt": "r1"})
    h.call("schedule", workflow=WF)
    h.call(
        "take", visibility=5.0, answered=WF, via="answer_and_take", call="c2",
        res={"workflow": WF if handed_back else None, "receipt": "r2" if handed_back else None},
    )  # fmt: skip
    return h


def test_answer_then_take_passes_a_take_that_left_the_answered_workflow() -> None:
    assert run("answer-then-take", answered(handed_back=False)).valid is True


def test_answer_then_take_fails_a_take_that_handed_back_the_answered_workflow() -> None:
    verdict = run("answer-then-take", answered(handed_back=True))
    assert verdict.valid is False, verdict.summary


def test_answer_then_take_is_unknown_when_answer_sequences_ran_but_recorded_no_call() -> None:
    h = H()
    h.call("schedule", workflow="probe/u0/1/answer")
    h.call("take", visibility=5.0, res={"workflow": "probe/u0/1/answer", "receipt": "r1"})
    verdict = run("answer-then-take", h)
    assert verdict.valid == "unknown", verdict.summary


def test_answer_then_take_says_there_was_nothing_to_judge_without_answer_sequences() -> None:
    h = H()
    h.call("take", visibility=5.0, res={"workflow": WF, "receipt": "r1"})
    verdict = run("answer-then-take", h)
    assert verdict.valid is True and "nothing to judge" in verdict.summary, verdict.summary
