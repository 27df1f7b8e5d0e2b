"""RetryPolicy, status_of and resume on terminal workflows: the lifecycle pieces a caller uses
directly (the Worker's part is in the conformance suite, ``testing/lifecycle.py``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from without_durability import Finished, InvalidInput, RetryPolicy, Run, WorkflowFailed, resume, status_of
from without_durability.lifecycle import FINISHED, error_key, failed_key, rearmed_key
from without_durability.rules import lifecycle_writes
from without_durability.testing.harness import StoreUnderTest

LONG = timedelta(hours=1)
S = timedelta(seconds=1)


def test_delay_backs_off_by_the_coefficient_up_to_the_cap() -> None:
    policy = RetryPolicy()
    got = [policy.delay(n) for n in (1, 2, 3, 7, 8, 1000)]
    assert got == [S, 2 * S, 4 * S, 64 * S, 100 * S, 100 * S], f"default backoff: {got}"
    capped = RetryPolicy(initial_interval=2 * S, backoff_coefficient=3.0, maximum_interval=10 * S)
    assert [capped.delay(n) for n in (1, 2, 3)] == [2 * S, 6 * S, 10 * S]


def test_exhausted_counts_attempts_and_zero_means_unlimited() -> None:
    assert not RetryPolicy().exhausted(10**6)
    three = RetryPolicy(maximum_attempts=3)
    assert [three.exhausted(n) for n in (1, 2, 3, 4)] == [False, False, True, True]


class Declined(ValueError):
    pass


def test_non_retryable_types_match_by_name_qualified_name_or_base() -> None:
    assert not RetryPolicy(non_retryable_error_types=("Declined",)).retryable(Declined())
    assert not RetryPolicy(non_retryable_error_types=("ValueError",)).retryable(Declined())
    qualified = f"{__name__}.Declined"
    assert not RetryPolicy(non_retryable_error_types=(qualified,)).retryable(Declined())
    assert RetryPolicy(non_retryable_error_types=("KeyError",)).retryable(Declined())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("initial_interval", timedelta(0)),
        ("backoff_coefficient", 0.5),
        ("maximum_interval", timedelta(milliseconds=1)),
        ("maximum_attempts", -1),
        ("non_retryable_error_types", "ValueError"),
    ],
)
def test_bad_policies_are_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(InvalidInput, match=field):
        RetryPolicy(**{field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("initial_interval", -S),
        ("backoff_coefficient", "2"),
        ("backoff_coefficient", float("inf")),
        ("maximum_attempts", True),
        ("maximum_attempts", 2.5),
        ("non_retryable_error_types", ("",)),
        ("non_retryable_error_types", (5,)),
    ],
)
def test_the_refusals_hold_past_their_edge(field: str, value: Any) -> None:
    """A negative interval, a coefficient that is no finite number, an attempt count that is a
    bool or a float, an empty name and a name that is no string are refused too, each by name
    (never a TypeError from deeper in)."""
    with pytest.raises(InvalidInput, match=field):
        RetryPolicy(**{field: value})


def test_the_edges_the_docstring_allows_are_accepted() -> None:
    """A coefficient of 1 (a constant interval, with a cap equal to it) and a single attempt are
    policies: refusing them would break callers the docstring lets in."""
    constant = RetryPolicy(initial_interval=2 * S, backoff_coefficient=1, maximum_interval=2 * S)
    assert [constant.delay(n) for n in (1, 2, 5)] == [2 * S, 2 * S, 2 * S]
    assert RetryPolicy(backoff_coefficient=1.5).delay(2) == 1.5 * S
    once = RetryPolicy(maximum_attempts=1)
    assert [once.exhausted(n) for n in (0, 1, 2)] == [False, True, True]


def test_an_error_message_is_kept_to_its_documented_length() -> None:
    from without_durability.lifecycle import MAX_MESSAGE, error_record, failure_record

    long = ValueError("x" * (MAX_MESSAGE + 500))
    assert MAX_MESSAGE == 2000  # the number the docs give
    assert error_record(long, 1)["message"] == "x" * 2000
    assert failure_record(long, 3)["message"] == "x" * 2000


def test_status_reads_generations_attempts_and_terminal_states() -> None:
    assert status_of({"a": 1}).state == "open"
    failed = {error_key(0, 1): {}, error_key(0, 2): {}, failed_key(0): {"attempts": 2}}
    status = status_of(failed)
    assert (status.state, status.generation, status.attempts) == ("failed", 0, 2), status
    rearmed = status_of({**failed, rearmed_key(0): {}, error_key(1, 1): {}})
    assert (rearmed.state, rearmed.generation, rearmed.attempts) == ("open", 1, 1), rearmed
    assert status_of({FINISHED: "r"}).result == "r"


async def test_resume_runs_no_body_for_a_finished_or_failed_workflow(wd_store: StoreUnderTest[Any]) -> None:
    ran: list[str] = []

    async def body(run: Run[Any]) -> object:
        ran.append(run.workflow)
        return "again"

    for workflow, key, value in (("life-done", FINISHED, "first"), ("life-failed", failed_key(0), {"x": 1})):
        held = await wd_store.checkpointer.claim(workflow, alive=LONG, budget=LONG)
        with lifecycle_writes():
            await wd_store.checkpointer.record(held, key, value)
        if key == FINISHED:
            assert await resume(wd_store.durable, held, body) == Finished("first")
        else:
            with pytest.raises(WorkflowFailed):
                await resume(wd_store.durable, held, body)
    assert ran == [], f"resume ran the body of a terminal workflow: {ran}"


def test_a_policy_and_a_status_cannot_be_changed_once_made() -> None:
    """One RetryPolicy serves every worker and pass, and a Status is what a load said: both are
    frozen, so no holder can change what the others read."""
    import dataclasses

    policy = RetryPolicy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.maximum_attempts = 3  # type: ignore[misc]
    status = status_of({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.state = "failed"  # type: ignore[misc]
