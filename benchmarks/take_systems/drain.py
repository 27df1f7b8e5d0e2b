"""What every take comparison shares: the queue's namespace and visibility, the workflow names, and
the drain loops that run ``workers`` tasks until every pre-filled delivery was taken."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

VISIBILITY = timedelta(minutes=10)
NAMESPACE = "bench"


def workflow_ids(n: int) -> list[str]:
    return [f"wf-{i:08d}" for i in range(n)]


async def drain_steps(
    step: Callable[[Any], Awaitable[Any]], n: int, workers: int, limit: float = 300.0
) -> dict[str, Any]:
    """``workers`` tasks loop ``d = await step(d)`` (``step`` answers the delivery it is given, if
    any, and returns the next) until all ``n`` were taken. A step that finds nothing while some are
    still untaken counts as a spurious empty (a naive FOR UPDATE does that) and is retried."""
    got: list[str] = []
    state = {"empty": 0}
    deadline = time.monotonic() + limit

    async def one() -> None:
        d = None
        while time.monotonic() < deadline:
            d = await step(d)
            if d is None:
                if len(got) >= n:
                    return
                state["empty"] += 1
                await asyncio.sleep(0)
                continue
            got.append(d.workflow)

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(workers)))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "rate": len(got) / seconds, "taken": got, "empty_takes": state["empty"]}


async def drain(
    take: Callable[[], Awaitable[Any]], answer: Callable[[Any], Awaitable[None]] | None, n: int, workers: int
) -> dict[str, Any]:
    """``drain_steps`` with two calls per delivery: answer the one in hand (unless ``answer`` is
    None), then take."""

    async def step(prev: Any) -> Any:
        if prev is not None and answer is not None:
            await answer(prev)
        return await take()

    return await drain_steps(step, n, workers)


async def drain_chained(sched: Any, n: int, workers: int) -> dict[str, Any]:
    """``drain_steps`` with one call per delivery: ``answer_and_take`` on the one in hand (a plain
    take when there is none)."""
    return await drain_steps(
        lambda d: sched.take(VISIBILITY) if d is None else sched.answer_and_take(d, None, VISIBILITY),
        n,
        workers,
    )
