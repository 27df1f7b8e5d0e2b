"""Deliberately hung Worker tests, run only by tests/test_hang.py in a pytest of their own (the
name keeps the suite from collecting them), with a timeout of seconds.

- ``test_a_renewal_that_outlives_its_pass``: the tick ignores its pass's end and swallows every
  cancel, so the pass never ends and neither does pytest-asyncio's loop shutdown after the
  timeout's exception: only the backstop (tests/conftest.py) can end it.
- ``test_a_failure_that_leaves_the_renewal_running``: fails an assertion at once with such a
  tick left running: pytest-timeout stops its timer on the failure, and the teardown hangs.
- ``test_a_body_that_never_returns``: the pass waits for ever; pytest-timeout's alarm ends it.
- ``test_after_the_hangs``: passes, showing the session went on after them.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from without_durability import Pass, Run, Worker
from without_durability.memory import MemoryCheckpointer, MemoryDurable, MemoryScheduler


def _worker(body: Any) -> Worker[Any]:
    durable = MemoryDurable(MemoryCheckpointer(), MemoryScheduler())
    return Worker(
        durable,
        body,
        alive=timedelta(milliseconds=300),
        budget=timedelta(hours=1),
        visibility=timedelta(hours=1),
        poll_interval=timedelta(milliseconds=20),
    )


async def _endless_renewal(self: Worker[Any], pass_: Pass, *_: object) -> None:
    while True:  # the slip: no look at the pass's end, and a cancel taken for a store hiccup
        try:
            await asyncio.sleep(0.01)
            await self.durable.checkpointer.renew(pass_)
        except asyncio.CancelledError:
            pass


async def test_a_renewal_that_outlives_its_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Worker, "_renew", _endless_renewal)

    async def body(run: Run[Any]) -> object:
        return "done"

    work = _worker(body)
    await work.durable.scheduler.schedule("hung-renewal")
    await work.run(max_passes=1)


async def test_a_failure_that_leaves_the_renewal_running(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Worker, "_renew", _endless_renewal)
    ran = asyncio.Event()

    async def body(run: Run[Any]) -> object:
        ran.set()
        return "done"

    work = _worker(body)
    await work.durable.scheduler.schedule("hung-after-failure")
    asyncio.get_running_loop().create_task(work.run(max_passes=1))
    await ran.wait()
    raise AssertionError("a Worker test's own failure, with its pass still renewing")


async def test_a_body_that_never_returns() -> None:
    async def body(run: Run[Any]) -> object:
        await asyncio.Event().wait()
        return None

    work = _worker(body)
    await work.durable.scheduler.schedule("hung-body")
    await work.run(max_passes=1)


def test_after_the_hangs() -> None:
    assert True
