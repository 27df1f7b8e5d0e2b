"""The reference model (the model test's oracle) on the wakeup rule it must share with every store:
a wakeup that arrives after a take stands against that take's answer, even when it left the queued
time alone because the delivery's visibility had already run out (the case the model once missed,
found by the model test on the third-party example store, which was right)."""

from __future__ import annotations

from datetime import timedelta

from without_durability.testing.reference import Reference

U = timedelta(seconds=1)


def test_a_wakeup_after_the_visibility_ran_out_stands_against_the_stale_answer() -> None:
    ref = Reference()
    ref.schedule("w0")
    receipt = ref.take("w0", 1.5 * U)
    ref.advance(2 * U)  # the delivery's visibility ran out: w0 is visible again, its time unchanged
    ref.schedule("w0")  # a wakeup: it keeps the earlier time, and it must stand
    ref.wake_at("w0", receipt, None)  # the first taker answers "done" late
    assert ref.visible() == ["w0"]


def test_an_answer_with_no_wakeup_since_acts() -> None:
    ref = Reference()
    ref.schedule("w0")
    receipt = ref.take("w0", 1.5 * U)
    ref.advance(2 * U)
    ref.wake_at("w0", receipt, None)
    assert ref.visible() == []
    ref.schedule("w1")
    receipt = ref.take("w1", 1.5 * U)
    ref.wake_at("w1", receipt, ref.now + U)
    assert ref.visible() == [] and ref.queue["w1"] == ref.now + U
