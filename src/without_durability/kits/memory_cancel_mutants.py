"""Memory-store mutants that restore two bugs only a cancel at one await shows, for ``wd-chaos sim``.

Both bugs were found in the server stores by careless clients and fixed there: the Postgres group
commit sent an append whose caller had given up while its batch waited (a retry after the timeout
then appended twice), and a store call that swallowed a cancel landing as its reply came back kept
the Worker's renewal tick running (redis-py under Python 3.11). The Memory store has no batch and
no reply to wait for, so each mutant adds the await its bug needs, in Memory form:

- ``memory-batch-sends-cancelled``: ``append`` waits for a batch that a timer flushes, and the flush
  sends every caller queued, one cancelled while it waited included;
- ``memory-renew-swallows-cancel``: ``renew`` waits for its reply, and a cancel landing there is
  dropped: the call returns as if it had never been cancelled.

A process harness run cannot place a cancel at those awaits; ``wd-chaos sim`` cancels calls at every
await (writers' timeouts, the Worker ending its tick) and ``cancelled-calls`` judges what they left.
Registered through the Memory kit's ``mutant_modules``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from typing import Any

from without_durability.memory import MemoryCheckpointer

from ..testing.mutants import Mutant, swap

BATCH_WINDOW = 0.002
"""How long (seconds) a batch waits for more appends before it is sent."""


REPLY_SECONDS = 0.05
"""How long a renewal's reply takes to come back (a store across a network)."""


def _now_sync(coro: Any) -> Any:
    """Run a Memory store coroutine that never awaits (each of its methods is one step)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a Memory store method awaited: it must be one step")


class BatchSendsCancelled(MemoryCheckpointer):
    """``append`` joins a batch sent ``BATCH_WINDOW`` later; the batch sends every caller queued,
    also one that was cancelled while it waited (the bug: such a caller was told nothing landed)."""

    _batch: list[tuple[str, object, asyncio.Future[str]]] | None = None

    async def append(self, workflow: str, value: object) -> str:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[str] = loop.create_future()
        if self._batch is None:
            self._batch = []
            # the flush belongs to no caller's task, so a caller's crash does not take it along
            loop.call_later(BATCH_WINDOW, self._flush, context=contextvars.Context())
        self._batch.append((workflow, value, waiter))
        return await waiter

    def _flush(self) -> None:
        batch, self._batch = self._batch or [], None
        for workflow, value, waiter in batch:
            # the bug: a waiter cancelled while it queued is sent all the same
            try:
                key = _now_sync(MemoryCheckpointer.append(self, workflow, value))
            except Exception as exc:
                if not waiter.done():
                    waiter.set_exception(exc)
                continue
            if not waiter.done():
                waiter.set_result(key)


class RenewSwallowsCancel(MemoryCheckpointer):
    """``renew`` waits for its reply, and a cancel that lands there is dropped: the renewal goes
    through and returns as if never cancelled."""

    async def renew(self, pass_: Any) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # the bug: the reply won, the cancel is lost
            await asyncio.sleep(REPLY_SECONDS)  # the reply on its way
        await super().renew(pass_)


KILLERS = (
    "tests/test_sim.py::test_the_real_memory_store_passes_the_seeds_that_find_the_mutants",
    "sim:lease-stall:cancelled-calls",
)
"""The sim test that runs the seeds finding these mutants on the real store (valid), so a store the
gate swaps for a mutant fails it."""

MUTANTS = [
    Mutant(
        "memory-batch-sends-cancelled",
        "memory",
        "cancelled-calls",
        "append's batch sends a caller that was cancelled while it waited",
        KILLERS,
        swap("checkpointer", BatchSendsCancelled),
        unseen_by_chaos="Memory lives in one process; wd-chaos sim finds it (cancelled-calls)",
    ),
    Mutant(
        "memory-renew-swallows-cancel",
        "memory",
        "cancelled-calls",
        "renew drops a cancel that lands while it waits for its reply",
        KILLERS,
        swap("checkpointer", RenewSwallowsCancel),
        unseen_by_chaos="Memory lives in one process; wd-chaos sim finds it (cancelled-calls)",
    ),
]
