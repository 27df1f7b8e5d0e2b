"""The ``landing`` probe: a superseded pass's record and a newer claim, met in one order on purpose.

A record whose fence is a row lock must wait for a claim that is committing on the same workflow,
and then see its token and refuse; a fence read from the statement's snapshot lets the write land
after the claim (``stale-landing`` catches it from what readers saw). Left to chance, a storm lines
the two up only now and then; here the store's own sessions (``Opened.holds``) hold the claim row
and one key's write, so every run plays the same interleaving on a real server:

1. a pass claims with a short lease and lets it lapse (``old``);
2. another session locks the claim row and another holds an uncommitted write of ``landing``;
3. a new claim starts and waits on the row; then ``old``'s record of ``landing`` starts (a locking
   fence queues behind the claim; a snapshot fence passes and waits on the held write);
4. the row is let go: the claim commits and is acknowledged, and a load in the new pass reads the
   workflow (the key is not there);
5. the held write rolls back: a locking store has already refused the record (Fenced), a snapshot
   store now lands it and acknowledges it as won, after a load that began after the newer claim
   had completed: the history ``stale-landing`` rejects.

The order is waited for (``Holds.waiting``), not slept for; where it does not arrive in time the
sequence goes on anyway, and the history stays true, only unjudged by this probe.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from typing import Any, Protocol

from .recorder import Recorder

LAPSE = timedelta(seconds=0.2)
"""The old pass's liveness: short, so it lapses before the new claim."""
BUDGET = timedelta(seconds=10.0)
ORDER_WAIT = 2.0
"""How long to wait for each session to queue behind the holds (or the claim to complete)."""
KEY = "landing"


class Holds(Protocol):
    """What ``Opened.holds`` yields (``without_durability_postgres.holds.PostgresHolds`` is one)."""

    def claim(self, workflow: str) -> AbstractAsyncContextManager[None]:
        """Inside: another session holds the workflow's claim, so a claim of it waits."""
        ...

    def write(self, workflow: str, key: str) -> AbstractAsyncContextManager[None]:
        """Inside: another session holds an uncommitted write of ``key``; rolled back on exit."""
        ...

    async def waiting(self) -> int:
        """How many sessions wait behind the holds now."""
        ...


HoldsOpener = Callable[[], AbstractAsyncContextManager[Any]]


async def _until(holds: Holds, count: int) -> bool:
    """Wait (up to ``ORDER_WAIT``) until ``count`` sessions wait behind the holds."""
    deadline = time.monotonic() + ORDER_WAIT
    while await holds.waiting() < count:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def landing(rec: Recorder, opener: HoldsOpener, wf: str) -> None:
    """Play the module docstring's sequence once on ``wf`` (a workflow of the probe's own)."""
    old = await rec.claim(wf, LAPSE, BUDGET)
    await asyncio.sleep(LAPSE.total_seconds() + 0.1)
    tasks: list[asyncio.Task[Any]] = []
    try:
        async with opener() as holds, holds.write(wf, KEY):
            async with holds.claim(wf):
                claim = asyncio.create_task(rec.claim(wf, LAPSE, BUDGET))
                tasks.append(claim)
                await _until(holds, 1)
                # stale by the time it could land: the claim ahead of it raises the token
                tasks.append(asyncio.create_task(rec.record(old, KEY, {"token": old.token})))
                await _until(holds, 2)
            await asyncio.wait([claim], timeout=ORDER_WAIT)
            if claim.done() and claim.exception() is None:
                await rec.load(claim.result())  # begun after the claim completed, before the write
    finally:  # the holds are let go by now: whatever waited on them finishes
        done = await asyncio.gather(*tasks, return_exceptions=True)
    if done and not isinstance(done[0], BaseException):
        await rec.release(done[0])
