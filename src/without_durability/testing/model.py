"""The model test: a Hypothesis state machine drives the store under test and the reference model
(``reference.Reference``: a plain-dict model of the contract written apart from every store, the
Memory store included) side by side, and checks after every step that they agree.

Time is a rule. On a fake clock both clocks jump together. On a server's clock the rule waits for
real, and every deadline the machine can set sits on a half unit while time only ever moves by whole
units, so the round trips between steps (kept below a fifth of a unit by catching up when they grow)
can never carry a check across a deadline the model did not cross.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from .._values import Delivery, Pass, Recorded
from ..errors import Contended, Fenced
from ..rules import INBOX_PREFIX
from .harness import StoreFactory, StoreUnderTest
from .reference import Receipt, Reference

WORKFLOWS = ("w0", "w1")
KEYS = ("a", "b", "c")
VALUES = st.one_of(
    st.integers(-3, 3),
    st.sampled_from(["", "x", "yy"]),
    st.tuples(st.integers(0, 2), st.integers(0, 2)),
    st.lists(st.integers(0, 2), max_size=2),
    st.dictionaries(st.sampled_from(["k", "j"]), st.integers(0, 2), max_size=2),
)
HALVES = st.sampled_from([1, 3, 5, 9])  # deadlines in half units: never a whole unit


def _outcome(result: object) -> str:
    return type(result).__name__


class _Machine(RuleBasedStateMachine):
    factory: StoreFactory
    server: Any
    unit: timedelta

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self._cm: AbstractAsyncContextManager[StoreUnderTest[Any]] = self.factory.open(self.server)
        self.sut: StoreUnderTest[Any] = self.loop.run_until_complete(self._cm.__aenter__())
        self.real = self.sut.clock.real
        self.ref = Reference()
        self.passes: list[tuple[Pass, Pass]] = []
        self.deliveries: list[tuple[Delivery, Receipt]] = []  # the store's, and the model's receipt
        self.inbox: dict[str, dict[str, str]] = {w: {} for w in WORKFLOWS}
        self.last_token: dict[str, int] = {}
        self.elapsed = 0.0  # model seconds since the start
        self.started = time.monotonic()

    def teardown(self) -> None:
        try:
            self.loop.run_until_complete(self._cm.__aexit__(None, None, None))
        finally:
            self.loop.close()

    # -- plumbing ------------------------------------------------------------------------

    def run(self, coro: Any) -> Any:
        try:
            return self.loop.run_until_complete(coro)
        except (Fenced, Contended) as exc:
            return exc

    def model(self, step: Any, *args: Any) -> Any:
        try:
            return step(*args)
        except (Fenced, Contended) as exc:
            return exc

    def half(self, n: int) -> timedelta:
        return self.unit * n / 2

    def catch_up(self) -> None:
        """On a server's clock, keep real time within a fifth of a unit of model time."""
        if not self.real:
            return
        drift = time.monotonic() - self.started - self.elapsed
        if drift > 0.2 * self.unit.total_seconds():
            self.move(self.unit)

    def move(self, by: timedelta) -> None:
        self.elapsed += by.total_seconds()
        self.ref.advance(by)
        if self.real:
            wait = self.started + self.elapsed - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        else:
            self.run(self.sut.clock.advance(by))

    def pick(self, items: list[Any], index: int) -> Any:
        return items[index % len(items)]

    # -- time ----------------------------------------------------------------------------

    @rule(units=st.integers(1, 3))
    def advance(self, units: int) -> None:
        self.move(self.unit * units)

    # -- checkpointer --------------------------------------------------------------------

    @rule(w=st.sampled_from(WORKFLOWS), alive=HALVES, budget=HALVES)
    def claim(self, w: str, alive: int, budget: int) -> None:
        self.catch_up()
        got = self.run(self.sut.checkpointer.claim(w, alive=self.half(alive), budget=self.half(budget)))
        want = self.model(self.ref.claim, w, self.half(alive), self.half(budget))
        assert _outcome(got) == _outcome(want), f"claim {w}: store {got!r}, model {want!r}"
        if isinstance(got, Pass):
            assert got.token > self.last_token.get(w, -(2**63)), (
                f"claim {w}: token {got.token} not above {self.last_token.get(w)}"
            )
            self.last_token[w] = got.token
            self.passes.append((got, want))

    @rule(i=st.integers(0, 50))
    def renew(self, i: int) -> None:
        if not self.passes:
            return
        self.catch_up()
        real, model = self.pick(self.passes, i)
        got, want = self.run(self.sut.checkpointer.renew(real)), self.model(self.ref.renew, model)
        assert _outcome(got) == _outcome(want), f"renew {real}: store {got!r}, model {want!r}"

    @rule(i=st.integers(0, 50))
    def release(self, i: int) -> None:
        if not self.passes:
            return
        real, model = self.pick(self.passes, i)
        self.run(self.sut.checkpointer.release(real))
        self.ref.release(model)

    @rule(i=st.integers(0, 50), key=st.sampled_from(KEYS), value=VALUES)
    def record(self, i: int, key: str, value: object) -> None:
        if not self.passes:
            return
        self.catch_up()
        real, model = self.pick(self.passes, i)
        got = self.run(self.sut.checkpointer.record(real, key, value))
        want = self.model(self.ref.record, model, key, value)
        assert _outcome(got) == _outcome(want) and (not isinstance(got, Recorded) or got == want), (
            f"record {real} {key}={value!r}: store {got!r}, model {want!r}"
        )

    @rule(w=st.sampled_from(WORKFLOWS), key=st.sampled_from(KEYS), value=VALUES)
    def supply(self, w: str, key: str, value: object) -> None:
        got = self.run(self.sut.checkpointer.supply(w, key, value))
        want = self.ref.supply(w, key, value)
        assert got == want, f"supply {w} {key}={value!r}: store {got!r}, model {want!r}"

    @rule(w=st.sampled_from(WORKFLOWS), value=VALUES)
    def append(self, w: str, value: object) -> None:
        got = self.run(self.sut.checkpointer.append(w, value))
        want = self.ref.append(w, value)
        assert isinstance(got, str) and got.startswith(INBOX_PREFIX), f"append key {got!r}"
        earlier = list(self.inbox[w].values())
        assert all(k < got for k in earlier), f"append {w}: key {got} does not sort after {earlier}"
        self.inbox[w][want] = got

    @rule(w=st.sampled_from(WORKFLOWS))
    def discard(self, w: str) -> None:
        self.run(self.sut.durable.discard(w))
        self.ref.discard(w)
        self.inbox[w] = {}

    @rule(i=st.integers(0, 50), key=st.sampled_from(KEYS), amount=st.integers(1, 3))
    def transact(self, i: int, key: str, amount: int) -> None:
        if not self.passes:
            return
        self.catch_up()
        real, model = self.pick(self.passes, i)
        effect = self.sut.effects.ledger_add(real.workflow, amount)

        def model_effect(ledger: dict[str, int]) -> object:
            ledger[model.workflow] = ledger.get(model.workflow, 0) + amount
            return ledger[model.workflow]

        got = self.run(self.sut.checkpointer.transact(real, key, effect))
        want = self.model(self.ref.transact, model, key, model_effect)
        assert _outcome(got) == _outcome(want) and (not isinstance(got, Recorded) or got == want), (
            f"transact {real} {key} +{amount}: store {got!r}, model {want!r}"
        )

    # -- scheduler -----------------------------------------------------------------------

    @rule(w=st.sampled_from(WORKFLOWS), delay=st.sampled_from([None, 1, 3]))
    def schedule(self, w: str, delay: int | None) -> None:
        self.catch_up()
        if delay is None:
            self.run(self.sut.scheduler.schedule(w))
            self.ref.schedule(w)
        else:
            at = self.run(self.sut.scheduler.now()) + self.half(delay)
            self.run(self.sut.scheduler.schedule(w, at))
            self.ref.schedule(w, self.ref.now + self.half(delay))

    @rule(visibility=st.sampled_from([3, 5]))
    def take(self, visibility: int) -> None:
        self.catch_up()
        got = self.run(self.sut.scheduler.take(self.half(visibility)))
        visible = self.ref.visible()
        if got is None:
            assert not visible, f"take: store had nothing, model had {visible} visible"
            return
        assert got.workflow in visible, f"take: store gave {got.workflow}, model has {visible} visible"
        self.deliveries.append((got, self.ref.take(got.workflow, self.half(visibility))))

    @rule(i=st.integers(0, 50), delay=st.sampled_from([None, 1, 3]))
    def wake_at(self, i: int, delay: int | None) -> None:
        if not self.deliveries:
            return
        self.catch_up()
        real, receipt = self.pick(self.deliveries, i)
        if delay is None:
            self.run(self.sut.scheduler.wake_at(real, None))
            self.ref.wake_at(real.workflow, receipt, None)
        else:
            at = self.run(self.sut.scheduler.now()) + self.half(delay)
            self.run(self.sut.scheduler.wake_at(real, at))
            self.ref.wake_at(real.workflow, receipt, self.ref.now + self.half(delay))

    @precondition(lambda self: not self.real)  # it moves time by units: seconds on a server's clock
    @rule(
        w=st.sampled_from(WORKFLOWS),
        visibility=st.sampled_from([3, 5]),
        delay=st.sampled_from([None, 0, 1, 3]),
        again=st.booleans(),
    )
    def stale_answer_after_retake(self, w: str, visibility: int, delay: int | None, again: bool) -> None:
        """The sequence a queue that answers by id gets wrong, in one step: a workflow scheduled
        (twice, or once), taken, taken again once that visibility ran out, the first take answered
        late (done, due now, or later), then a take that must agree with the model."""
        self.schedule(w, None)
        if again:
            self.schedule(w, None)
        first = len(self.deliveries)
        self.take(visibility)
        if len(self.deliveries) == first:
            return
        self.move(self.half(visibility + 1))
        self.take(visibility)
        self.wake_at(first, delay)
        self.take(visibility)

    @rule(w=st.sampled_from(WORKFLOWS))
    def cancel(self, w: str) -> None:
        self.run(self.sut.scheduler.cancel(w))
        self.ref.cancel(w)

    # -- agreement -----------------------------------------------------------------------

    @invariant()
    def records_agree(self) -> None:
        for w in WORKFLOWS:
            got = self.run(self.sut.checkpointer.load(w))
            want = {self.inbox[w].get(k, k): v for k, v in self.ref.load(w).items()}
            assert list(got.items()) == list(want.items()), f"load {w}: store {got!r}, model {want!r}"
            hist = self.run(self.sut.checkpointer.history(w))
            assert [(e.key, e.value) for e in hist] == list(got.items()), (
                f"history {w} disagrees with load: {hist!r} vs {got!r}"
            )
            times = [e.written_at for e in hist]
            assert times == sorted(times), f"history {w}: written_at out of order {times}"
            ledger = self.run(self.sut.effects.ledger_read(w))
            assert ledger == self.ref.ledger.get(w, 0), (
                f"ledger {w}: store {ledger}, model {self.ref.ledger.get(w, 0)}"
            )


def check_against_model(factory: StoreFactory, server: Any) -> None:
    """Run the state machine for ``factory``: many examples on a fake clock, fewer and shorter ones
    on a server's clock (each time rule there is a real wait)."""
    probe = asyncio.new_event_loop()
    try:

        async def is_real() -> bool:
            async with factory.open(server) as sut:
                return sut.clock.real

        real = probe.run_until_complete(is_real())
    finally:
        probe.close()
    machine = type(
        f"ModelOf_{factory.name.replace('-', '_')}",
        (_Machine,),
        {
            "factory": factory,
            "server": server,
            "unit": timedelta(seconds=0.5) if real else timedelta(seconds=10),
        },
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=12 if real else 150,
            stateful_step_count=14 if real else 40,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


def test_store_agrees_with_reference_model(wd_factory: tuple[StoreFactory, Any]) -> None:
    """The store under test (Memory too) and the reference model agree after every step of random
    operations."""
    factory, server = wd_factory
    check_against_model(factory, server)
