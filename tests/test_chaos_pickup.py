"""The pickup checker on hand-made histories: it says no on a lost wakeup (a take found nothing
while a workflow was due and unheld), yes on healthy runs, and judges nothing where the wait could
be capacity (a busy fleet) or a fault's doing."""

from __future__ import annotations

from typing import Any

from test_chaos_queue_checks import WF, H
from wd_chaos import checks
from wd_chaos.checks.pickup import MARGIN_S, fault_windows

IDLE = "w2"


def run(h: H, final: dict[str, Any] | None = None) -> checks.Verdict:
    return checks.run_checker(
        "pickup", checks.checkers()["pickup"], h.lines, checks.core.FinalState.from_json(final or {})
    )


def idle_polls(h: H, seconds: float, who: str = IDLE, poll: float = 0.05) -> None:
    """An idle worker's takes, each finding nothing, one poll interval apart, for ``seconds``."""
    stop = h.t + int(seconds * 1e9)
    while h.t < stop:
        h.take(None, who, wf=None)
        h.wait(poll)


def dead_wakeup() -> H:
    """A schedule completes; the idle worker's takes keep finding nothing for 3 s; then one gets it."""
    h = H()
    idle_polls(h, 0.5)
    h.call("schedule", "writer", workflow=WF, at=None)
    idle_polls(h, 3.0)
    h.take("r1", IDLE)
    return h


def test_a_dead_wakeup_is_a_lost_delivery_picked_up_late() -> None:
    verdict = run(dead_wakeup())
    assert verdict.valid is False, verdict.summary
    assert "1 due deliveries hidden" in verdict.summary and "picked up late" in verdict.summary
    whys = [str(e.get("why")) for e in verdict.evidence]
    assert whys[0].startswith("a wakeup: due at"), whys
    assert any(w.startswith("found nothing while 'wf-1' had been due") for w in whys), whys
    assert whys[-1].startswith("picked up") and "past the bound of 550 ms" in whys[-1], whys


def test_a_take_that_finds_nothing_while_due_fails_even_when_it_is_picked_up_fast() -> None:
    """One empty take 150 ms after the wakeup, then the pickup at 200 ms: within the bound, yet the
    empty take saw nothing while the workflow was due and nobody held it."""
    h = H()
    h.call("schedule", "writer", workflow=WF, at=None)
    h.wait(0.15)
    h.take(None, IDLE, wf=None)
    h.wait(0.04)
    h.take("r1", "w1")
    verdict = run(h)
    assert verdict.valid is False, verdict.summary
    assert "late" not in verdict.summary
    assert [e.get("got_receipt") for e in verdict.evidence if e.get("f") == "take"] == [None, "r1"]


def test_a_never_taken_wakeup_with_a_take_finding_nothing_after_it_is_lost() -> None:
    h = H()
    h.call("schedule", "writer", workflow=WF, at=None)
    idle_polls(h, 1.0)
    verdict = run(h)
    assert verdict.valid is False, verdict.summary
    assert verdict.evidence[-1] == {"workflow": WF, "why": "never taken again"}


def healthy(idle: bool = True) -> H:
    h = H()
    for n in range(5):
        if idle:
            idle_polls(h, 0.3)
        h.call("schedule", "writer", workflow=WF, at=None)
        h.wait(0.02)
        h.take(f"r{n}", "w1")
        h.answer(f"r{n}", None, "w1")
    if idle:
        idle_polls(h, 0.3)
    return h


def test_a_healthy_run_is_valid_with_its_figures() -> None:
    verdict = run(healthy(), {"poll_interval": 0.05})
    assert verdict.valid is True, verdict.summary
    assert verdict.counts["judged"] == 5 and verdict.counts["lost"] == 0, verdict.counts
    assert verdict.counts["p50_ms"] == 20 and verdict.counts["max_ms"] == 20, verdict.counts
    assert verdict.counts["bound_ms"] == round((0.05 + MARGIN_S) * 1000)
    assert "p99 20 ms" in verdict.summary


def test_the_bound_follows_the_runs_poll_interval() -> None:
    assert run(healthy(), {"poll_interval": 2.0}).counts["bound_ms"] == 2500


def test_a_take_running_beside_the_pickup_found_nothing_rightly() -> None:
    """The idle worker's take began after the workflow was due but was still running when the
    other worker's take began: the other may have taken it first."""
    h = H()
    h.call("schedule", "writer", workflow=WF, at=None)
    h.wait(0.2)
    h.call("take", IDLE, outcome=None, visibility=5.0)  # invoked, completes below
    empty = h.lines[-1]
    h.take("r1", "w1")
    h.lines.append({**empty, "type": "complete", "outcome": "ok", "mono": h.t, "workflow": None})
    verdict = run(h)
    assert verdict.valid is True and verdict.counts["judged"] == 1, verdict.summary


def test_a_late_pickup_with_only_a_take_beside_it_finding_nothing_is_not_judged() -> None:
    """Due for 3 s before any worker took at all, then two takes at once: one gets it, the other
    finds nothing beside it. No worker polled through the wait, so it says nothing of the queue."""
    h = H()
    h.call("schedule", "writer", workflow=WF, at=None)
    h.wait(3.0)
    h.call("take", IDLE, outcome=None, visibility=5.0)
    empty = h.lines[-1]
    h.take("r1", "w1")
    h.lines.append({**empty, "type": "complete", "outcome": "ok", "mono": h.t, "workflow": None})
    verdict = run(h)
    assert verdict.valid is True and verdict.counts["judged"] == 0, verdict.summary


def test_a_busy_fleet_is_not_judged() -> None:
    """No worker found nothing while the workflow waited 3 s: the fleet was busy, not the queue
    at fault."""
    h = H()
    h.call("schedule", "writer", workflow=WF, at=None)
    h.wait(3.0)
    h.take("r1", "w1")
    h.answer("r1", None, "w1")
    verdict = run(h)
    assert verdict.valid is True, verdict.summary
    assert verdict.counts["judged"] == 0 and "not judged" in verdict.summary
    assert verdict.counts["not judged: late with no idle worker (a busy fleet)"] == 1


def test_a_fault_window_excuses_a_take_that_found_nothing() -> None:
    """The dead-wakeup history with a fault active through the wait (a stall, started before the
    schedule and stopped after the pickup; or a start with no stop, until the heal) is not judged."""
    h = dead_wakeup()
    base = {"type": "fault", "process": "controller", "pid": 1, "fault": "stall", "id": "stall-0"}
    start = {**base, "phase": "start", "mono": 1}
    stop = {**base, "phase": "stop", "mono": h.t + 1}
    for lines in ([start, *h.lines, stop], [start, *h.lines]):
        faulted = H()
        faulted.lines = lines
        verdict = run(faulted)
        assert verdict.valid is True and verdict.counts["judged"] == 0, verdict.summary
        assert verdict.counts["not judged: a fault or clock step while it waited"] == 1
    heal = {"type": "fault", "fault": "heal", "phase": "start", "mono": 2, "process": "controller", "pid": 1}
    healed = H()
    healed.lines = [start, heal, *h.lines]  # healed before the schedule: judged again
    assert run(healed).valid is False


def test_fault_windows_pair_starts_and_stops_and_a_heal_ends_the_rest() -> None:
    line = {"type": "fault", "process": "controller", "pid": 1}
    ops = [
        {**line, "fault": "stall", "id": "a", "phase": "start", "mono": 10},
        {**line, "fault": "wall-step", "id": "b", "phase": "start", "mono": 20},
        {**line, "fault": "stall", "id": "a", "phase": "stop", "mono": 30},
        {**line, "fault": "heal", "phase": "start", "mono": 40},
        {**line, "fault": "kill", "id": "c", "phase": "start", "mono": 50},
    ]
    got = fault_windows(ops)
    assert (10, 30) in got and (20, 40) in got and (50, float("inf")) in got, got
    # a worker killed itself at a failpoint (its own line); the restart names only its target
    killed = {
        **line,
        "fault": "kill",
        "id": "after-claim.kill-0",
        "phase": "start",
        "process": "worker-1",
        "mono": 60,
    }
    restarted = {**line, "fault": "kill", "phase": "stop", "target": "worker-1", "mono": 70}
    assert fault_windows([killed, restarted]) == [(60, 70)]


def test_a_wakeup_while_held_is_due_only_once_the_holder_answers() -> None:
    """w1 holds the workflow; a schedule lands; the idle worker finds nothing (rightly: it is
    held) until w1 answers; then it is taken at once."""
    h = H()
    h.take("r1", "w1")
    h.wait(0.05)
    h.call("schedule", "writer", workflow=WF, at=None)
    idle_polls(h, 1.0)
    h.answer("r1", "2026-01-01T00:00:00+00:00", "w1")
    h.wait(0.02)
    h.take("r2", IDLE)
    verdict = run(h)
    assert verdict.valid is True, verdict.summary
    assert verdict.counts["judged"] == 1 and verdict.counts["max_ms"] == 20, verdict.counts
    # ... while a held queue that still hid it after the answer is a lost wakeup
    h = H()
    h.take("r1", "w1")
    h.wait(0.05)
    h.call("schedule", "writer", workflow=WF, at=None)
    h.wait(0.1)
    h.answer("r1", "2026-01-01T00:00:00+00:00", "w1")
    idle_polls(h, 1.0)
    h.take("r2", IDLE)
    assert run(h).valid is False


def test_a_cancel_in_the_wait_is_not_judged() -> None:
    h = H()
    h.call("schedule", "writer", workflow=WF, at=None)
    h.call("cancel", "writer", workflow=WF)
    idle_polls(h, 1.0)
    verdict = run(h)
    assert verdict.valid is True and verdict.counts["judged"] == 0, verdict.summary


def test_a_schedule_at_a_time_is_due_then_where_the_store_runs_on_this_machines_clock() -> None:
    """A schedule for 1 s ahead: takes finding nothing before then are right; one after it, not.
    On a store with a clock of its own the time cannot be placed, so it is not judged."""

    def history(found_after: bool) -> H:
        h = H()
        h.n += 1
        base = {"op": f"writer:1:{h.n}", "f": "schedule", "process": "writer", "pid": 7}
        at = "2026-01-01T00:00:01+00:00"
        h.lines.append(
            {
                "type": "invoke",
                "mono": 0,
                "wall": "2026-01-01T00:00:00+00:00",
                **base,
                "workflow": WF,
                "at": at,
            }
        )
        h.lines.append(
            {
                "type": "complete",
                "outcome": "ok",
                "mono": 10_000_000,
                "wall": "2026-01-01T00:00:00.010000+00:00",
                **base,
            }
        )
        h.t = 10_000_000
        idle_polls(h, 0.9)
        if found_after:
            h.wait(0.3)
            h.take(None, IDLE, wf=None)
            h.wait(0.01)
        h.take("r1", "w1")
        return h

    local = {"store_clock": "local"}
    verdict = run(history(False), local)
    assert verdict.valid is True and verdict.counts["judged"] == 1, verdict.summary
    assert run(history(True), local).valid is False
    remote = run(history(True), {"store_clock": "remote"})
    assert remote.valid is True and remote.counts["judged"] == 0, remote.summary


def test_summary_and_report_carry_the_figures() -> None:
    """``summary.json``'s ``pickup`` is the verdict's counts; the report plots the pickups (and
    draws nothing for a run with no due delivery)."""
    from wd_chaos.analyze import pickup_of
    from wd_chaos.report import pickup_plot

    final = checks.core.FinalState.from_json({"poll_interval": 0.05})
    verdict = run(healthy(), {"poll_interval": 0.05})
    assert pickup_of([verdict]) == verdict.counts and pickup_of([]) == {}
    assert pickup_plot(healthy().lines, final)
    assert pickup_plot(H().lines, final) == ""


def test_an_answer_after_another_with_its_receipt_decides_nothing() -> None:
    """sim lease-stall seed 119 (sqlite): the wire handed one delivery to two workers; the copy's
    holder answered "retry at 1.5 s" first, so the real holder's later "retry at 1.0 s" found the
    delivery already answered. Empty takes between 1.0 and 1.5 s are right, not a lost wakeup."""
    from datetime import datetime, timedelta

    start = datetime(2026, 1, 1)

    def wall(ns: int) -> str:
        return (start + timedelta(microseconds=ns // 1000)).isoformat() + "+00:00"

    def answer(h: H, who: str, at_s: float) -> None:
        h.n += 1
        base = {"op": f"{who}:1:{h.n}", "f": "wake_at", "process": who, "pid": hash(who) % 1000}
        at = wall(int(at_s * 1e9))
        invoke = {"type": "invoke", "mono": h.t, "wall": wall(h.t), **base, "workflow": WF, "at": at, "receipt": "r1"}
        h.lines.append(invoke)
        h.wait(0.01)
        h.lines.append({"type": "complete", "outcome": "ok", "mono": h.t, "wall": wall(h.t), **base})

    h = H()
    h.take("r1", "w1")
    h.take("r1", "w3")  # the copy
    answer(h, "w3", 1.5)
    h.wait(0.45)
    answer(h, "w1", 1.0)
    idle_polls(h, 0.95)
    h.wait(0.05)
    h.take("r2", IDLE)
    verdict = run(h, {"store_clock": "local", "redelivers": True})
    assert verdict.valid is True, (verdict.summary, verdict.evidence)
