"""The worker loop: take a due workflow, claim it, run a pass with a renewal tick, answer, release.

A worker touches the store only through the ``Durable`` it is given (its ``checkpointer``, its
``scheduler``), so wrapping that object sees every call the worker makes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Generic, Never, Protocol, cast

from typing_extensions import TypeVar

from ._values import Delivery, Pass
from .errors import Contended, Fenced, InvalidInput, InvalidValue, StoreError, Swallowed
from .lifecycle import (
    FINISHED,
    RetryPolicy,
    Status,
    error_key,
    error_record,
    failed_key,
    failure_record,
    status_of,
)
from .protocols import AnswersAndTakes, Durable, TakesAndClaims
from .rules import lifecycle_writes
from .run import Blocked, Finished, Outcome, Run, Sleeping, run_loaded

E = TypeVar("E", default=Never)

log = logging.getLogger("without_durability.worker")


class Wakeup(Protocol):
    """A way to hear that work may be due, so an idle worker need not sleep out its poll interval
    (``PostgresWakeup``, ``RedisStreamScheduler``). A wakeup is a hint, never a guarantee: the
    worker still takes after every ``poll_interval``, so a lost wakeup costs latency, not work."""

    async def wait(self, at_most: timedelta) -> None:
        """Return once work may be due, or after ``at_most`` at the latest (early is fine)."""
        ...


class Worker(Generic[E]):
    """Runs passes of ``body`` for whatever workflows ``durable.scheduler`` hands out.

    Each pass: ``take(visibility)``; ``claim(alive, budget)``; ``resume`` while a background tick
    renews the claim every ``renew_every`` (default a third of ``alive``: a step longer than
    ``alive`` but within ``budget`` keeps its claim, and a stalled process loses it after
    ``alive``); then release the claim and answer the delivery with ``wake_at``: the sleep's
    deadline for ``Sleeping``, nothing for ``Finished`` or ``Blocked`` (an arrival makes it
    runnable again). The answer travels with the next take: in one call when the scheduler offers
    ``answer_and_take`` (``AnswersAndTakes``; one round trip on Postgres), else as ``wake_at`` just
    before it; and it is sent on its own when ``run`` returns. A take with no answer to carry (the
    first after idling) is made with the claim and the load in one call when the durable offers
    ``take_and_claim`` (``TakesAndClaims``; one commit on Postgres).

    - A ``Contended`` claim answers its delivery for ``retry_contended`` later.
    - A fenced pass (``Fenced`` from a write or from the renewal tick) stops at once: the body is
      cancelled, nothing is answered or released, and no compensation runs in it (``Fenced`` is a
      ``BaseException``). The pass that superseded it owns the workflow now.
    - Lifecycle (``without_durability.lifecycle``): a body that returns has its result recorded
      under ``wd/finished``; a body that fails (an ordinary exception, ``Swallowed`` included) has
      the failure counted in the store (``wd/error/<g>/<n>``, under the pass's fence) and its
      delivery answered for ``retry.delay(n)`` later, until ``retry`` (a ``RetryPolicy``; default
      unlimited attempts, 1s doubling to 100s) gives up or the error is non-retryable or
      ``Swallowed``: then ``wd/failed/<g>`` is recorded and the delivery removed. A workflow found
      finished or failed is released and answered at once without running its body, whatever
      scheduled it, until ``rearm``. A pass killed outside the body (SIGKILL) counts no attempt,
      nor does a ``StoreError`` (the store failed, not the body): its claim is released and its
      delivery left unanswered, so it reappears once ``visibility`` lapses, as it does when the
      store cannot record the failure.
    - Store errors outside a pass are logged and retried after ``poll_interval``.
    - When nothing is due, the worker waits ``poll_interval``; with a ``wakeup`` it waits on
      ``wakeup.wait(poll_interval)`` instead, so it takes as soon as the wakeup fires and polls
      anyway if it never does (a wakeup that raises is logged and the interval slept out).

    ``visibility`` should exceed ``budget``, or a delivery can reappear while its pass still runs
    (the second pass is then ``Contended``, which is safe but wasteful).
    """

    def __init__(
        self,
        durable: Durable[E],
        body: Callable[[Run[E]], Awaitable[object]],
        *,
        alive: timedelta,
        budget: timedelta,
        visibility: timedelta,
        poll_interval: timedelta,
        retry_contended: timedelta = timedelta(seconds=1),
        renew_every: timedelta | None = None,
        wakeup: Wakeup | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        renew_every = alive / 3 if renew_every is None else renew_every
        for name, value in (
            ("alive", alive),
            ("budget", budget),
            ("visibility", visibility),
            ("poll_interval", poll_interval),
            ("retry_contended", retry_contended),
            ("renew_every", renew_every),
        ):
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise InvalidInput(f"Worker {name} must be a positive timedelta, got {value!r}")
        self.durable = durable
        self.body = body
        self.alive = alive
        self.budget = budget
        self.visibility = visibility
        self.poll_interval = poll_interval
        self.retry_contended = retry_contended
        self.renew_every = renew_every
        self.wakeup = wakeup
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidInput(f"Worker retry must be a RetryPolicy, got {retry!r}")
        self.retry = retry if retry is not None else RetryPolicy()
        self.passes = 0
        """Deliveries this worker has handled (claimed or contended) since it was made."""
        self._stopping = asyncio.Event()
        self._answer: tuple[Delivery, datetime | None] | None = None
        self._capable: dict[tuple[int, type], tuple[object, bool]] = {}

    def _has(self, obj: object, capability: type) -> bool:
        """``isinstance(obj, capability)`` for a runtime Protocol, looked up once per object: a
        Protocol check walks every attribute of the class, and a worker asks on every take."""
        key = (id(obj), capability)
        known = self._capable.get(key)
        if known is None or known[0] is not obj:
            known = self._capable[key] = (obj, isinstance(obj, capability))
        return known[1]

    def stop(self) -> None:
        """Ask ``run`` to return once the current pass (if any) has finished and been answered."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        """Whether ``stop`` has been called."""
        return self._stopping.is_set()

    async def run(self, *, until: Callable[[], bool] | None = None, max_passes: int | None = None) -> None:
        """Take and run passes until ``stop`` is called, ``until()`` is true (checked between
        passes and on every poll), or ``max_passes`` deliveries have been handled. Every pass's
        answer has been sent (or its failure logged) by the time this returns."""
        try:
            while not self._stopping.is_set():
                if until is not None and until():
                    return
                if max_passes is not None and self.passes >= max_passes:
                    return
                try:
                    handled = await self._step()
                except Exception:  # a store error outside a pass: log it, then poll again
                    log.exception("worker: taking or claiming failed; retrying after the poll interval")
                    handled = False
                if not handled:
                    await self._idle()
        finally:
            try:
                await self._send_answer()
            except Exception:
                log.exception(
                    "worker: answering the last delivery failed; it reappears once its visibility lapses"
                )

    async def _idle(self) -> None:
        """Wait out the poll interval, or less if the wakeup fires or ``stop`` is called."""
        timeout = self.poll_interval.total_seconds()
        if self.wakeup is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout)
            return
        woken = asyncio.ensure_future(self.wakeup.wait(self.poll_interval))
        stopped = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait((woken, stopped), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()  # an Event's wait: cancelled, it needs no awaiting
            if not woken.done():  # stopped, timed out or cancelled: the wakeup's wait is ended here
                woken.cancel()
                await asyncio.gather(woken, return_exceptions=True)
        failed = None if woken.cancelled() else woken.exception()
        if failed is not None:  # the wakeup is broken: poll as if there were none
            log.warning("worker: the wakeup failed (%s); sleeping out the poll interval", failed)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout)

    async def serve(self) -> None:
        """``run`` in a process: SIGTERM and SIGINT finish the current pass and return."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        try:
            await self.run()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    async def run_once(self) -> bool:
        """Take one due workflow, handle it and answer it; False when nothing was due."""
        handled = await self._step()
        await self._send_answer()
        return handled

    async def _step(self) -> bool:
        """Take (carrying the previous pass's answer along) and handle one delivery, leaving its
        answer in ``_answer`` for the next take or ``_send_answer``."""
        scheduler = self.durable.scheduler
        records: dict[str, object] | None = None
        if self._answer is None and self._has(self.durable, TakesAndClaims):
            taken = await cast(TakesAndClaims, self.durable).take_and_claim(self.visibility, alive=self.alive, budget=self.budget)
            if taken is None:
                return False
            delivery, claimed, records = taken
            self.passes += 1
        else:
            took = await self._take()
            if took is None:
                return False
            delivery = took
            self.passes += 1
            try:
                claimed = await self.durable.checkpointer.claim(
                    delivery.workflow, alive=self.alive, budget=self.budget
                )
            except Contended:
                claimed = None
        if claimed is None:
            self._answer = (delivery, await scheduler.now() + self.retry_contended)
            return True
        await self._drive(delivery, claimed, records)
        return True

    async def _take(self) -> Delivery | None:
        """The next delivery; a pending answer goes first, in the same call when the scheduler
        can answer and take at once. An answer that raised stays pending and is sent again (an
        answer acts only on its own receipt, so a repeat is harmless)."""
        scheduler = self.durable.scheduler
        if self._answer is None:
            return await scheduler.take(self.visibility)
        delivery, at = self._answer
        if self._has(scheduler, AnswersAndTakes):
            taken = await cast(AnswersAndTakes, scheduler).answer_and_take(delivery, at, self.visibility)
            self._answer = None
            return taken
        await scheduler.wake_at(delivery, at)
        self._answer = None
        return await scheduler.take(self.visibility)

    async def _send_answer(self) -> None:
        """Send the pending answer, if any, on its own."""
        if self._answer is not None:
            delivery, at = self._answer
            await self.durable.scheduler.wake_at(delivery, at)
            self._answer = None

    async def _drive(self, delivery: Delivery, pass_: Pass, records: dict[str, object] | None) -> None:
        """Run one claimed pass on ``records`` (loaded here when None) and leave its answer."""
        checkpointer = self.durable.checkpointer
        if records is None:
            try:
                records = await checkpointer.load(pass_.workflow)
            except StoreError as exc:
                await self._store_failed(pass_, exc)
                return
        status = status_of(records)
        if status.state != "open":  # finished or failed: the body never runs again
            await checkpointer.release(pass_)
            self._answer = (delivery, None)
            return
        fenced: list[Fenced] = []
        ended = asyncio.Event()
        task = asyncio.create_task(run_loaded(self.durable, pass_, records, self.body))
        ticker = asyncio.create_task(self._renew(pass_, task, fenced, ended))
        failure: BaseException | None = None
        try:
            outcome = await task
        except Fenced as exc:
            log.info("worker: %s", exc)
            return  # the newer pass owns the workflow and its delivery now
        except asyncio.CancelledError:
            if fenced:
                log.info("worker: %s", fenced[0])
                return
            raise  # cancelled from outside: propagate
        except (Exception, BaseExceptionGroup) as exc:  # a group: a TaskGroup's failures and waits
            failure = exc
        finally:
            # The tick is told to stop, not only cancelled: a driver that swallows a cancel landing
            # as its call completes (redis-py on Python 3.11) would otherwise keep it renewing for
            # ever, and this pass would never end. It stops after at most the renewal in flight.
            ended.set()
            ticker.cancel()
            # waited for, not awaited: a cancel of this pass from outside propagates from here
            # rather than being taken for the tick's own
            await asyncio.wait({ticker})
        if fenced:  # the pass ended just as the tick found it superseded: answer nothing
            log.info("worker: %s", fenced[0])
            return
        if isinstance(failure, StoreError):  # the store failed, not the body: no attempt counted
            await self._store_failed(pass_, failure)
            return
        try:
            if failure is not None:
                at = await self._failed(pass_, status, failure)
            else:
                at = await self._ended(pass_, status, outcome)
        except Fenced as exc:  # superseded before its lifecycle record landed
            log.info("worker: %s", exc)
            return
        except StoreError as exc:
            await self._store_failed(pass_, exc)
            return
        # Release before answering: a wakeup that arrived during the pass is visible at once, and
        # whoever takes it should find the claim free rather than Contended.
        await checkpointer.release(pass_)
        self._answer = (delivery, at)

    async def _store_failed(self, pass_: Pass, error: StoreError) -> None:
        """Leave the delivery unanswered (it reappears once ``visibility`` lapses) and free the
        claim if the store lets us: the store failed, not the body, so no attempt is counted."""
        log.warning(
            "worker: workflow %r: the store failed (%s); it runs again once its delivery's "
            "visibility lapses",
            pass_.workflow,
            error,
        )
        with contextlib.suppress(Exception):
            await self.durable.checkpointer.release(pass_)

    async def _ended(self, pass_: Pass, status: Status, outcome: Outcome) -> datetime | None:
        """Record a finished body's result; the time to answer the delivery with."""
        if isinstance(outcome, Sleeping):
            return outcome.until
        if isinstance(outcome, Blocked):
            return None
        try:
            with lifecycle_writes():
                await self.durable.checkpointer.record(pass_, FINISHED, outcome.value)
        except InvalidValue as exc:  # the result cannot be stored: retrying cannot change that
            return await self._failed(pass_, status, exc, retryable=False)
        return None

    async def _failed(
        self, pass_: Pass, status: Status, error: BaseException, *, retryable: bool = True
    ) -> datetime | None:
        """Count a failed pass in the store; fail the workflow or pick its retry time."""
        attempt = status.attempts + 1
        final = (
            not retryable
            or isinstance(error, Swallowed)
            or not self.retry.retryable(error)
            or self.retry.exhausted(attempt)
        )
        log.error(
            "worker: workflow %r failed (attempt %d)%s",
            pass_.workflow,
            attempt,
            "; giving up" if final else "",
            exc_info=error,
        )
        record = self.durable.checkpointer.record
        with lifecycle_writes():
            await record(pass_, error_key(status.generation, attempt), error_record(error, attempt))
            if final:
                await record(pass_, failed_key(status.generation), failure_record(error, attempt))
                return None
        return await self.durable.scheduler.now() + self.retry.delay(attempt)

    async def _renew(
        self,
        pass_: Pass,
        task: asyncio.Task[Finished | Sleeping | Blocked],
        fenced: list[Fenced],
        ended: asyncio.Event,
    ) -> None:
        """Renew ``pass_`` every ``renew_every`` until ``ended`` is set (checked after every sleep
        and every renewal, so a cancel the store's driver swallowed cannot keep it going)."""
        interval = self.renew_every.total_seconds()
        while not ended.is_set():
            await asyncio.sleep(interval)
            if ended.is_set():
                return
            try:
                await self.durable.checkpointer.renew(pass_)
            except Fenced as exc:
                fenced.append(exc)
                task.cancel()
                return
            except Exception:  # the store is unreachable: the pass's own writes will say so
                log.warning("worker: renewing %r failed", pass_.workflow, exc_info=True)
