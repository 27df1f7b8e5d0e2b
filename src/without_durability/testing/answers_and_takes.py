"""Conformance for the optional ``AnswersAndTakes`` capability: what ``answer_and_take`` promises,
through the public calls only, for any store whose scheduler offers it (the others skip).

The conformance suite re-exports these tests, so a store that offers the capability runs them with
``from without_durability.testing.conformance import *`` and no line of its own. Time works as in the
suite: ``wd_store.clock.advance`` moves a store's own clock, or waits on a server's.
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta
from typing import Any

import pytest

from .._values import Delivery
from ..protocols import AnswersAndTakes
from .harness import StoreUnderTest

Store = StoreUnderTest[Any]
LONG = timedelta(hours=1)
_ids = itertools.count()


def _unit(store: Store) -> timedelta:
    return timedelta(seconds=0.5) if store.clock.real else timedelta(seconds=10)


def _wf(label: str) -> str:
    return f"answers-{label}-{next(_ids)}"


def answering(store: Store) -> Any:
    """The store's scheduler if it offers ``answer_and_take``; else the test is skipped."""
    sched = store.scheduler
    if not isinstance(sched, AnswersAndTakes):
        pytest.skip("the store's scheduler does not offer answer_and_take (an optional capability)")
    return sched


async def _drain(sched: Any, visibility: timedelta) -> list[str]:
    """Every workflow a run of takes hands out now, each hidden for ``visibility``."""
    out: list[str] = []
    for _ in range(100):  # bounded: a store that never hides would loop for ever
        d = await sched.take(visibility)
        if d is None:
            return out
        out.append(d.workflow)
    raise AssertionError(f"take kept handing out deliveries: {out[:10]}...")


async def test_answer_and_take_removes_the_answer_and_hands_out_the_next(wd_store: Store) -> None:
    sched, u = answering(wd_store), _unit(wd_store)
    a, b = _wf("next-a"), _wf("next-b")
    await sched.schedule(a)
    await sched.schedule(b)
    first = await sched.take(u)  # either: take promises a due delivery, not an order
    assert first is not None and first.workflow in (a, b), f"take: got {first!r}"
    other = b if first.workflow == a else a
    second = await sched.answer_and_take(first, None, u)
    assert second is not None and second.workflow == other, f"expected {other!r} next, got {second!r}"
    assert await sched.answer_and_take(second, None, u) is None, "nothing else was due"
    await wd_store.clock.advance(1.5 * u)  # past every visibility: only what was not removed shows
    assert await _drain(sched, LONG) == [], "an answered delivery stayed queued"


async def test_answer_and_take_never_hands_back_its_own_workflow(wd_store: Store) -> None:
    sched, u = answering(wd_store), _unit(wd_store)
    w = _wf("own")
    await sched.schedule(w)
    d = await sched.take(LONG)
    assert d is not None and d.workflow == w
    past = await wd_store.now() - timedelta(seconds=5)
    assert await sched.answer_and_take(d, past, u) is None, "it handed back the workflow it answered"
    again = await sched.take(u)
    assert again is not None and again.workflow == w, "a due sleep answer is left for the next take"


async def test_answer_and_take_acts_only_while_its_receipt_is_current(wd_store: Store) -> None:
    sched, u = answering(wd_store), _unit(wd_store)
    woken, cancelled, plain = _wf("woken"), _wf("cancelled"), _wf("plain")
    for name in (woken, cancelled, plain):
        await sched.schedule(name)
    taken = {d.workflow: d for d in [await sched.take(LONG) for _ in range(3)] if d is not None}
    assert set(taken) == {woken, cancelled, plain}
    await sched.schedule(woken)  # a wakeup since the take: it stands
    await sched.cancel(cancelled)  # cancelled since the take: not reinstated
    later = await wd_store.now() + 2 * u
    # the woken workflow is due again and is the one answered: its sleep answer must not move it,
    # and this call must not hand it back
    assert await sched.answer_and_take(taken[woken], later, u) is None
    got = await sched.answer_and_take(taken[cancelled], later, u)
    assert got is not None and got.workflow == woken, f"the wakeup since the take was lost: {got!r}"
    await wd_store.clock.advance(2.5 * u)  # past the sleep answers and the chained take's visibility
    due = await _drain(sched, LONG)
    assert cancelled not in due, "an answer reinstated a workflow cancelled since its take"
    assert due == [woken], f"expected only {woken!r} due again, got {due}"


async def test_a_stale_answer_and_take_leaves_the_newer_delivery_alone(wd_store: Store) -> None:
    sched, u = answering(wd_store), _unit(wd_store)
    w = _wf("stale")
    await sched.schedule(w)
    old = await sched.take(u)
    assert old is not None
    await wd_store.clock.advance(1.5 * u)
    newer: Delivery | None = await sched.take(2 * u)
    assert newer is not None and newer.workflow == w, "an unanswered delivery did not reappear"
    assert await sched.answer_and_take(old, await wd_store.now(), u) is None
    assert await sched.answer_and_take(old, None, u) is None
    assert await sched.take(LONG) is None, "a stale answer moved the newer delivery to now"
    await wd_store.clock.advance(2.5 * u)  # past the newer take's visibility
    again = await sched.take(u)
    assert again is not None and again.workflow == w, "a stale finish removed the newer delivery"


async def test_concurrent_answer_and_take_chains_hand_out_every_workflow_once(wd_store: Store) -> None:
    sched = answering(wd_store)
    names = [_wf(f"chain-{i:02d}") for i in range(40)]
    for n in names:
        await sched.schedule(n)
    got: list[str] = []

    async def chain() -> None:
        d = await sched.take(LONG)
        for _ in range(2 * len(names)):  # bounded, as the suite's take storm is
            if d is None:
                return
            got.append(d.workflow)
            await asyncio.sleep(0)  # let the chains interleave
            d = await sched.answer_and_take(d, None, LONG)

    await asyncio.gather(*(chain() for _ in range(6)))
    assert sorted(got) == sorted(names), (
        f"each workflow once: {len(got)} handed out, {len(set(got))} distinct of {len(names)}"
    )


__all__ = [
    "test_answer_and_take_removes_the_answer_and_hands_out_the_next",
    "test_answer_and_take_never_hands_back_its_own_workflow",
    "test_answer_and_take_acts_only_while_its_receipt_is_current",
    "test_a_stale_answer_and_take_leaves_the_newer_delivery_alone",
    "test_concurrent_answer_and_take_chains_hand_out_every_workflow_once",
]
