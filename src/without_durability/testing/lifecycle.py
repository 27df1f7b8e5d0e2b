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

from ..errors import Fenced, Swallowed
from ..run import Blocked, Run, resume
from .harness import StoreUnderTest

Store = StoreUnderTest[Any]
_ids = itertools.count()
LONG = timedelta(hours=1)


def _wf(label: str) -> str:
    return f"life-{label}-{next(_ids)}"


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


__all__ = [name for name in list(globals()) if name.startswith("test_")]
