"""Mutants of the runtime (``Worker``, ``Run``, ``RetryPolicy``): each a plausible slip in the
library's own code that breaks a promise its docstring makes, judged where the library's own Worker
runs: by the simulator, and by wd-chaos runs whose workers are library Workers (long-wait,
budget-overrun), both on SQLite, a store the harness can share between processes, and on Redis by
one whose store restarts during a takeover (recovery-restart). The Memory kit names this module in
``mutant_modules``; a mutant's ``store`` is where its killers run it.

A store mutant swaps one part of a durable; the runtime is no part of one, so a runtime mutant's
``wrap`` (``RuntimeSlip``) puts its broken method on the runtime class itself, in the process that
opens the mutant, for that process's life, and hands the durable back unchanged. That is why these
name only harness killers (``sim:``, ``chaos:``): each such run opens its mutant in processes of its
own (``wd-chaos sim --mutant``, a wd-chaos run's workers), never beside a real store in one pytest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Never, cast

from .._values import Delivery, Pass, Recorded
from ..errors import Contended, Fenced, StoreError, StoreUnavailable, Suspended, Swallowed
from ..lifecycle import RetryPolicy, Status, error_key, error_record, failed_key, failure_record, status_of
from ..protocols import TakesAndClaims
from ..rules import check_key, lifecycle_writes
from ..run import Run, Sleeping, run_loaded
from ..testing.mutants import Mutant
from ..worker import Worker


class RuntimeSlip:
    """A ``wrap`` that sets the method ``cls.name`` to ``method`` in this process, once, and returns
    the durable as it is. ``method`` may call the real one as ``slip.original``."""

    def __init__(self, cls: type, name: str, method: Callable[..., Any]) -> None:
        self.cls = cls
        self.name = name
        self.method = method
        self.original: Callable[..., Any] = getattr(cls, name)

    def __call__(self, durable: Any) -> Any:
        if getattr(self.cls, self.name) is not self.method:
            setattr(self.cls, self.name, self.method)
        return durable


async def _sleep_from_each_pass(self: Run[Any], key: str, until: datetime | timedelta) -> datetime:
    """``Run.sleep`` that measures a ``timedelta`` from this pass's now and waits for that, not for
    the deadline recorded the first time: every pass sleeps anew, and the workflow never wakes."""
    check_key(self.workflow, key)
    if isinstance(until, timedelta):
        until = await self._durable.scheduler.now() + until
    self._enter()
    try:
        if key not in self._records:
            text = until.astimezone(UTC).isoformat()
            recorded = await self._write(self._durable.checkpointer.record(self._pass, key, text))
            self._records[key] = recorded.value
        if await self._durable.scheduler.now() < until:  # the slip: this pass's deadline, not the record's
            self._wait(key, until)
    finally:
        self._leave()
    return until


async def _effect_before_lookup(
    self: Run[Any], key: str, effect: Callable[[], Awaitable[object]]
) -> tuple[object, Recorded | None]:
    """``Run._checkpoint`` (behind ``step`` and the dag's nodes) that runs the effect before it
    looks whether ``key`` is recorded: every later pass runs every recorded step's effect again."""
    check_key(self.workflow, key)
    self._enter()
    try:
        self._unwaited(key)
        produced = await effect()  # the slip: the effect first, the lookup after
        if key in self._records:
            return None, None
        recorded = await self._write(self._durable.checkpointer.record(self._pass, key, produced))
        self._records[key] = recorded.value
        return produced, recorded
    finally:
        self._leave()


async def _contended_answered_as_done(self: Worker[Any]) -> bool:
    """``Worker._step`` that answers a ``Contended`` claim's delivery with nothing (removing it),
    as for a finished pass, instead of for ``retry_contended`` later: a wakeup taken while another
    pass holds the workflow is dropped, and the holder may have read its wait before it landed."""
    records: dict[str, object] | None = None
    if self._answer is None and self._has(self.durable, TakesAndClaims):
        taken = await cast(TakesAndClaims, self.durable).take_and_claim(
            self.visibility, alive=self.alive, budget=self.budget
        )
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
        self._answer = (delivery, None)  # the slip: no retry time
        return True
    await self._drive(delivery, claimed, records)
    return True


async def _takeover_gives_up_when_unavailable(
    self: Worker[Any], delivery: Delivery, pass_: Pass, records: dict[str, object] | None
) -> None:
    """``Worker._drive`` (the pass that resumes what a dead holder left: its load and its body)
    that, when the store is unavailable (``StoreUnavailable``, a restart), gives the workflow up:
    it answers the delivery with nothing, as if the pass had ended, instead of leaving it to
    reappear once its visibility lapses. A workflow taken over as the store restarts is stranded."""
    checkpointer = self.durable.checkpointer
    if records is None:
        try:
            records = await checkpointer.load(pass_.workflow)
        except StoreError as exc:
            await self._store_failed(pass_, exc)
            if isinstance(exc, StoreUnavailable):
                self._answer = (delivery, None)  # the slip: "the store is gone; drop it"
            return
    status = status_of(records)
    if status.state != "open":
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
    except Fenced:
        return
    except asyncio.CancelledError:
        if fenced:
            return
        raise
    except (Exception, BaseExceptionGroup) as exc:
        failure = exc
    finally:
        ended.set()
        ticker.cancel()
        await asyncio.wait({ticker})
    if fenced:
        return
    if isinstance(failure, StoreError):
        await self._store_failed(pass_, failure)
        if isinstance(failure, StoreUnavailable):
            self._answer = (delivery, None)  # the slip, again
        return
    try:
        if failure is not None:
            at = await self._failed(pass_, status, failure)
        else:
            at = await self._ended(pass_, status, outcome)
    except Fenced:
        return
    except StoreError as exc:
        await self._store_failed(pass_, exc)
        return
    await checkpointer.release(pass_)
    self._answer = (delivery, at)


def _exhausted_one_late(self: RetryPolicy, attempts: int) -> bool:
    """``RetryPolicy.exhausted`` with ``>`` where ``>=`` was meant: a workflow gets one failed pass
    more than ``maximum_attempts`` allows."""
    return self.maximum_attempts > 0 and attempts > self.maximum_attempts


def _retryable_inverted(self: RetryPolicy, error: BaseException) -> bool:
    """``RetryPolicy.retryable`` with its test inverted: only the listed non-retryable types are
    retried, so an ordinary failure fails its workflow at its first attempt."""
    for kind in type(error).__mro__:
        if {kind.__name__, f"{kind.__module__}.{kind.__qualname__}"} & set(self.non_retryable_error_types):
            return True
    return False  # the slip: the two answers swapped


def _wait_without_deadline(self: Run[Any], key: str, until: datetime | None) -> Never:
    """``Run._wait`` that writes every wait onto the Run without its deadline, so a sleep reads as
    a wait for an arrival: the pass ends ``Blocked`` and nothing wakes it at its deadline."""
    self._waits.setdefault(key, None)  # the slip: until dropped
    raise Suspended(key)


async def _failure_counted_as_the_last(
    self: Worker[Any], pass_: Pass, status: Status, error: BaseException, *, retryable: bool = True
) -> datetime | None:
    """``Worker._failed`` numbering a failed pass ``status.attempts`` instead of one more: each
    failure's record lands on the previous one's key (first writer wins), so the count never grows
    and the workflow is retried past ``maximum_attempts``, for ever."""
    attempt = status.attempts  # the slip: + 1 dropped
    final = (
        not retryable
        or isinstance(error, Swallowed)
        or not self.retry.retryable(error)
        or self.retry.exhausted(attempt)
    )
    record = self.durable.checkpointer.record
    with lifecycle_writes():
        await record(pass_, error_key(status.generation, attempt), error_record(error, attempt))
        if final:
            await record(pass_, failed_key(status.generation), failure_record(error, attempt))
            return None
    return await self.durable.scheduler.now() + self.retry.delay(attempt)


_ended_slip: RuntimeSlip


async def _sleep_answered_as_blocked(
    self: Worker[Any], pass_: Any, status: Any, outcome: Any
) -> datetime | None:
    """``Worker._ended`` that answers a ``Sleeping`` pass as it answers a ``Blocked`` one (nothing:
    the delivery is removed), so a sleeper wakes only if something else schedules it."""
    if isinstance(outcome, Sleeping):
        return None
    result: datetime | None = await _ended_slip.original(self, pass_, status, outcome)
    return result


_sleep_slip = RuntimeSlip(Run, "sleep", _sleep_from_each_pass)
_checkpoint_slip = RuntimeSlip(Run, "_checkpoint", _effect_before_lookup)
_step_slip = RuntimeSlip(Worker, "_step", _contended_answered_as_done)
_ended_slip = RuntimeSlip(Worker, "_ended", _sleep_answered_as_blocked)
_exhausted_slip = RuntimeSlip(RetryPolicy, "exhausted", _exhausted_one_late)
_retryable_slip = RuntimeSlip(RetryPolicy, "retryable", _retryable_inverted)
_wait_slip = RuntimeSlip(Run, "_wait", _wait_without_deadline)
_failed_slip = RuntimeSlip(Worker, "_failed", _failure_counted_as_the_last)
_drive_slip = RuntimeSlip(Worker, "_drive", _takeover_gives_up_when_unavailable)

MUTANTS = [
    Mutant(
        "runtime-sleep-restarts-each-pass",
        "sqlite",
        "sleep-until-the-recorded-deadline",
        "Run.sleep waits for a deadline measured from each pass's now, not the one it recorded first",
        ("sim:lease-stall:liveness", "chaos:long-wait:lifecycle-liveness"),
        _sleep_slip,
    ),
    Mutant(
        "runtime-worker-answers-a-sleep-as-blocked",
        "sqlite",
        "a-sleeping-pass-wakes-at-its-deadline",
        "Worker answers a Sleeping pass with no wakeup time, as a Blocked one: its delivery is removed",
        ("sim:lease-stall:liveness", "chaos:long-wait:lifecycle-liveness"),
        _ended_slip,
    ),
    Mutant(
        "runtime-step-runs-its-effect-before-the-lookup",
        "sqlite",
        "a-recorded-step-is-not-run-again",
        "Run.step runs its effect before it looks for the key's record: every replay repeats it",
        ("sim:lease-stall:at-least-once", "chaos:long-wait:no-rerun"),
        _checkpoint_slip,
    ),
    Mutant(
        "runtime-worker-drops-a-contended-delivery",
        "sqlite",
        "a-contended-claim-is-answered-for-later",
        "Worker answers a Contended claim's delivery with nothing instead of retry_contended later",
        ("sim:lease-stall:liveness", "chaos:budget-overrun:liveness"),
        _step_slip,
    ),
    Mutant(
        "runtime-retry-one-attempt-too-many",
        "sqlite",
        "a-failing-workflow-stops-at-its-attempt-limit",
        "RetryPolicy.exhausted compares attempts with > instead of >=: one failed pass too many",
        ("chaos:long-wait:attempt-limit",),
        _exhausted_slip,
    ),
    Mutant(
        "runtime-retry-gives-up-at-once",
        "sqlite",
        "a-failing-workflow-is-retried-until-its-limit",
        "RetryPolicy.retryable answers the other way round: an ordinary error is final at once",
        ("chaos:long-wait:attempt-limit",),
        _retryable_slip,
    ),
    Mutant(
        "runtime-wait-loses-its-deadline",
        "sqlite",
        "a-sleeping-pass-wakes-at-its-deadline",
        "Run writes a wait onto itself without its deadline: a sleep ends its pass Blocked, not Sleeping",
        ("sim:lease-stall:liveness", "chaos:long-wait:lifecycle-liveness"),
        _wait_slip,
    ),
    Mutant(
        "runtime-worker-numbers-a-failure-as-the-last",
        "sqlite",
        "a-failing-workflow-stops-at-its-attempt-limit",
        "Worker numbers a failed pass status.attempts, not one more: the count never grows",
        ("chaos:long-wait:attempt-limit",),
        _failed_slip,
    ),
    Mutant(
        "runtime-worker-gives-up-a-takeover-when-unavailable",
        "redis-set",
        "a-pass-the-store-failed-runs-again",
        "Worker answers a pass that met StoreUnavailable (a takeover as the store restarts) with "
        "nothing, removing its delivery, instead of letting it reappear after its visibility",
        ("chaos:recovery-restart:liveness",),
        _drive_slip,
    ),
]
