"""A workflow's lifecycle, kept in its own records: finished, failed, or still open.

The Worker writes these records itself, under the reserved ``wd/`` prefix that ``record`` and
``supply`` refuse from callers, so they travel through any store's ordinary first-writer-wins
``record`` (under the pass's fence) and show in ``load`` like every other record:

- ``wd/finished``: the body's return value. Written when a body returns; the workflow never runs
  its body again (a later pass finds it and ends at once).
- ``wd/error/<g>/<n>``: ``{"type", "message", "attempt"}`` for the ``n``-th pass of generation
  ``g`` whose body raised. One key per attempt, because records are first-writer-wins and cannot
  be updated: the attempt count is the number of these keys, so it lives in the store and survives
  worker restarts, and fencing makes every pass that writes one see all the earlier ones.
- ``wd/failed/<g>``: ``{"error_type", "message", "attempts"}`` once generation ``g`` ran out of
  attempts (or met a non-retryable error, or ``Swallowed``). The body is not run again.
- ``wd/rearmed/<g>``: written by ``rearm`` to open generation ``g + 1``: records cannot be deleted
  one by one, so a failure is put behind rather than erased, and the attempt count starts again.

``RetryPolicy`` decides how long to wait between failed passes (a scheduler wakeup, never a sleep in
the worker) and when to stop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from .errors import InvalidInput, WithoutDurabilityError
from .protocols import Durable
from .rules import RESERVED_PREFIX, check_workflow, lifecycle_writes

FINISHED = f"{RESERVED_PREFIX}finished"
"""The key a finished workflow's result is recorded under."""

_ERROR = f"{RESERVED_PREFIX}error/"
_FAILED = f"{RESERVED_PREFIX}failed/"
_REARMED = f"{RESERVED_PREFIX}rearmed/"

MAX_MESSAGE = 2000
"""Error messages are recorded up to this many characters."""


def error_key(generation: int, attempt: int) -> str:
    """The key of the ``attempt``-th failed pass of ``generation`` (zero-padded so keys sort)."""
    return f"{_ERROR}{generation}/{attempt:06d}"


def failed_key(generation: int) -> str:
    """The key that marks ``generation`` failed."""
    return f"{_FAILED}{generation}"


def rearmed_key(generation: int) -> str:
    """The key ``rearm`` writes to put the failure of ``generation`` behind."""
    return f"{_REARMED}{generation}"


@dataclass(frozen=True, slots=True)
class Status:
    """What a workflow's records say about its lifecycle (``status_of``).

    ``state`` is ``"finished"`` (``result`` holds the body's return value), ``"failed"``
    (``failure`` holds the failure record; only ``rearm`` lets it run again) or ``"open"`` (it may
    still run: waiting, due, or never run). ``generation`` counts re-arms; ``attempts`` counts the
    failed passes of the current generation.
    """

    state: Literal["open", "finished", "failed"]
    generation: int
    attempts: int
    result: object = None
    failure: object = None


def status_of(records: Mapping[str, object]) -> Status:
    """The lifecycle ``records`` (a ``load``) describe; reads only ``wd/`` keys."""
    generation = sum(1 for key in records if key.startswith(_REARMED))
    prefix = f"{_ERROR}{generation}/"
    attempts = sum(1 for key in records if key.startswith(prefix))
    if FINISHED in records:
        return Status("finished", generation, attempts, result=records[FINISHED])
    if failed_key(generation) in records:
        return Status("failed", generation, attempts, failure=records[failed_key(generation)])
    return Status("open", generation, attempts)


class WorkflowFailed(WithoutDurabilityError):
    """The workflow is failed (``wd/failed/<g>`` is recorded): its body is not run until an operator
    calls ``rearm``. ``failure`` is the failure record."""

    def __init__(self, workflow: str, failure: object) -> None:
        self.workflow = workflow
        self.failure = failure
        super().__init__(
            f"workflow {workflow!r} has failed ({failure!r}); its body does not run again until "
            "rearm(durable, workflow) is called"
        )


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How the Worker retries a body that raised, with Temporal's names and defaults.

    The ``n``-th failed pass is retried ``initial_interval * backoff_coefficient ** (n - 1)`` later,
    at most ``maximum_interval`` (None: 100 times ``initial_interval``), as a scheduler wakeup. After
    ``maximum_attempts`` failed passes (0: never give up) the workflow is failed. An error whose
    type's name (``ValueError``) or qualified name (``mymodule.Declined``), or a base class's, is in
    ``non_retryable_error_types`` fails it at once, as ``Swallowed`` always does.
    """

    initial_interval: timedelta = timedelta(seconds=1)
    backoff_coefficient: float = 2.0
    maximum_interval: timedelta | None = None
    maximum_attempts: int = 0
    non_retryable_error_types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.initial_interval, timedelta) or self.initial_interval <= timedelta(0):
            raise InvalidInput(
                f"RetryPolicy initial_interval must be a positive timedelta, got {self.initial_interval!r}"
            )
        coefficient = self.backoff_coefficient
        if not isinstance(coefficient, int | float) or not math.isfinite(coefficient) or coefficient < 1:
            raise InvalidInput(f"RetryPolicy backoff_coefficient must be a number >= 1, got {coefficient!r}")
        if self.maximum_interval is not None and (
            not isinstance(self.maximum_interval, timedelta) or self.maximum_interval < self.initial_interval
        ):
            raise InvalidInput(
                "RetryPolicy maximum_interval must be None or a timedelta no shorter than "
                f"initial_interval ({self.initial_interval}), got {self.maximum_interval!r}"
            )
        attempts = self.maximum_attempts
        if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 0:
            raise InvalidInput(
                f"RetryPolicy maximum_attempts must be an int >= 0 (0: unlimited), got {attempts!r}"
            )
        names: Any = self.non_retryable_error_types
        if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
            raise InvalidInput(
                "RetryPolicy non_retryable_error_types must be a sequence of exception type names "
                f"(e.g. ('ValueError',)), got {names!r}"
            )
        object.__setattr__(self, "non_retryable_error_types", tuple(names))

    def delay(self, attempt: int) -> timedelta:
        """How long after the ``attempt``-th failed pass (1 for the first) the next one runs."""
        cap = self.maximum_interval if self.maximum_interval is not None else 100 * self.initial_interval
        seconds = self.initial_interval.total_seconds()
        # Stop multiplying once past the cap, so a large attempt number cannot overflow a float.
        for _ in range(max(0, attempt - 1)):
            seconds *= self.backoff_coefficient
            if seconds >= cap.total_seconds():
                return cap
        return min(timedelta(seconds=seconds), cap)

    def exhausted(self, attempts: int) -> bool:
        """Whether ``attempts`` failed passes are all this policy allows."""
        return self.maximum_attempts > 0 and attempts >= self.maximum_attempts

    def retryable(self, error: BaseException) -> bool:
        """Whether ``error``'s type (or a base class), by name or qualified name, is retryable."""
        for kind in type(error).__mro__:
            if {kind.__name__, f"{kind.__module__}.{kind.__qualname__}"} & set(self.non_retryable_error_types):
                return False
        return True


def error_record(error: BaseException, attempt: int) -> dict[str, object]:
    """The value of a ``wd/error/<g>/<n>`` record: the error's type, message and attempt number."""
    return {"type": type(error).__name__, "message": str(error)[:MAX_MESSAGE], "attempt": attempt}


def failure_record(error: BaseException, attempts: int) -> dict[str, object]:
    """The value of a ``wd/failed/<g>`` record."""
    return {"error_type": type(error).__name__, "message": str(error)[:MAX_MESSAGE], "attempts": attempts}


async def rearm(durable: Durable[Any], workflow: str) -> None:
    """Let a failed workflow run again: record ``wd/rearmed/<g>`` (which starts generation ``g + 1``
    with no attempts counted) and schedule it now, in one ``Durable.arrive``.

    Raises ``InvalidInput`` if the workflow is not failed (nothing to re-arm). Two concurrent calls
    both succeed and re-arm once (first writer wins). The failure and error records of earlier
    generations stay, visible through ``load``.
    """
    check_workflow(workflow)
    status = status_of(await durable.checkpointer.load(workflow))
    if status.state != "failed":
        raise InvalidInput(
            f"workflow {workflow!r} is {status.state}, not failed: there is nothing to re-arm"
        )
    with lifecycle_writes():
        await durable.arrive(workflow, rearmed_key(status.generation), {"failure": status.failure})
