"""Conformance tests for the workflow lifecycle (issue 14): what a pass may still do after a wait
or a fence, terminal states and the reserved ``wd/`` keys, retries with their count in the store.

Imported into ``conformance`` so a third-party store is held to these as to the rest. Each test
takes the ``wd_store`` fixture, a fresh ``StoreUnderTest``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from datetime import timedelta
from typing import Any

import pytest

from ..errors import Fenced, InvalidInput, InvalidKey, Swallowed
from ..lifecycle import FINISHED, RetryPolicy, error_key, failed_key, rearm, rearmed_key, status_of
from ..rules import lifecycle_writes
from ..run import Blocked, Run, resume
from ..worker import Worker
from .harness import StoreUnderTest

Store = StoreUnderTest[Any]
_ids = itertools.count()
LONG = timedelta(hours=1)


def _wf(label: str) -> str:
    return f"life-{label}-{next(_ids)}"


def unit(store: Store) -> timedelta:
    """The suite's time unit (as in ``conformance``): deadlines are whole units, checks half one off."""
    return timedelta(seconds=0.5) if store.clock.real else timedelta(seconds=10)


def _any(value: object) -> object:
    return value


# -- Run: nothing runs after a wait, nothing finishes after a fence ------------------------


async def test_a_step_after_a_swallowed_wait_runs_nothing(wd_store: Store) -> None:
    w = _wf("swallowed-step")
    shipped: list[str] = []

    async def ship() -> object:
        shipped.append("ship")
        return "shipped"

    async def body(run: Run[Any]) -> object:
        await asyncio.gather(run.awaiting("approval", _any), return_exceptions=True)
        return await run.step("ship", ship, _any)

    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    with pytest.raises(Swallowed) as caught:
        await resume(wd_store.durable, held, body)
    assert caught.value.before == "ship", f"Swallowed should name the refused step: {caught.value!r}"
    assert shipped == [], "a step after a swallowed wait ran its effect"
    assert "ship" not in await wd_store.checkpointer.load(w), "a step after a swallowed wait was recorded"


async def test_a_transact_after_a_swallowed_wait_performs_nothing(wd_store: Store) -> None:
    w = _wf("swallowed-transact")
    kit = wd_store.effects

    async def body(run: Run[Any]) -> object:
        await asyncio.gather(run.awaiting("approval", _any), return_exceptions=True)
        return await run.transact("reserve", kit.ledger_add(w, 1), _any)

    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    with pytest.raises(Swallowed):
        await resume(wd_store.durable, held, body)
    assert await kit.ledger_read(w) == 0, "a transact after a swallowed wait performed its effect"
    assert "reserve" not in await wd_store.checkpointer.load(w)


async def test_a_task_group_of_a_wait_and_a_step_ends_blocked_without_the_step(wd_store: Store) -> None:
    w = _wf("group-wait-step")
    shipped: list[str] = []

    async def ship() -> object:
        shipped.append("ship")
        return "shipped"

    async def body(run: Run[Any]) -> object:
        async with asyncio.TaskGroup() as group:
            group.create_task(run.awaiting("approval", _any))
            group.create_task(run.step("ship", ship, _any))
        return None

    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    outcome = await resume(wd_store.durable, held, body)
    assert isinstance(outcome, Blocked) and outcome.waits == ("approval",), f"got {outcome!r}"
    assert shipped == [], "a step started after a sibling's wait ran its effect"


async def test_a_pass_that_caught_fenced_does_not_finish(wd_store: Store) -> None:
    w = _wf("caught-fenced")

    async def charge() -> object:
        await wd_store.checkpointer.discard(w)  # a newer claim exists by the time this records
        return "charged"

    after: list[str] = []

    async def later() -> object:
        after.append("later")
        return "later"

    async def body(run: Run[Any]) -> object:
        with contextlib.suppress(BaseException):  # a careless catch-all absorbs the fence
            await run.step("charge", charge, _any)
        with contextlib.suppress(BaseException):
            await run.step("later", later, _any)
        return "finished?"

    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    with pytest.raises(Fenced):
        await resume(wd_store.durable, held, body)
    assert after == [], "a step ran on a pass after one of its writes was fenced"


# -- reserved keys: refused to callers, carried for the library, shown by load --------------


async def test_reserved_keys_are_refused_to_record_supply_and_arrive(wd_store: Store) -> None:
    w = _wf("reserved")
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    for key in (FINISHED, failed_key(0), "wd/anything"):
        with pytest.raises(InvalidKey):
            await wd_store.checkpointer.record(held, key, 1)
        with pytest.raises(InvalidKey):
            await wd_store.checkpointer.supply(w, key, 1)
        with pytest.raises(InvalidKey):
            await wd_store.durable.arrive(w, key, 1)
    assert await wd_store.checkpointer.load(w) == {}, "a refused reserved key was stored"


async def test_lifecycle_records_are_written_through_the_store_and_loaded(wd_store: Store) -> None:
    w = _wf("reserved-ok")
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    with lifecycle_writes():
        await wd_store.checkpointer.record(held, error_key(0, 1), {"type": "E", "message": "m", "attempt": 1})
        await wd_store.checkpointer.supply(w, rearmed_key(0), {"failure": None})
    got = await wd_store.checkpointer.load(w)
    assert list(got) == [error_key(0, 1), rearmed_key(0)], f"load must show lifecycle records: {got!r}"


# -- the Worker: terminal states and retries -------------------------------------------------


def _worker(store: Store, body: Any, retry: RetryPolicy | None = None) -> Worker[Any]:
    # On a manual clock only the test moves store time: tick the renewal in real time.
    renew = {} if store.clock.real else {"renew_every": timedelta(milliseconds=20)}
    return Worker(
        store.durable,
        body,
        alive=LONG,
        budget=LONG,
        visibility=LONG,
        poll_interval=timedelta(milliseconds=20),
        retry=retry,
        **renew,  # type: ignore[arg-type]
    )


async def test_a_finished_workflow_records_its_result_and_never_runs_again(wd_store: Store) -> None:
    w = _wf("finished")
    runs: list[int] = []

    async def body(run: Run[Any]) -> object:
        runs.append(1)
        return {"shipped": True}

    await wd_store.scheduler.schedule(w)
    assert await _worker(wd_store, body).run_once()
    records = await wd_store.checkpointer.load(w)
    assert records.get(FINISHED) == {"shipped": True}, f"wd/finished should hold the result: {records!r}"
    assert status_of(records).state == "finished"
    await wd_store.durable.deliver(w, "late message")  # anything that schedules it again
    assert await _worker(wd_store, body).run_once(), "the late delivery was not taken"
    assert runs == [1], f"a finished workflow ran its body again: {len(runs)} runs"
    assert await wd_store.scheduler.take(LONG) is None, "a finished workflow was left queued"


async def test_maximum_attempts_runs_the_body_exactly_that_often_across_workers(wd_store: Store) -> None:
    w = _wf("attempts")
    u = unit(wd_store)
    runs: list[int] = []

    async def body(run: Run[Any]) -> object:
        runs.append(1)
        raise RuntimeError(f"boom {len(runs)}")

    policy = RetryPolicy(initial_interval=u, backoff_coefficient=1.0, maximum_attempts=3)
    await wd_store.scheduler.schedule(w)
    for _ in range(5):  # a new worker each time: the count must live in the store
        await _worker(wd_store, body, policy).run_once()
        await wd_store.clock.advance(1.5 * u)
    assert len(runs) == 3, f"maximum_attempts=3 ran the body {len(runs)} times"
    records = await wd_store.checkpointer.load(w)
    status = status_of(records)
    assert status.state == "failed" and status.attempts == 3, f"expected failed after 3: {status!r}"
    assert status.failure == {"error_type": "RuntimeError", "message": "boom 3", "attempts": 3}, status
    assert await wd_store.scheduler.take(LONG) is None, "a failed workflow was left queued"
    await wd_store.durable.arrive(w, "nudge", 1)
    await _worker(wd_store, body, policy).run_once()
    assert len(runs) == 3, "an arrive ran the body of a failed workflow"


async def test_a_retry_waits_its_backoff_as_a_scheduler_wakeup(wd_store: Store) -> None:
    w = _wf("backoff")
    u = unit(wd_store)

    async def body(run: Run[Any]) -> object:
        raise RuntimeError("not yet")

    await wd_store.scheduler.schedule(w)
    await _worker(wd_store, body, RetryPolicy(initial_interval=2 * u)).run_once()
    assert await wd_store.scheduler.take(LONG) is None, "a retry was due before its backoff"
    await wd_store.clock.advance(2.5 * u)
    assert await wd_store.scheduler.take(LONG) is not None, "a retry was not due after its backoff"


@pytest.mark.parametrize("kind", ["non-retryable", "swallowed"])
async def test_non_retryable_errors_and_swallowed_fail_at_once(wd_store: Store, kind: str) -> None:
    w = _wf(kind)
    runs: list[int] = []

    async def body(run: Run[Any]) -> object:
        runs.append(1)
        if kind == "swallowed":
            await asyncio.gather(run.awaiting("approval", _any), return_exceptions=True)
            return None
        raise ValueError("declined")

    await wd_store.scheduler.schedule(w)
    policy = RetryPolicy(initial_interval=timedelta(microseconds=1), non_retryable_error_types=("ValueError",))
    await _worker(wd_store, body, policy).run_once()
    status = status_of(await wd_store.checkpointer.load(w))
    assert status.state == "failed" and status.attempts == 1, f"{kind}: expected failed at once, got {status!r}"
    assert await wd_store.scheduler.take(LONG) is None, f"{kind}: the failed workflow was left queued"
    assert runs == [1]


async def test_rearm_lets_a_failed_workflow_run_again_with_a_fresh_count(wd_store: Store) -> None:
    w = _wf("rearm")
    runs: list[int] = []

    async def body(run: Run[Any]) -> object:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("first time")
        return "done"

    await wd_store.scheduler.schedule(w)
    await _worker(wd_store, body, RetryPolicy(maximum_attempts=1)).run_once()
    assert status_of(await wd_store.checkpointer.load(w)).state == "failed"
    with pytest.raises(InvalidInput):
        await rearm(wd_store.durable, _wf("never-failed"))
    await rearm(wd_store.durable, w)
    assert await _worker(wd_store, body, RetryPolicy(maximum_attempts=1)).run_once()
    status = status_of(await wd_store.checkpointer.load(w))
    assert runs == [1, 1] and status.state == "finished", f"after rearm: {len(runs)} runs, {status!r}"
    assert status.generation == 1 and status.attempts == 0, status


# -- nothing live is lost ---------------------------------------------------------------------


async def test_an_open_workflow_outlives_a_long_silence(wd_store: Store) -> None:
    """Only a finished or failed workflow may ever be removed: one waiting for an arrival keeps
    every record however long nothing happens to it (the store's TTL or sweep included)."""
    if wd_store.clock.real:
        pytest.skip("needs a store clock the suite can move; server stores test their retention in their own files")
    w = _wf("silence")
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.checkpointer.record(held, "charge", "ch_1")
    await wd_store.checkpointer.release(held)
    await _a_long_silence(wd_store)
    assert await wd_store.checkpointer.load(w) == {"charge": "ch_1"}, "an open workflow lost its records"
    again = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    assert again.token > held.token, "a long silence let a token come round again"


async def _a_long_silence(store: Store) -> None:
    await store.clock.advance(timedelta(days=400))


__all__ = [name for name in list(globals()) if name.startswith("test_")]
