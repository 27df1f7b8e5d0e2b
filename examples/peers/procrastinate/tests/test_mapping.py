"""The kit's own mappings (README, "Where procrastinate's semantics differ"), each against the
store the run selects (``pytest --wd-store procrastinate``), in procrastinate's own terms."""

from __future__ import annotations

import pytest

from without_durability.testing.conformance import unit
from without_durability.testing.harness import StoreUnderTest


@pytest.mark.parametrize("again", ["now", "later", "done"])
@pytest.mark.parametrize("first", ["now", "later", "done"])
async def test_a_repeated_answer_after_a_cancel_raises_nothing(
    wd_store: StoreUnderTest[object], first: str, again: str
) -> None:
    """README point 7: a cancel while held marks the running job ``abort_requested``; the holder's
    retry ends it ``failed`` and leaves the mark. procrastinate's ``retry_job_v2`` retries a
    ``failed`` job, so a second "again" from the same delivery would put the aborted job back in
    ``todo``, and the ``check_not_todo_abort_requested`` constraint refuses it (CheckViolation).
    The protocol's answer may be repeated and, once cancelled, changes nothing and raises
    nothing: the kit reads that refusal as nothing to act on."""
    sched, u = wd_store.scheduler, unit(wd_store)
    w = f"repeat-after-cancel-{first}-{again}"
    await sched.schedule(w)
    got = await sched.take(u)
    assert got is not None and got.workflow == w
    await sched.cancel(w)

    async def answer(kind: str) -> None:
        now = await sched.now()
        await sched.wake_at(got, None if kind == "done" else now if kind == "now" else now + u)

    await answer(first)
    await answer(again)  # the same delivery answers again: raises nothing
    await wd_store.clock.advance(2.5 * u)
    assert await sched.take(u) is None, "a repeated answer reinstated a cancelled workflow"
