"""The dead-wakeup checker (``wakeup-pickup``) on hand-made histories: it says no when a wakeup
waited past the wakeup bound while a worker idled on its wakeup (pickup fell back to the poll), yes
when the idle worker was woken at once, and judges nothing inside a wakeup-loss and its re-subscribe
window; and ``pickup`` lets a take that ran beside another wakeup of the workflow find nothing."""

from __future__ import annotations

from typing import Any

from test_chaos_queue_checks import WF, H
from wd_chaos import checks

FINAL = {"wakeup": {"bound": 1.0, "resubscribe": 7.0}}
IDLE = "w2"


def run(h: H, name: str = "wakeup-pickup", final: dict[str, Any] | None = None) -> checks.Verdict:
    return checks.run_checker(
        name, checks.checkers()[name], h.lines, checks.core.FinalState.from_json(FINAL if final is None else final)
    )


def idle_then_wakeup(pickup_after: float) -> H:
    """The idle worker found nothing; a wakeup lands 0.5 s later; its next take, ``pickup_after``
    seconds after the wakeup, takes the workflow."""
    h = H()
    h.take(None, IDLE, wf=None)
    h.wait(0.5)
    h.call("schedule", "writer", workflow=WF, at=None)
    h.wait(pickup_after)
    h.take("r1", IDLE)
    return h


def loss(h: H, start: float, stop: float) -> None:
    base = {"type": "fault", "process": "controller", "pid": 1, "fault": "wakeup-loss", "id": "wakeup-loss-0"}
    h.lines += [
        {**base, "phase": "start", "mono": int(start * 1e9), "idle": [IDLE]},
        {**base, "phase": "stop", "mono": int(stop * 1e9)},
    ]
    h.lines.sort(key=lambda o: o["mono"])


def test_a_wakeup_picked_up_at_the_poll_beside_an_idle_worker_fails() -> None:
    verdict = run(idle_then_wakeup(4.5))
    assert verdict.valid is False, verdict.summary
    whys = [str(e.get("why")) for e in verdict.evidence]
    assert whys[1].startswith("found nothing: pid") and "idle on its wakeup" in whys[1], whys
    assert "past the wakeup bound of 1000 ms" in whys[-1], whys


def test_a_woken_idle_worker_passes() -> None:
    verdict = run(idle_then_wakeup(0.02))
    assert verdict.valid is True, verdict.summary
    assert verdict.counts["prompt"] == 1 and verdict.counts["late"] == 0


def test_a_wakeup_loss_and_its_resubscribe_window_are_not_judged() -> None:
    h = idle_then_wakeup(4.5)  # the wakeup lands at 0.51 s, picked up at 5 s: inside the window
    loss(h, 0.2, 1.0)
    verdict = run(h)
    assert verdict.valid is True, verdict.summary
    assert verdict.counts["not judged: a fault (or a wakeup's re-subscribe window) while it waited"] == 1
    # after stop + resubscribe (8 s), a pickup at the poll beside an idle worker is judged again
    h.wait(4.0)
    h.take(None, IDLE, wf=None)
    h.wait(0.5)
    h.call("schedule", "writer", workflow="wf-2", at=None)
    h.wait(4.5)
    h.take("r2", IDLE, wf="wf-2")
    assert run(h).valid is False


def test_a_run_without_wakeups_is_not_judged() -> None:
    verdict = run(idle_then_wakeup(4.5), final={})
    assert verdict.valid is checks.core.UNKNOWN, verdict.summary


def test_pickup_lets_a_take_beside_another_wakeup_of_the_workflow_find_nothing() -> None:
    """A deliver's write holds the workflow's queue entry until it commits: a take that skips
    locked entries (SKIP LOCKED) rightly finds nothing beside it, and the wakeup brings it back."""
    h = H()
    h.call("schedule", "writer", workflow=WF, at=None)  # due from here
    h.wait(0.2)
    h.call("append", "writer2", outcome=None, workflow=WF, via="deliver")  # its write is in flight...
    h.wait(0.01)
    h.take(None, IDLE, wf=None)  # ...as this take finds nothing
    h.wait(0.01)
    base = {"op": f"writer2:1:{h.n - 1}", "f": "append", "process": "writer2", "pid": hash("writer2") % 1000}
    h.lines.append({"type": "complete", "outcome": "ok", "mono": h.t, **base})
    h.take("r1", IDLE)
    verdict = run(h, "pickup", final={})
    assert verdict.valid is True, verdict.summary
    # the same empty take with no write beside it is a lost wakeup
    h.lines = [o for o in h.lines if o.get("process") != "writer2"]
    assert run(h, "pickup", final={}).valid is False
