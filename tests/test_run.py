"""Run and resume, on every selected store (``--wd-store``): what a workflow body can rely on."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from without_durability import (
    Blocked,
    Fenced,
    Finished,
    InvalidValue,
    Run,
    Sleeping,
    Suspended,
    Swallowed,
    resume,
)
from without_durability.testing.conformance import unit
from without_durability.testing.harness import StoreUnderTest

Store = StoreUnderTest[Any]
LONG = timedelta(hours=1)
_ids = itertools.count()


def wf(label: str) -> str:
    return f"run-{label}-{next(_ids)}"


def as_int(value: object) -> int:
    assert isinstance(value, int), f"expected an int, got {value!r}"
    return value


def as_any(value: object) -> object:
    return value


async def one_pass(store: Store, workflow: str, body: Any) -> Finished | Sleeping | Blocked:
    """Claim, resume once, release: what a worker does, without the queue."""
    pass_ = await store.checkpointer.claim(workflow, alive=LONG, budget=LONG)
    try:
        return await resume(store.durable, pass_, body)
    finally:
        await store.checkpointer.release(pass_)


async def test_transact_effect_happens_once_over_ten_resumes(wd_store: Store) -> None:
    w = wf("ten")
    kit = wd_store.effects
    seen: list[int] = []

    async def body(run: Run[Any]) -> object:
        seen.append(await run.transact("reserve", kit.ledger_add(w, 5), as_int))
        return await run.awaiting("approval", as_any)

    outcomes = [await one_pass(wd_store, w, body) for _ in range(10)]
    assert outcomes == [Blocked(("approval",))] * 10, f"expected ten Blocked, got {outcomes}"
    assert await kit.ledger_read(w) == 5, "the transact effect ran more than once over ten passes"
    assert seen == [5] * 10, f"every pass should read the one recorded total, got {seen}"
    await wd_store.durable.arrive(w, "approval", "yes")
    assert await one_pass(wd_store, w, body) == Finished("yes")
    assert await kit.ledger_read(w) == 5


async def test_except_exception_around_a_step_does_not_catch_fenced(wd_store: Store) -> None:
    w = wf("fenced")
    compensated: list[str] = []
    ran: list[str] = []

    async def charge() -> object:
        ran.append("charge")
        await wd_store.checkpointer.discard(w)  # a newer pass exists by the time we record
        return "ch_1"

    async def body(run: Run[Any]) -> object:
        try:
            return await run.step("charge", charge, as_any)
        except Exception:
            compensated.append("refund")
            raise

    pass_ = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    with pytest.raises(Fenced):
        await resume(wd_store.durable, pass_, body)
    assert ran == ["charge"]
    assert compensated == [], "a saga's except Exception absorbed Fenced and compensated"
    assert await wd_store.checkpointer.load(w) == {}, "a fenced pass recorded its step"


@pytest.mark.parametrize("return_exceptions", [False, True])
async def test_fan_out_over_two_waits_reports_both(wd_store: Store, return_exceptions: bool) -> None:
    w = wf("fan")

    async def body(run: Run[Any]) -> object:
        got = await asyncio.gather(
            run.awaiting("left", as_any),
            run.awaiting("right", as_any),
            return_exceptions=return_exceptions,
        )
        return got

    if return_exceptions:
        with pytest.raises(Swallowed) as caught:
            await one_pass(wd_store, w, body)
        assert sorted(caught.value.waits) == ["left", "right"], caught.value.waits
    else:
        outcome = await one_pass(wd_store, w, body)
        assert isinstance(outcome, Blocked), f"expected Blocked, got {outcome}"
        assert sorted(outcome.waits) == ["left", "right"], f"a wait went unreported: {outcome}"
    await wd_store.durable.arrive(w, "left", 1)
    await wd_store.durable.arrive(w, "right", 2)
    assert await one_pass(wd_store, w, body) == Finished([1, 2])


async def test_fan_out_of_a_sleep_and_a_wait_reports_both(wd_store: Store) -> None:
    w = wf("fan-sleep")
    u = unit(wd_store)

    async def body(run: Run[Any]) -> object:
        # The sleep needs round trips (the store's clock, a record) before it reaches its wait,
        # after the awaiting branch has already ended the gather.
        await asyncio.gather(run.awaiting("reply", as_any), run.sleep("timeout", 4 * u))
        return "done"

    before = await wd_store.now()
    outcome = await one_pass(wd_store, w, body)
    assert isinstance(outcome, Sleeping), f"expected Sleeping, got {outcome}"
    assert sorted(outcome.waits) == ["reply", "timeout"], f"a wait went unreported: {outcome}"
    assert before + 4 * u <= outcome.until <= await wd_store.now() + 4 * u


async def test_a_body_that_swallows_suspended_is_refused(wd_store: Store) -> None:
    w = wf("swallow")

    async def body(run: Run[Any]) -> object:
        try:
            await run.awaiting("approval", as_any)
        except BaseException:  # what a careless catch-all does
            return "finished?"
        return "finished?"

    with pytest.raises(Swallowed) as caught:
        await one_pass(wd_store, w, body)
    assert caught.value.waits == ["approval"]


async def test_a_step_hands_back_what_the_store_holds_on_the_pass_that_ran_it(
    wd_store: Store,
) -> None:
    w = wf("tuple")
    seen: list[object] = []

    async def pair() -> object:
        return (1, 2)

    async def body(run: Run[Any]) -> object:
        seen.append(await run.step("pair", pair, as_any))
        return None

    assert await one_pass(wd_store, w, body) == Finished(None)
    stored = (await wd_store.checkpointer.load(w))["pair"]
    assert seen == [stored], f"first pass saw {seen[0]!r}, the store holds {stored!r}"
    assert not isinstance(seen[0], tuple) or isinstance(stored, tuple)
    await one_pass(wd_store, w, body)
    assert seen[0] == seen[1] and type(seen[0]) is type(seen[1]), f"passes disagree: {seen}"


async def test_a_step_runs_its_effect_once_across_passes(wd_store: Store) -> None:
    w = wf("step")
    calls: list[int] = []

    async def effect() -> object:
        calls.append(1)
        return {"id": len(calls)}

    async def body(run: Run[Any]) -> object:
        got = await run.step("effect", effect, as_any)
        await run.awaiting("never", as_any)
        return got

    for _ in range(3):
        assert await one_pass(wd_store, w, body) == Blocked(("never",))
    assert calls == [1], f"a recorded step ran again: {calls}"


async def test_sleep_records_iso_text_and_reads_back_an_aware_datetime(wd_store: Store) -> None:
    w = wf("sleep")
    u = unit(wd_store)
    deadlines: list[datetime] = []

    async def body(run: Run[Any]) -> object:
        deadlines.append(await run.sleep("nap", 2 * u))
        return "woke"

    first = await one_pass(wd_store, w, body)
    assert isinstance(first, Sleeping) and first.waits == ("nap",), first
    recorded = (await wd_store.checkpointer.load(w))["nap"]
    assert isinstance(recorded, str), f"sleep recorded {recorded!r}, expected ISO text"
    assert datetime.fromisoformat(recorded) == first.until
    assert first.until.tzinfo is not None and first.until.utcoffset() == timedelta(0)
    assert await one_pass(wd_store, w, body) == first, "a replayed sleep moved its deadline"
    await wd_store.clock.advance(3 * u)
    assert await one_pass(wd_store, w, body) == Finished("woke")
    assert deadlines[-1] == first.until and deadlines[-1].tzinfo is not None


async def test_sleep_refuses_a_naive_datetime(wd_store: Store) -> None:
    async def body(run: Run[Any]) -> object:
        return await run.sleep("nap", datetime(2030, 1, 1))

    with pytest.raises(ValueError, match="naive"):
        await one_pass(wd_store, wf("naive"), body)


async def test_inbox_lists_delivered_messages_in_order(wd_store: Store) -> None:
    w = wf("inbox")
    for message in ("a", "b", "c"):
        await wd_store.durable.deliver(w, {"m": message})

    async def body(run: Run[Any]) -> object:
        return [value for _key, value in run.inbox()]

    assert await one_pass(wd_store, w, body) == Finished([{"m": "a"}, {"m": "b"}, {"m": "c"}])


async def test_a_stray_branch_does_nothing_after_its_pass_ended(wd_store: Store) -> None:
    w = wf("stray")
    release = asyncio.Event()
    ran: list[str] = []
    stray: list[asyncio.Task[object]] = []

    async def late() -> object:
        ran.append("late")
        return 1

    async def branch(run: Run[Any]) -> object:
        await release.wait()  # not inside a Run operation when the pass ends
        return await run.step("late", late, as_any)

    async def body(run: Run[Any]) -> object:
        stray.append(asyncio.ensure_future(branch(run)))
        return await run.awaiting("approval", as_any)

    assert await one_pass(wd_store, w, body) == Blocked(("approval",))
    release.set()
    with pytest.raises(Suspended):
        await stray[0]
    assert ran == [], "an operation started after its pass ended ran its effect"


async def test_suspended_is_not_an_exception() -> None:
    assert not issubclass(Suspended, Exception) and not issubclass(Fenced, Exception)


async def test_a_task_group_fan_out_reports_its_waits(wd_store: Store) -> None:
    w = wf("taskgroup")

    async def body(run: Run[Any]) -> object:
        async with asyncio.TaskGroup() as group:
            left = group.create_task(run.awaiting("left", as_any))
            right = group.create_task(run.awaiting("right", as_any))
        return [left.result(), right.result()]

    outcome = await one_pass(wd_store, w, body)
    assert isinstance(outcome, Blocked) and sorted(outcome.waits) == ["left", "right"], outcome
    await wd_store.durable.arrive(w, "left", 1)
    await wd_store.durable.arrive(w, "right", 2)
    assert await one_pass(wd_store, w, body) == Finished([1, 2])


async def test_a_fence_inside_a_task_group_is_raised_as_fenced(wd_store: Store) -> None:
    w = wf("taskgroup-fenced")

    async def charge() -> object:
        await wd_store.checkpointer.discard(w)
        return "charged"

    async def other() -> object:
        return "fine"

    async def body(run: Run[Any]) -> object:
        async with asyncio.TaskGroup() as group:
            group.create_task(run.step("charge", charge, as_any))
            group.create_task(run.step("other", other, as_any))
        return None

    pass_ = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    with pytest.raises(Fenced):
        await resume(wd_store.durable, pass_, body)


@pytest.mark.parametrize("held", [5, "soon", "2030-01-01T00:00:00"], ids=["not-text", "not-iso", "naive"])
async def test_a_sleep_on_a_key_that_holds_no_time_is_refused_by_name(wd_store: Store, held: object) -> None:
    """A sleep whose key another record took (not text, not ISO-8601, or a time with no zone) is
    an ``InvalidValue`` naming the key and what it found: never a bare TypeError or ValueError
    from the parsing."""

    async def make() -> object:
        return held

    async def body(run: Run[Any]) -> object:
        await run.step("nap", make, as_any)
        return await run.sleep("nap", timedelta(seconds=1))

    with pytest.raises(InvalidValue, match="key 'nap': sleep found"):
        await one_pass(wd_store, wf("sleep-taken"), body)


async def test_a_task_group_branch_that_failed_ends_the_pass_with_the_group(wd_store: Store) -> None:
    """A failure in a fan-out is raised as the TaskGroup raised it (the group, with the failure
    inside), as a body's own ``except*`` expects: only a fence inside is raised on its own."""

    async def fail() -> object:
        raise LookupError("declined")

    async def body(run: Run[Any]) -> object:
        async with asyncio.TaskGroup() as group:
            group.create_task(fail())
            group.create_task(run.step("ship", fail, as_any))
        return None

    with pytest.raises(ExceptionGroup) as caught:
        await one_pass(wd_store, wf("group-fails"), body)
    assert caught.group_contains(LookupError, match="declined"), caught.value


async def test_a_fence_inside_a_nested_task_group_is_raised_as_fenced(wd_store: Store) -> None:
    """A branch that runs a TaskGroup of its own: the fence two groups deep is still found and
    raised as ``Fenced`` (not the outer group), beside a sibling group that failed otherwise."""
    w = wf("taskgroup-nested-fenced")

    async def charge() -> object:
        await wd_store.checkpointer.discard(w)
        return "charged"

    async def nested(run: Run[Any]) -> None:
        async with asyncio.TaskGroup() as inner:
            inner.create_task(run.step("charge", charge, as_any))

    async def body(run: Run[Any]) -> object:
        async with asyncio.TaskGroup() as group:
            group.create_task(nested(run))
        return None

    pass_ = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    with pytest.raises(Fenced):
        await resume(wd_store.durable, pass_, body)


async def test_a_body_reads_its_workflow_pass_and_store_as_attributes(wd_store: Store) -> None:
    w = wf("attributes")
    seen: list[object] = []

    async def body(run: Run[Any]) -> object:
        seen.extend([run.workflow, run.pass_.workflow, run.durable is wd_store.durable])
        return None

    assert await one_pass(wd_store, w, body) == Finished(None)
    assert seen == [w, w, True], seen


async def test_a_fan_out_whose_branches_are_still_in_flight_reports_every_wait(wd_store: Store) -> None:
    """The wait ends the gather while two sleeps are still on their way to the store: the pass
    ends only when neither is inside an operation, so all three waits are reported (on a store
    whose calls really yield, the two sleeps' round trips overlap)."""
    w = wf("fan-in-flight")
    u = unit(wd_store)

    async def body(run: Run[Any]) -> object:
        await asyncio.gather(run.awaiting("reply", as_any), run.sleep("first", 4 * u), run.sleep("second", 5 * u))
        return "done"

    outcome = await one_pass(wd_store, w, body)
    assert isinstance(outcome, Sleeping), f"expected Sleeping, got {outcome}"
    assert sorted(outcome.waits) == ["first", "reply", "second"], f"a wait went unreported: {outcome}"


class _SlowRecords:
    """The store's own Durable, whose records take ``by`` of the store's clock to land (as a
    record across a slow network does): a sleep measured from before its record may be over by
    the time the record is back."""

    def __init__(self, store: Store, by: timedelta) -> None:
        self.store, self.by, self.inner = store, by, store.durable
        self.scheduler = store.durable.scheduler
        outer = self

        class Checkpointer:
            def __getattr__(self, name: str) -> Any:
                return getattr(outer.inner.checkpointer, name)

            async def record(self, pass_: Any, key: str, value: object) -> Any:
                got = await outer.inner.checkpointer.record(pass_, key, value)
                await outer.store.clock.advance(outer.by)
                return got

        self.checkpointer = Checkpointer()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_sleep_whose_deadline_passed_during_its_record_does_not_wait(wd_store: Store) -> None:
    """The store's clock is asked again after the deadline is recorded: a sleep that was over by
    then goes on in the same pass, and a zero sleep never waits."""
    u = unit(wd_store)

    async def body(run: Run[Any]) -> object:
        await run.sleep("zero", timedelta(0))
        await run.sleep("nap", u)
        return "woke"

    w = wf("sleep-over")
    slow = _SlowRecords(wd_store, 2 * u)
    pass_ = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    assert await resume(slow, pass_, body) == Finished("woke")  # type: ignore[arg-type]
    w = wf("sleep-zero")
    assert isinstance(await one_pass(wd_store, w, body), Sleeping)  # the nap waits on a still clock
    assert "zero" in await wd_store.checkpointer.load(w)


@pytest.mark.parametrize("ending", ["error", "fenced", "group-error", "group-fenced"])
async def test_a_stray_branch_does_nothing_after_its_pass_failed(wd_store: Store, ending: str) -> None:
    """However the pass ended (the body raised, was fenced, or a TaskGroup raised either), an
    operation a stray branch starts afterwards does nothing."""
    w = wf(f"stray-{ending}")
    release = asyncio.Event()
    ran: list[str] = []
    stray: list[asyncio.Future[object]] = []

    async def late() -> object:
        ran.append("late")
        return 1

    async def branch(run: Run[Any]) -> object:
        await release.wait()
        return await run.step("late", late, as_any)

    async def charge() -> object:
        await wd_store.checkpointer.discard(w)
        return "charged"

    async def end(run: Run[Any]) -> object:
        if ending.endswith("fenced"):
            return await run.step("charge", charge, as_any)
        raise LookupError("declined")

    async def body(run: Run[Any]) -> object:
        stray.append(asyncio.ensure_future(branch(run)))
        if ending.startswith("group"):
            async with asyncio.TaskGroup() as group:
                group.create_task(end(run))
            return None
        return await end(run)

    pass_ = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    with pytest.raises((LookupError, ExceptionGroup, Fenced)):
        await resume(wd_store.durable, pass_, body)
    release.set()
    with pytest.raises(BaseException):  # noqa: B017 - which refusal is the Run's to choose
        await stray[0]
    assert ran == [], "an operation started after its pass ended ran its effect"


def test_a_pass_outcome_cannot_be_changed_once_made() -> None:
    import dataclasses

    made = (Finished(1), "value"), (Blocked(("a",)), "waits"), (Sleeping(datetime(2030, 1, 1, tzinfo=UTC), ("b",)), "waits")
    for outcome, name in made:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(outcome, name, None)
