"""SplitDurable: any checkpointer with any scheduler, two writes in a fixed order."""

from __future__ import annotations

from typing import Generic

from typing_extensions import TypeVar

from ._values import Recorded
from .protocols import Checkpointer, Scheduler

E = TypeVar("E", default=object)


class SplitDurable(Generic[E]):
    """A ``Durable`` over two stores that cannot commit together: it records first, then schedules.

    That order is the whole of its guarantee. A crash between the two leaves a workflow holding its
    value and waiting for a wakeup, which asking again supplies (``arrive`` is first-writer-wins, so
    asking again is harmless). The reverse order would queue a pass that finds nothing and drops the
    value. Weaker than one commit: a repeated ``deliver`` after a crash appends a second message.
    """

    def __init__(self, checkpointer: Checkpointer[E], scheduler: Scheduler) -> None:
        self._checkpointer = checkpointer
        self._scheduler = scheduler

    @property
    def checkpointer(self) -> Checkpointer[E]:
        """The checkpointer half."""
        return self._checkpointer

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler half."""
        return self._scheduler

    async def arrive(self, workflow: str, key: str, value: object) -> Recorded:
        """Supply, then schedule now."""
        recorded = await self._checkpointer.supply(workflow, key, value)
        await self._scheduler.schedule(workflow)
        return recorded

    async def deliver(self, workflow: str, message: object) -> str:
        """Append, then schedule now."""
        key = await self._checkpointer.append(workflow, message)
        await self._scheduler.schedule(workflow)
        return key

    async def discard(self, workflow: str) -> None:
        """Discard (raising the fence), then cancel."""
        await self._checkpointer.discard(workflow)
        await self._scheduler.cancel(workflow)
