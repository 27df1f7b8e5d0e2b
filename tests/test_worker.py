"""The Worker loop, in process, on every selected store (``--wd-store``)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from datetime import timedelta
from typing import Any

import pytest

from without_durability import Contended, Pass, RetryPolicy, Run, StoreUnavailable, Worker
from without_durability.lifecycle import FINISHED
from without_durability.testing.conformance import unit
from without_durability.testing.harness import StoreUnderTest

Store = StoreUnderTest[Any]
LONG = timedelta(hours=1)
_ids = itertools.count()


def wf(label: str) -> str:
    return f"worker-{label}-{next(_ids)}"


def as_any(value: object) -> object:
    return value


PASS_DEADLINE = 150.0
"""Seconds one worker pass of these renewal tests may take before the test fails as stuck."""


class CountingCheckpointer:
    """The store's own checkpointer, with its renew calls counted."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.renewals = 0
        self.changed = asyncio.Condition()

    async def renew(self, pass_: Pass) -> None:
        await self.inner.renew(pass_)
        async with self.changed:
            self.renewals += 1
            self.changed.notify_all()

    async def renewed_since(self, seen: int, seconds: float = 20.0) -> None:
        """Wait, with a deadline, until a renewal after the ``seen``-th has succeeded."""
        async with asyncio.timeout(seconds), self.changed:
            await self.changed.wait_for(lambda: self.renewals > seen)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CountingDurable:
    """The store's own Durable with a counting checkpointer in front (what wd-chaos does too)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.checkpointer = CountingCheckpointer(inner.checkpointer)
        self.scheduler = inner.scheduler

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def worker(store: Store, durable: Any, body: Any, *, alive: timedelta, **kw: Any) -> Worker[Any]:
    # On a manual clock, alive is store time that only the test moves: tick in real time often.
    if not store.clock.real:
        kw.setdefault("renew_every", timedelta(milliseconds=20))
    return Worker(
        durable,
        body,
        alive=alive,
        budget=kw.pop("budget", LONG),
        visibility=LONG,
        poll_interval=timedelta(milliseconds=20),
        **kw,
    )


async def test_worker_runs_a_workflow_through_a_wait_to_the_end(wd_store: Store) -> None:
    w = wf("flow")
    kit = wd_store.effects
    finished: list[object] = []

    async def body(run: Run[Any]) -> object:
        total = await run.transact("reserve", kit.ledger_add(w, 1), as_any)
        approval = await run.awaiting("approval", as_any)
        finished.append((total, approval))
        return approval

    await wd_store.scheduler.schedule(w)
    work = worker(wd_store, wd_store.durable, body, alive=LONG)
    await work.run(max_passes=1)
    assert finished == [] and await wd_store.scheduler.take(LONG) is None, (
        "a Blocked pass should leave nothing queued"
    )
    await wd_store.durable.arrive(w, "approval", "ok")
    await work.run(until=lambda: bool(finished))
    assert finished == [(1, "ok")]
    assert await kit.ledger_read(w) == 1
    assert await wd_store.scheduler.take(LONG) is None, "a Finished workflow stayed queued"
    again = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    assert again.token > 0, "the worker did not release its claim"


async def test_worker_wakes_a_sleeping_workflow_at_its_deadline(wd_store: Store) -> None:
    w = wf("sleep")
    u = unit(wd_store)
    woke: list[bool] = []

    async def body(run: Run[Any]) -> object:
        await run.sleep("nap", 2 * u)
        woke.append(True)
        return None

    await wd_store.scheduler.schedule(w)
    work = worker(wd_store, wd_store.durable, body, alive=LONG)
    await work.run(max_passes=1)
    assert not woke and await wd_store.scheduler.take(LONG) is None, "a sleeper was due early"
    await wd_store.clock.advance(3 * u)
    await work.run(until=lambda: bool(woke))
    assert woke == [True]


@pytest.mark.parametrize("first_fails", [False, True], ids=["renewals", "a-renewal-fails-first"])
async def test_renewal_keeps_a_step_longer_than_alive_claimed(wd_store: Store, first_fails: bool) -> None:
    """The tick renews throughout a long step; a renewal that fails (the store gone for a moment)
    is logged and the tick goes on, so the next one keeps the claim."""
    w = wf("long")
    u = unit(wd_store)
    durable = CountingDurable(Flaky(wd_store.durable, renewals=1) if first_fails else wd_store.durable)
    stolen: list[object] = []
    done: list[object] = []

    async def long_effect() -> object:
        # Let 3 alive-windows pass on the store's clock, one half-window at a time, each time
        # waiting for the worker's tick to renew; then try to take the workflow from outside.
        for _ in range(6):
            seen = durable.checkpointer.renewals
            await wd_store.clock.advance(u / 2)
            await durable.checkpointer.renewed_since(seen)
        with contextlib.suppress(Contended):
            stolen.append(await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG))
        return "slow"

    async def body(run: Run[Any]) -> object:
        done.append(await run.step("slow", long_effect, as_any))
        return None

    await wd_store.scheduler.schedule(w)
    async with asyncio.timeout(PASS_DEADLINE):  # a stuck pass fails here, not at the suite's timeout
        await worker(wd_store, durable, body, alive=u).run(max_passes=1)
    assert stolen == [], "the claim lapsed during a long step despite the renewal tick"
    assert done == ["slow"], "the long step was not recorded"


async def test_renewal_never_outlives_the_budget(wd_store: Store) -> None:
    w = wf("budget")
    u = unit(wd_store)
    durable = CountingDurable(wd_store.durable)
    stolen: list[Pass] = []
    cancelled: list[bool] = []

    async def endless() -> object:
        try:
            for _ in range(8):  # four alive-windows, against a budget of two
                seen = durable.checkpointer.renewals
                await wd_store.clock.advance(u / 2)
                await durable.checkpointer.renewed_since(seen)
            stolen.append(await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG))
            await asyncio.sleep(60)  # the worker's next tick finds it fenced and cancels us
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "never"

    async def body(run: Run[Any]) -> object:
        return await run.step("endless", endless, as_any)

    await wd_store.scheduler.schedule(w)
    async with asyncio.timeout(PASS_DEADLINE):  # a stuck pass fails here, not at the suite's timeout
        await worker(wd_store, durable, body, alive=u, budget=2 * u).run(max_passes=1)
    assert len(stolen) == 1, "another claim should succeed once the budget is spent"
    assert cancelled == [True], "the fenced pass was not stopped by its renewal tick"
    assert await wd_store.checkpointer.load(w) == {}, "the fenced pass recorded its step"


async def test_a_contended_delivery_is_answered_for_later(wd_store: Store) -> None:
    w = wf("contended")
    u = unit(wd_store)
    ran: list[bool] = []

    async def body(run: Run[Any]) -> object:
        ran.append(True)
        return None

    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.scheduler.schedule(w)
    work = worker(wd_store, wd_store.durable, body, alive=LONG, retry_contended=2 * u)
    await work.run(max_passes=1)
    assert ran == [] and work.passes == 1
    assert await wd_store.scheduler.take(LONG) is None, "the contended delivery came back at once"
    await wd_store.checkpointer.release(held)
    await wd_store.clock.advance(3 * u)
    await work.run(until=lambda: bool(ran))
    assert ran == [True]


async def test_stop_finishes_the_current_pass(wd_store: Store) -> None:
    w = wf("stop")
    started = asyncio.Event()
    go_on = asyncio.Event()
    work: list[Worker[Any]] = []

    async def slow() -> object:
        started.set()
        await go_on.wait()
        return "done"

    async def body(run: Run[Any]) -> object:
        return await run.step("slow", slow, as_any)

    await wd_store.scheduler.schedule(w)
    work.append(worker(wd_store, wd_store.durable, body, alive=LONG))
    running = asyncio.create_task(work[0].run())
    await asyncio.wait_for(started.wait(), 20)
    work[0].stop()
    go_on.set()
    await asyncio.wait_for(running, 20)
    want = {"slow": "done", "wd/finished": "done"}
    assert await wd_store.checkpointer.load(w) == want, "stop cut the pass short"
    assert await wd_store.scheduler.take(LONG) is None, "the stopped worker did not answer"


@pytest.mark.parametrize("field", ["alive", "budget", "visibility", "poll_interval"])
def test_worker_refuses_bad_durations(field: str) -> None:
    kw: dict[str, Any] = dict(alive=LONG, budget=LONG, visibility=LONG, poll_interval=timedelta(seconds=1))
    kw[field] = timedelta(0)
    with pytest.raises(ValueError, match=field):
        Worker(object(), as_any, **kw)  # type: ignore[arg-type]


async def test_a_fenced_pass_answers_nothing_and_compensates_nothing(wd_store: Store) -> None:
    w = wf("fenced")
    u = unit(wd_store)
    compensated: list[bool] = []

    async def charge() -> object:
        await wd_store.checkpointer.discard(w)  # a newer claim may now be made: this pass is stale
        return "charged"

    async def body(run: Run[Any]) -> object:
        try:
            return await run.step("charge", charge, as_any)
        except Exception:
            compensated.append(True)
            raise

    await wd_store.scheduler.schedule(w)
    work = Worker(
        wd_store.durable,
        body,
        alive=LONG,
        budget=LONG,
        visibility=2 * u,
        poll_interval=timedelta(milliseconds=20),
    )
    await work.run(max_passes=1)
    assert compensated == [] and await wd_store.checkpointer.load(w) == {}
    assert await wd_store.scheduler.take(LONG) is None, "the fenced pass answered its delivery"
    await wd_store.clock.advance(3 * u)
    again = await wd_store.scheduler.take(LONG)
    assert again is not None and again.workflow == w, "the unanswered delivery never came back"


async def test_a_failing_body_is_released_and_retried_after_its_visibility(
    wd_store: Store,
) -> None:
    w = wf("fails")
    u = unit(wd_store)
    attempts: list[int] = []

    async def body(run: Run[Any]) -> object:
        attempts.append(run.pass_.token)
        if len(attempts) == 1:
            raise RuntimeError("a bug in the body")
        return None

    await wd_store.scheduler.schedule(w)
    work = Worker(
        wd_store.durable,
        body,
        alive=LONG,
        budget=LONG,
        visibility=2 * u,
        poll_interval=timedelta(milliseconds=20),
    )
    await work.run(max_passes=1)
    assert len(attempts) == 1
    assert await wd_store.scheduler.take(LONG) is None, "a failed pass was retried at once"
    await wd_store.clock.advance(3 * u)
    await work.run(until=lambda: len(attempts) == 2)
    assert attempts[1] > attempts[0], "the failed pass kept its claim"
    assert await wd_store.scheduler.take(LONG) is None, "the finished workflow stayed queued"


async def test_a_store_error_in_a_pass_counts_no_attempt(wd_store: Store) -> None:
    w = wf("store-error")

    async def body(run: Run[Any]) -> object:
        raise StoreUnavailable("the store went away mid-pass")

    await wd_store.scheduler.schedule(w)
    work = worker(wd_store, wd_store.durable, body, alive=LONG, retry=RetryPolicy(maximum_attempts=1))
    await work.run_once()
    records = await wd_store.checkpointer.load(w)
    assert records == {}, f"a store error was counted as a failed attempt: {records!r}"
    assert await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG), "the claim was not released"


class SwallowingCheckpointer(CountingCheckpointer):
    """The store's checkpointer, whose renew swallows the first cancel that lands in it and
    returns as if it had finished: what redis-py's ``asyncio.wait_for`` does on Python 3.11 when
    the cancel lands as the reply arrives."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.swallowed = 0

    async def renew(self, pass_: Pass) -> None:
        try:
            await asyncio.sleep(3600)  # a call in flight until the Worker's cancel lands
        except asyncio.CancelledError:
            self.swallowed += 1
            current = asyncio.current_task()
            assert current is not None
            current.uncancel()  # swallowed: the caller's cancel is lost
        await super().renew(pass_)


async def test_a_pass_ends_though_its_renewal_swallowed_the_cancel(wd_store: Store) -> None:
    """The Worker ends a pass's renewal tick by more than ``cancel()``: a tick whose store call
    swallows the cancel must still stop, or the pass never ends and the result is never recorded."""
    w = wf("swallow")
    durable = CountingDurable(wd_store.durable)
    durable.checkpointer = SwallowingCheckpointer(wd_store.durable.checkpointer)

    async def body(run: Run[Any]) -> object:
        await asyncio.sleep(0.05)  # renewals tick all through it
        return "done"

    await wd_store.scheduler.schedule(w)
    work = Worker(
        durable,
        body,
        alive=LONG,
        budget=LONG,
        visibility=LONG,
        poll_interval=timedelta(milliseconds=20),
        renew_every=timedelta(milliseconds=1),
    )
    once = asyncio.ensure_future(work.run_once())
    await asyncio.wait({once}, timeout=20)  # not a cancel: the tick that would run for ever must end itself
    if not once.done():
        once.cancel()
        pytest.fail("the pass never ended: its renewal tick outlived the body")
    assert once.result()
    assert durable.checkpointer.swallowed, "no cancel landed in a renewal: this shows nothing"
    assert (await wd_store.checkpointer.load(w)).get("wd/finished") == "done"


class Bell:
    """A wakeup of the test's own (``Worker.wakeup`` is any object with ``wait(at_most)``): rings
    when told, never by itself; ``broken`` makes every wait raise, ``deaf`` makes it ignore its
    ``at_most``. Counts its waits."""

    def __init__(self, *, broken: bool = False, deaf: bool = False) -> None:
        self.rung = asyncio.Event()
        self.broken, self.deaf, self.waits = broken, deaf, 0

    async def wait(self, at_most: timedelta) -> None:
        self.waits += 1
        if self.broken:
            raise RuntimeError("the wakeup's connection is gone")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.rung.wait(), None if self.deaf else at_most.total_seconds())
        self.rung.clear()


def _idler(store: Store, done: list[str], *, poll: float, wakeup: Any = None, durable: Any = None) -> Worker[Any]:
    async def body(run: Run[Any]) -> object:
        done.append(run.workflow)
        return None

    return Worker(
        store.durable if durable is None else durable, body, alive=LONG, budget=LONG, visibility=LONG,
        poll_interval=timedelta(seconds=poll), wakeup=wakeup,
    )  # fmt: skip


async def _until(check: Any, within: float) -> bool:
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def test_an_idle_worker_takes_as_soon_as_its_wakeup_rings_and_stops_at_once(wd_store: Store) -> None:
    done: list[str] = []
    bell = Bell()
    work = _idler(wd_store, done, poll=30.0, wakeup=bell)
    running = asyncio.ensure_future(work.run())
    assert await _until(lambda: bell.waits > 0, 5.0), "the idle worker never waited on its wakeup"
    w = wf("bell")
    await wd_store.scheduler.schedule(w)
    bell.rung.set()
    assert await _until(lambda: done == [w], 5.0), f"a rung wakeup left the workflow to the 30 s poll: {done}"
    work.stop()
    await asyncio.wait_for(running, 5.0)


async def test_a_worker_without_a_wakeup_polls_runs_due_work_back_to_back_and_stops_at_once(
    wd_store: Store,
) -> None:
    """Nothing due: it sleeps out its poll interval between takes (no spinning); due work: it takes
    the next at once after a pass, not after a poll; stop ends its idling at once."""
    done: list[str] = []
    counting = Flaky(wd_store.durable)
    work = _idler(wd_store, done, poll=0.2, durable=counting)
    started = asyncio.get_running_loop().time()
    running = asyncio.ensure_future(work.run())
    await asyncio.sleep(0.5)
    takes, took = counting.calls["take"], asyncio.get_running_loop().time() - started
    assert 1 <= takes <= took / 0.2 + 2, f"{takes} takes in {took:.1f} s at a 0.2 s poll: it spins"
    work.poll_interval = timedelta(seconds=30)
    await asyncio.sleep(0.25)  # it is idling on the 30 s poll now
    work.stop()
    await asyncio.wait_for(running, 5.0)
    work = _idler(wd_store, done, poll=30.0)
    ws = [wf("row") for _ in range(3)]
    for w in ws:
        await wd_store.scheduler.schedule(w)
    running = asyncio.ensure_future(work.run())
    assert await _until(lambda: sorted(done) == sorted(ws), 5.0), f"due work waited for a poll: {done}"
    work.stop()
    await asyncio.wait_for(running, 5.0)


@pytest.mark.parametrize("kind", ["broken", "deaf"])
async def test_a_broken_or_deaf_wakeup_costs_latency_never_the_worker(wd_store: Store, kind: str) -> None:
    """A wakeup whose wait raises is treated as none (the poll interval is slept out, not a
    tight loop of failing waits); one that never returns is cut off at the poll interval. Either
    way due work is taken after a poll, and stop still ends the worker."""
    done: list[str] = []
    bell = Bell(broken=kind == "broken", deaf=kind == "deaf")
    work = _idler(wd_store, done, poll=0.2, wakeup=bell)
    w = wf(kind)
    started = asyncio.get_running_loop().time()
    running = asyncio.ensure_future(work.run())
    await asyncio.sleep(0.1)
    await wd_store.scheduler.schedule(w)
    assert await _until(lambda: done == [w], 5.0), f"a {kind} wakeup lost the workflow: {done}"
    await asyncio.sleep(0.5)
    took = asyncio.get_running_loop().time() - started
    # at most one wait per poll interval (and one to spare at each end): never a tight loop
    assert bell.waits <= took / 0.2 + 2, f"{bell.waits} waits on a {kind} wakeup in {took:.1f} s at a 0.2 s poll"
    work.stop()
    await asyncio.wait_for(running, 5.0)


def test_the_defaults_the_docstring_gives() -> None:
    """A renewal every third of ``alive`` and a contended claim retried a second later, unless
    given; ``stopping`` reads whether ``stop`` was called."""
    from without_durability.memory import MemoryCheckpointer, MemoryDurable, MemoryScheduler

    work = Worker(
        MemoryDurable(MemoryCheckpointer(), MemoryScheduler()), lambda run: None, alive=timedelta(seconds=3), budget=LONG, visibility=LONG,
        poll_interval=timedelta(seconds=1),
    )  # fmt: skip
    assert work.renew_every == timedelta(seconds=1) and work.retry_contended == timedelta(seconds=1)
    assert work.stopping is False
    work.stop()
    assert work.stopping is True


class Flaky:
    """The store's own Durable whose takes (``take``, or ``take_and_claim`` where the store offers
    it), answers (``wake_at``) and renewals each fail the first ``n`` times with
    ``StoreUnavailable`` (a server gone for a moment), then work; ``calls`` counts each kind."""

    def __init__(self, inner: Any, *, takes: int = 0, answers: int = 0, renewals: int = 0) -> None:
        self.inner = inner
        self.left = {"take": takes, "wake_at": answers, "renew": renewals}
        self.calls = {"take": 0, "wake_at": 0, "renew": 0}
        outer = self

        class Part:
            def __init__(self, part: Any) -> None:
                self.part = part

            def __getattr__(self, name: str) -> Any:
                return outer._wrap(name, getattr(self.part, name))

        self.scheduler, self.checkpointer = Part(inner.scheduler), Part(inner.checkpointer)

    def _wrap(self, name: str, call: Any) -> Any:
        kind = "take" if name == "take_and_claim" else name
        if kind not in self.left:
            return call

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[kind] += 1
            if self.left[kind] > 0:
                self.left[kind] -= 1
                raise StoreUnavailable(f"{name}: the server went away (made by the test)")
            return await call(*args, **kwargs)

        return counted

    def __getattr__(self, name: str) -> Any:
        return self._wrap(name, getattr(self.inner, name))


async def test_a_store_error_outside_a_pass_is_logged_and_the_worker_goes_on(wd_store: Store) -> None:
    """A take that fails is retried after the poll interval (the worker does not die), and a last
    answer that fails as ``run`` returns is logged, not raised (the delivery reappears once its
    visibility lapses)."""
    done: list[str] = []

    async def body(run: Run[Any]) -> object:
        done.append(run.workflow)
        return None

    w = wf("flaky-take")
    await wd_store.scheduler.schedule(w)
    flaky = Flaky(wd_store.durable, takes=2, answers=1)
    work = Worker(
        flaky, body, alive=LONG, budget=LONG, visibility=LONG, poll_interval=timedelta(milliseconds=20)
    )
    await asyncio.wait_for(work.run(max_passes=1), 10.0)
    assert done == [w] and flaky.left == {"take": 0, "wake_at": 0, "renew": 0}, (done, flaky.left)


async def test_a_renewal_that_fails_once_does_not_end_the_pass(wd_store: Store) -> None:
    w = wf("flaky-renew")

    async def body(run: Run[Any]) -> object:
        for _ in range(6):
            await asyncio.sleep(0.02)
        return "done"

    await wd_store.scheduler.schedule(w)
    flaky = Flaky(wd_store.durable, renewals=1)
    work = Worker(
        flaky, body, alive=LONG, budget=LONG, visibility=LONG, poll_interval=timedelta(milliseconds=20),
        renew_every=timedelta(milliseconds=10),
    )  # fmt: skip
    await asyncio.wait_for(work.run(max_passes=1), 10.0)
    assert flaky.left["renew"] == 0, "the renewal tick never ran"
    assert (await wd_store.checkpointer.load(w)).get(FINISHED) == "done"


async def test_a_result_the_store_cannot_hold_fails_the_workflow_at_once(wd_store: Store) -> None:
    """A body's return value the codec refuses (``InvalidValue``) fails the workflow on that pass:
    retrying could not change it."""
    from without_durability import status_of

    w = wf("unstorable")

    async def body(run: Run[Any]) -> object:
        return {1, 2}  # a set: no JSON

    await wd_store.scheduler.schedule(w)
    work = worker(wd_store, wd_store.durable, body, alive=LONG, retry=RetryPolicy(maximum_attempts=5))
    await work.run(max_passes=1)
    status = status_of(await wd_store.checkpointer.load(w))
    assert status.state == "failed" and status.attempts == 1, status


async def test_a_pass_the_tick_finds_superseded_is_cancelled_and_answers_nothing(wd_store: Store) -> None:
    """The body is inside no Run operation (a long await of its own) when its claim is taken away:
    the renewal tick meets the fence, cancels the pass, and the worker returns without recording
    or answering anything."""
    w = wf("superseded-tick")
    started = asyncio.Event()

    async def body(run: Run[Any]) -> object:
        started.set()
        await asyncio.sleep(30)
        return "never"

    await wd_store.scheduler.schedule(w)
    work = worker(wd_store, wd_store.durable, body, alive=LONG, renew_every=timedelta(milliseconds=20))
    running = asyncio.ensure_future(work.run(max_passes=1))
    await asyncio.wait_for(started.wait(), 5.0)
    await wd_store.checkpointer.discard(w)
    await asyncio.wait_for(running, 10.0)
    assert FINISHED not in await wd_store.checkpointer.load(w)


def test_options_are_keyword_only() -> None:
    """Worker's settings and run's limits are keyword-only, as documented: a positional one is a
    TypeError, never taken for another setting."""
    import inspect

    made = inspect.signature(Worker.__init__).parameters
    for name in ("alive", "budget", "visibility", "poll_interval", "retry_contended", "renew_every", "wakeup", "retry"):
        assert made[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    limits = inspect.signature(Worker.run).parameters
    assert limits["until"].kind is limits["max_passes"].kind is inspect.Parameter.KEYWORD_ONLY


async def test_max_passes_past_the_small_integers_still_stops_the_worker(wd_store: Store) -> None:
    """``run(max_passes=n)`` returns after n passes for any n (compared by value: 300 is past the
    integers CPython keeps one object of)."""
    n = 300
    done: list[str] = []
    for i in range(n):
        await wd_store.scheduler.schedule(wf(f"many-{i}"))
    work = _idler(wd_store, done, poll=30.0)
    await asyncio.wait_for(work.run(max_passes=n), 60.0)
    assert len(done) == n and work.passes == n, (len(done), work.passes)
