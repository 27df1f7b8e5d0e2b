"""The core scheduler checkers (take-exclusive, receipts-distinct, stale-answer, wakeup-stands, queue-bounded) on
hand-made histories: each says no on a history shaped like its bug, and yes on the correct one."""

from __future__ import annotations

from typing import Any

import pytest

from wd_chaos import checks
from wd_chaos.checks import coverage as _coverage  # noqa: F401 - checks.coverage below
from wd_chaos.history import Op

WF = "wf-1"
S = 1_000_000_000  # a second of the monotonic clock


class H:
    """A history whose clock moves only when told; ``call`` writes an invoke and its complete."""

    def __init__(self) -> None:
        self.lines: list[Op] = []
        self.t = 0
        self.n = 0

    def wait(self, seconds: float) -> None:
        self.t += int(seconds * S)

    def call(self, f: str, who: str = "w1", outcome: str | None = "ok", res: Any = None, **inv: Any) -> None:
        self.n += 1
        base = {"op": f"{who}:1:{self.n}", "f": f, "process": who, "pid": hash(who) % 1000}
        self.lines.append({"type": "invoke", "mono": self.t, **base, **inv})
        self.wait(0.01)
        if outcome is not None:
            self.lines.append({"type": "complete", "outcome": outcome, "mono": self.t, **base, **(res or {})})

    def take(
        self, receipt: str | None, who: str = "w1", visibility: float = 5.0, wf: str | None = WF
    ) -> None:
        self.call("take", who, res={"workflow": wf, "receipt": receipt}, visibility=visibility)

    def answer(self, receipt: str, at: str | None, who: str = "w1") -> None:
        self.call("wake_at", who, workflow=WF, at=at, receipt=receipt)


def run(name: str, h: H, final: dict[str, Any] | None = None) -> checks.Verdict:
    return checks.run_checker(
        name, checks.checkers()[name], h.lines, checks.core.FinalState.from_json(final or {})
    )


def test_the_scheduler_checkers_are_core() -> None:
    assert set(checks.CORE) == {
        "take-exclusive", "receipts-distinct", "stale-answer", "wakeup-stands", "queue-bounded", "pickup",
    }  # fmt: skip
    assert checks.with_core(["fencing", "stale-answer"])[:2] == ["fencing", "stale-answer"]
    assert set(checks.with_core(["fencing"])) == {"fencing", *checks.CORE}


# -- take-exclusive --------------------------------------------------------------------------------


def retaken(between: str | None) -> H:
    h = H()
    h.take("r1", "w1")
    h.wait(0.2)
    if between == "own":
        h.answer("r1", "2026-01-01T00:00:00+00:00", "w1")
    elif between == "stale":
        h.answer("r0", "2026-01-01T00:00:00+00:00", "w9")
    elif between == "wakeup":
        h.call("schedule", "writer", workflow=WF, at=None)
    h.take("r2", "w2")
    return h


@pytest.mark.parametrize("between", ["own", "wakeup"])
def test_take_exclusive_passes_a_retake_after_the_holders_answer_or_a_wakeup(between: str) -> None:
    assert run("take-exclusive", retaken(between)).valid is True


@pytest.mark.parametrize("between", [None, "stale"])
def test_take_exclusive_fails_a_retake_while_hidden_a_stale_answer_excusing_nothing(
    between: str | None,
) -> None:
    verdict = run("take-exclusive", retaken(between))
    assert verdict.valid is False, verdict.summary
    assert [e.get("got_receipt") for e in verdict.evidence] == ["r1", "r2"]


def test_take_exclusive_fails_two_takes_with_one_receipt_unless_the_transport_redelivers() -> None:
    h = H()
    h.take("r1", "w1")
    h.wait(6)  # past the visibility: only the equal receipt is wrong
    h.take("r1", "w2", visibility=5.0)
    h.lines[-2]["mono"] = h.lines[-4]["mono"] + int(0.5 * S)  # ... taken 0.5 s after the first
    h.lines[-1]["mono"] = h.lines[-2]["mono"] + int(0.01 * S)
    assert run("take-exclusive", h).valid is False
    assert run("take-exclusive", h, {"redelivers": True}).valid is True


def test_take_exclusive_drops_the_wires_copy_of_a_take_where_the_transport_redelivers() -> None:
    """The simulator's wire hands a take's reply out twice: the copy (its receipt seen before) is
    not a take of the store's, so it hides nothing. w1 takes and answers "retry soon"; the wire
    repeats w1's take; w2 takes once the answer's time came. Judged from the copy, w2's take would
    fall inside a visibility that never was."""
    h = H()
    h.take("r1", "w1", visibility=5.0)
    h.answer("r1", "2026-01-01T00:00:00+00:00", "w1")
    h.take("r1", "w1", visibility=5.0)  # the wire's copy of the first reply
    h.wait(0.5)
    h.take("r2", "w2", visibility=5.0)
    assert run("take-exclusive", h, {"redelivers": True}).valid is True
    assert run("take-exclusive", h).valid is False  # without a wire that redelivers, two takes of one receipt


def test_take_exclusive_excuses_a_step_the_scenario_made_and_cannot_judge_one_of_the_machine() -> None:
    h = retaken(None)
    mono = h.lines[1]["mono"] + 1
    step = {"type": "fault", "fault": "x-step", "phase": "start", "seconds": 30.0, "store_clock_step": True}
    stepped = H()
    stepped.lines = [*h.lines[:2], {**step, "process": "nemesis", "pid": 1, "mono": mono, "wall": "x"}, *h.lines[2:]]
    verdict = run("take-exclusive", stepped, {"store_clock": "local"})
    assert verdict.valid is True and verdict.counts["after an injected clock step"] == 1, verdict.summary
    machine = {"seconds": 30.0, "wall": "x", "between": [mono - 1, mono]}
    verdict = run("take-exclusive", h, {"store_clock": "local", "wall_clock_steps": [machine]})
    assert verdict.valid == checks.UNKNOWN, verdict.summary


def test_take_exclusive_orders_overlapping_takes_either_way() -> None:
    """w0's take is invoked first and completes last; a wakeup lands during its call, before w2's
    take begins. The two may have run w0, wakeup, w2: no proof of a double delivery. Without the
    wakeup, the two still hold the workflow at once."""

    def history(wakeup: bool) -> H:
        h = H()
        slow = {"type": "invoke", "mono": 0, "op": "w0:1:1", "f": "take", "process": "w0", "pid": 1, "visibility": 5.0}
        h.lines.append(slow)
        h.wait(0.01)
        if wakeup:
            h.call("schedule", "writer", workflow=WF, at=None)
        h.take("r2", "w2")
        h.wait(0.01)
        h.lines.append({"type": "complete", "mono": h.t, "op": "w0:1:1", "f": "take", "outcome": "ok",
                        "process": "w0", "pid": 1, "workflow": WF, "receipt": "r1"})  # fmt: skip
        return h

    assert run("take-exclusive", history(True)).valid is True
    assert run("take-exclusive", history(False)).valid is False


def test_take_exclusive_excuses_a_fast_failover_takeover_only_after_its_holder_was_struck() -> None:
    """With fast failover a re-take while hidden is the design once a fault struck the first taker
    (its pid) or ended the server's sessions inside the window; with no such fault, or with fast
    failover off, it is still a double delivery."""
    h = retaken(None)
    pid = h.lines[0]["pid"]
    mono = h.lines[1]["mono"] + 1
    kill = {"type": "fault", "fault": "kill", "phase": "start", "process": "controller", "pid": 1, "mono": mono}
    struck = H()
    struck.lines = [*h.lines[:2], {**kill, "target_pid": pid}, *h.lines[2:]]
    verdict = run("take-exclusive", struck, {"fast_failover": True})
    assert verdict.valid is True and "taken over from a faulted holder" in verdict.summary, verdict.summary
    assert run("take-exclusive", struck, {"fast_failover": False}).valid is False
    other = H()
    other.lines = [*h.lines[:2], {**kill, "target_pid": pid + 1}, *h.lines[2:]]
    assert run("take-exclusive", other, {"fast_failover": True}).valid is False
    ended = H()
    restart = {**kill, "fault": "restart", "target_pid": 99999, "ends_sessions": True}
    ended.lines = [*h.lines[:2], restart, *h.lines[2:]]
    assert run("take-exclusive", ended, {"fast_failover": True}).valid is True
    assert run("take-exclusive", h, {"fast_failover": True}).valid is False


# -- stale-answer ----------------------------------------------------------------------------------


def stale(kind: str | None, then: str) -> H:
    """w1 takes (visibility 0.2 s), lets it run out; w2 takes again; w1 answers late with its old
    receipt (``kind``: at None, later, now); then ``then``: w3 takes at once (``retake``), or w2
    answers "retry later" and nobody takes it again (``answer``), or nothing."""
    h = H()
    h.take("r1", "w1", visibility=0.2)
    h.wait(0.3)
    h.take("r2", "w2", visibility=5.0)
    h.wait(0.1)
    at = {None: None, "later": "2026-01-01T00:01:00+00:00", "now": "2026-01-01T00:00:00+00:00"}[kind]
    if then == "answer-first":  # the newer holder answers before the stale answer comes
        h.answer("r2", "2026-01-01T00:02:00+00:00", "w2")
    h.answer("r1", at, "w1")
    if then == "retake":
        h.take("r3", "w3")
    elif then == "answer":
        h.answer("r2", "2026-01-01T00:02:00+00:00", "w2")
    return h


@pytest.mark.parametrize("kind", [None, "later", "now"])
def test_stale_answer_passes_a_stale_answer_that_acted_on_nothing(kind: str | None) -> None:
    verdict = run("stale-answer", stale(kind, "answer"), {"queue": {WF: 1}})
    assert verdict.valid is True, verdict.summary
    assert verdict.counts["stale_answers"] == 1


@pytest.mark.parametrize("kind", ["later", "now"])
def test_stale_answer_fails_a_stale_answer_that_requeued_a_held_workflow(kind: str) -> None:
    verdict = run("stale-answer", stale(kind, "retake"))
    assert verdict.valid is False, verdict.summary
    whys = [str(e.get("why")) for e in verdict.evidence]
    assert whys[2].startswith("a stale answer") and "re-queued" in whys[3], whys
    assert [e.get("process") for e in verdict.evidence] == ["w1", "w2", "w1", "w3"]


def test_stale_answer_excuses_a_fast_failover_takeover_after_the_newer_holder_was_struck() -> None:
    """CI10, kill-between on Postgres with fast failover: a restarted worker answered its dead
    predecessor's delivery late (stale, acting on nothing); then the newer holder killed itself at
    a failpoint and the reaping take handed the workflow on. That take is the takeover fast failover
    documents, not the stale answer's doing; without the fault, or with fast failover off, the same
    history is a re-queue."""
    h = stale("now", "retake")
    newer = next(o for o in h.lines if o.get("type") == "complete" and o.get("receipt") == "r2")
    kill = {"type": "fault", "fault": "kill", "phase": "start", "process": "w2", "pid": newer["pid"],
            "mono": newer["mono"] + 1}  # fmt: skip
    struck = H()
    struck.lines = sorted([*h.lines, kill], key=lambda o: o["mono"])
    assert run("stale-answer", struck, {"fast_failover": True}).valid is True
    assert run("stale-answer", struck, {"fast_failover": False}).valid is False
    assert run("stale-answer", h, {"fast_failover": True}).valid is False


def test_stale_answer_passes_the_transports_copy_of_the_newer_take_where_it_redelivers() -> None:
    """sim transact-stall seed 199 (memory): after a stale answer, the wire handed the newer take's
    delivery (its own receipt) to another caller. That is a copy of the newer take, not a re-queue;
    where the transport does not redeliver, the same history is a re-queue."""
    h = stale("now", "")
    h.take("r2", "w1")  # the newer holder's receipt, handed out again
    assert run("stale-answer", h, {"redelivers": True}).valid is True
    assert run("stale-answer", h).valid is False


@pytest.mark.parametrize("then", ["answer", "answer-first"])
def test_stale_answer_fails_a_stale_done_that_removed_the_newer_holders_delivery(then: str) -> None:
    verdict = run("stale-answer", stale(None, then), {"queue": {}})
    assert verdict.valid is False, verdict.summary
    assert "removed it" in str(verdict.evidence[-1]["why"])
    assert run("stale-answer", stale(None, then), {"queue": {WF: 1}}).valid is True


def test_stale_answer_judges_the_newer_holders_first_answer_not_a_repeat_of_it() -> None:
    """The newer holder answers "done" (the workflow leaves the queue); later a restarted worker
    answers that same receipt again, "retry at a time", and the stale answer comes too. The repeat
    finds its delivery answered, so the empty final queue is the store being right; a checker
    that took the repeat for the holder's answer would blame the stale one."""
    h = stale(None, "none")
    h.lines = h.lines[:-2]  # without the stale answer for now
    h.answer("r2", None, "w2")
    h.answer("r1", "2026-01-01T00:00:00+00:00", "w1")
    h.answer("r2", "2026-01-01T00:01:00+00:00", "w2")
    verdict = run("stale-answer", h, {"queue": {}})
    assert verdict.valid is True and verdict.counts["stale_answers"] == 1, verdict.summary


def test_stale_answer_does_not_judge_a_removal_where_the_queue_was_not_read() -> None:
    assert run("stale-answer", stale(None, "answer")).valid is True


# -- wakeup-stands ---------------------------------------------------------------------------------


def woken(answer_at: str | None, then: str, wakeup: str = "schedule") -> H:
    """w1 takes; a wakeup lands while it holds it; w1 answers ``answer_at``; then ``then``: w2
    takes it again (``retake``), a take finds nothing due (``empty``), or nothing."""
    h = H()
    h.take("r1", "w1")
    h.wait(0.1)
    if wakeup == "schedule":
        h.call("schedule", "writer", workflow=WF, at=None)
    elif wakeup == "arrive":
        h.call("supply", "writer", workflow=WF, key="approval-0", value={}, via="arrive", res={"won": True})
    else:
        h.call("append", "writer", workflow=WF, value={}, via="deliver", res={"key": "inbox/1"})
    h.wait(0.1)
    h.answer("r1", answer_at, "w1")
    h.wait(0.1)
    if then == "retake":
        h.take("r2", "w2")
    elif then == "empty":
        h.take(None, "w2", wf=None)
    return h


ANSWERS = [None, "2026-01-01T00:01:00+00:00", "2026-01-01T00:00:00+00:00"]


@pytest.mark.parametrize("answer_at", ANSWERS)
@pytest.mark.parametrize("wakeup", ["schedule", "arrive", "deliver"])
def test_wakeup_stands_passes_a_wakeup_taken_again(answer_at: str | None, wakeup: str) -> None:
    verdict = run("wakeup-stands", woken(answer_at, "retake", wakeup))
    assert verdict.valid is True, verdict.summary
    assert verdict.counts["wakeups_while_held"] == 1


@pytest.mark.parametrize("answer_at", ANSWERS)
def test_wakeup_stands_fails_a_wakeup_the_answer_removed(answer_at: str | None) -> None:
    verdict = run("wakeup-stands", woken(answer_at, "none"), {"queue": {}})
    assert verdict.valid is False, verdict.summary
    assert [e.get("why") for e in verdict.evidence][:3] == [
        "took it", "a wakeup while it was held", "the holder answered; the wakeup must stand",
    ]  # fmt: skip
    assert run("wakeup-stands", woken(answer_at, "none"), {"queue": {WF: 1}}).valid is True


def test_wakeup_stands_without_the_queue_needs_a_take_that_found_nothing() -> None:
    assert run("wakeup-stands", woken(None, "empty")).valid is False
    assert run("wakeup-stands", woken(None, "none")).valid == checks.UNKNOWN


def lost_then_rescued(blind: str | None) -> H:
    """w1 holds the workflow, a wakeup lands, w1 answers; a take by w3 (``blind``: its reply lost,
    outcome unknown; ``"ok-empty"``: it found nothing) runs after the wakeup; then w2's take finds
    nothing due, and w4 takes the workflow 6 s later (the shape of sim clock-step sqlite seed 34)."""
    h = woken(None, "none")
    if blind == "unknown":
        h.call("take", "w3", outcome="unknown", res={"error": "StoreUnavailable: reply lost"}, visibility=5.0)
    elif blind == "ok-empty":
        h.take(None, "w3", wf=None)
    h.wait(1.0)
    h.take(None, "w2", wf=None)
    h.wait(5.0)
    h.take("r2", "w4")
    return h


def test_wakeup_stands_excuses_an_empty_take_while_a_take_whose_reply_was_lost_may_hold_it() -> None:
    """A take whose reply was lost may have taken the wakeup and hidden the workflow for its
    visibility, unseen: an empty take inside that is no evidence of a lost wakeup. Without such a
    take (or with one that completed and found nothing), the same shape is a lost wakeup."""
    assert run("wakeup-stands", lost_then_rescued("unknown")).valid is True
    for shape in (None, "ok-empty"):
        verdict = run("wakeup-stands", lost_then_rescued(shape))
        assert verdict.valid is False, (shape, verdict.summary)
        assert "found nothing due afterwards: the wakeup was lost" in [e.get("why") for e in verdict.evidence]


# -- queue-bounded ---------------------------------------------------------------------------------


def test_queue_bounded_fails_a_second_entry_per_workflow() -> None:
    verdict = run("queue-bounded", H(), {"queue": {"a": 1, "b": 2}, "queue_entries_per_workflow": 1})
    assert verdict.valid is False
    assert verdict.evidence == [
        {"workflow": "b", "entries": 2, "why": "more than one queue entry at the end"}
    ]


def test_queue_bounded_passes_one_entry_each_and_reports_a_declared_many() -> None:
    assert run("queue-bounded", H(), {"queue": {"a": 1, "b": 0}}).valid is True
    declared = run("queue-bounded", H(), {"queue": {"a": 5}, "queue_entries_per_workflow": 8})
    assert declared.valid is True and "reported, not judged" in declared.summary
    assert declared.counts["most_per_workflow"] == 5
    assert "not judged" in run("queue-bounded", H()).summary


# -- coverage windows ------------------------------------------------------------------------------


def hits(h: H, *names: str) -> dict[str, int]:
    return dict(checks.coverage.coverage(h.lines, names).counts)


def test_the_scheduler_windows_count_what_they_name() -> None:
    assert hits(stale("now", "answer"), "stale-answer-after-retake") == {"stale-answer-after-retake": 1}
    assert hits(retaken("own"), "stale-answer-after-retake") == {"stale-answer-after-retake": 0}
    assert hits(woken(None, "retake"), "wakeup-while-held", "schedule-while-held") == {
        "wakeup-while-held": 1, "schedule-while-held": 1,
    }  # fmt: skip
    assert hits(woken(None, "retake", "arrive"), "wakeup-while-held", "schedule-while-held") == {
        "wakeup-while-held": 1, "schedule-while-held": 0,
    }  # fmt: skip


def test_the_final_queue_speaks_only_for_the_runs_own_workflows() -> None:
    # a probe's or a careless client's workflow lives in a namespace the final read does not cover
    final = {"queue": {}, "expected_workflows": ["another"]}
    assert run("wakeup-stands", woken(None, "none"), final).valid == checks.UNKNOWN
    assert run("stale-answer", stale(None, "answer"), final).valid is True
    assert run("wakeup-stands", woken(None, "none"), {**final, "expected_workflows": [WF]}).valid is False


# -- receipts-distinct ------------------------------------------------------------------------------


def _retaken_at_the_same_instant(receipts: tuple[str, str]) -> H:
    """Take for 3 s; a wakeup a second later; a take for 2 s: both hid the workflow until the same
    instant. Then the first holder answers (late) and the second too."""
    h = H()
    h.call("schedule", "w0", workflow=WF)
    h.take(receipts[0], "w1", visibility=3.0)
    h.wait(1.0)
    h.call("schedule", "w0", workflow=WF)
    h.take(receipts[1], "w2", visibility=2.0)
    h.answer(receipts[0], None, "w1")
    h.answer(receipts[1], None, "w2")
    return h


def test_receipts_distinct_says_no_to_two_takes_handed_one_receipt() -> None:
    verdict = run("receipts-distinct", _retaken_at_the_same_instant(("R(t+3)", "R(t+3)")))
    assert verdict.valid is False and verdict.counts == {"takes": 2, "repeated": 1}, verdict
    assert [e.get("process") for e in verdict.evidence] == ["w1", "w2"]
    assert "same receipt" in verdict.evidence[1]["why"]
    # the checkers that match answers to takes by receipt cannot see it: both answers look current
    h = _retaken_at_the_same_instant(("R(t+3)", "R(t+3)"))
    assert run("stale-answer", h).valid is not False and run("take-exclusive", h).valid is not False


def test_receipts_distinct_says_yes_to_numbered_receipts_and_excuses_the_transports_copies() -> None:
    assert run("receipts-distinct", _retaken_at_the_same_instant(("R(t+3, 1)", "R(t+3, 2)"))).valid is True
    copied = _retaken_at_the_same_instant(("R(t+3)", "R(t+3)"))
    assert run("receipts-distinct", copied, {"redelivered_receipts": ["R(t+3)"]}).valid is True
    twice = _retaken_at_the_same_instant(("R(t+3)", "R(t+3)"))
    twice.take("R(t+3)", "w3")
    assert run("receipts-distinct", twice, {"redelivered_receipts": ["R(t+3)"]}).valid is False
    unrecorded = _retaken_at_the_same_instant(("R", "R"))
    unrecorded.lines = [{**o, "receipt": None} if o.get("receipt") == "R" else o for o in unrecorded.lines]
    assert run("receipts-distinct", unrecorded).counts["takes"] == 0
