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
from typing import Generic, Never, Protocol

from typing_extensions import TypeVar

from ._values import Delivery, Pass
from .errors import Contended, Fenced, InvalidInput
from .protocols import AnswersAndTakes, Durable
from .run import Blocked, Finished, Run, Sleeping, resume

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
    before it; and it is sent on its own when ``run`` returns.

    - A ``Contended`` claim answers its delivery for ``retry_contended`` later.
    - A fenced pass (``Fenced`` from a write or from the renewal tick) stops at once: the body is
      cancelled, nothing is answered or released, and no compensation runs in it (``Fenced`` is a
      ``BaseException``). The pass that superseded it owns the workflow now.
    - A body that fails (an ordinary exception, ``Swallowed`` included) is logged and its claim
      released; its delivery is left unanswered, so it reappears once ``visibility`` lapses.
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
        self.passes = 0
        """Deliveries this worker has handled (claimed or contended) since it was made."""
        self._stopping = asyncio.Event()
        self._answer: tuple[Delivery, datetime | None] | None = None

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
            for waiter in (woken, stopped):
                waiter.cancel()
            await asyncio.gather(woken, stopped, return_exceptions=True)
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
        delivery = await self._take()
        if delivery is None:
            return False
        self.passes += 1
        try:
            pass_ = await self.durable.checkpointer.claim(
                delivery.workflow, alive=self.alive, budget=self.budget
            )
        except Contended:
            self._answer = (delivery, await scheduler.now() + self.retry_contended)
            return True
        await self._drive(delivery, pass_)
        return True

    async def _take(self) -> Delivery | None:
        """The next delivery; a pending answer goes first, in the same call when the scheduler
        can answer and take at once. An answer that raised stays pending and is sent again (an
        answer acts only on its own receipt, so a repeat is harmless)."""
        scheduler = self.durable.scheduler
        if self._answer is None:
            return await scheduler.take(self.visibility)
        delivery, at = self._answer
        if isinstance(scheduler, AnswersAndTakes):
            taken = await scheduler.answer_and_take(delivery, at, self.visibility)
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

    async def _drive(self, delivery: Delivery, pass_: Pass) -> None:
        fenced: list[Fenced] = []
        task = asyncio.create_task(resume(self.durable, pass_, self.body))
        ticker = asyncio.create_task(self._renew(pass_, task, fenced))
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
        except (Exception, BaseExceptionGroup):  # a group: a TaskGroup's failures and waits
            log.exception(
                "worker: workflow %r failed; it runs again once its delivery's visibility lapses",
                pass_.workflow,
            )
            await self.durable.checkpointer.release(pass_)
            return
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
        if fenced:  # the pass ended just as the tick found it superseded: answer nothing
            log.info("worker: %s", fenced[0])
            return
        # Release before answering: a wakeup that arrived during the pass is visible at once, and
        # whoever takes it should find the claim free rather than Contended.
        await self.durable.checkpointer.release(pass_)
        if isinstance(outcome, Sleeping):
            self._answer = (delivery, outcome.until)
        else:
            assert isinstance(outcome, Finished | Blocked)
            self._answer = (delivery, None)

    async def _renew(
        self, pass_: Pass, task: asyncio.Task[Finished | Sleeping | Blocked], fenced: list[Fenced]
    ) -> None:
        interval = self.renew_every.total_seconds()
        while True:
            await asyncio.sleep(interval)
            try:
                await self.durable.checkpointer.renew(pass_)
            except Fenced as exc:
                fenced.append(exc)
                task.cancel()
                return
            except Exception:  # the store is unreachable: the pass's own writes will say so
                log.warning("worker: renewing %r failed", pass_.workflow, exc_info=True)
