"""PostgresDurable: the transitions across the two stores, each as one commit."""

from __future__ import annotations

from without_durability._values import Recorded
from without_durability.errors import InvalidInput
from without_durability.protocols import Durable
from without_durability.rules import INBOX_PREFIX

from ._boundary import Pool, connect
from .checkpointer import PostgresCheckpointer, PostgresEffect
from .scheduler import PostgresScheduler


class PostgresDurable:
    """``Durable[PostgresEffect]`` whose ``arrive``, ``deliver`` and ``discard`` each write both
    tables in one transaction, so no crash leaves a recorded-but-unqueued workflow, and a
    ``deliver`` that failed appended nothing (asking again cannot leave two messages).

    Both halves must share one pool (checked here): that is what lets one commit cover both.
    """

    def __init__(self, checkpointer: PostgresCheckpointer, scheduler: PostgresScheduler) -> None:
        if not isinstance(checkpointer, PostgresCheckpointer) or not isinstance(scheduler, PostgresScheduler):
            raise InvalidInput("PostgresDurable takes a PostgresCheckpointer and a PostgresScheduler")
        if checkpointer.pool is not scheduler.pool:
            raise InvalidInput(
                "PostgresDurable needs its checkpointer and scheduler on one pool, so each "
                "transition commits once; build both with the same AsyncConnectionPool "
                "(or use SplitDurable for two databases)"
            )
        self._checkpointer = checkpointer
        self._scheduler = scheduler

    @property
    def pool(self) -> Pool:
        """The pool both halves share."""
        return self._checkpointer.pool

    @property
    def checkpointer(self) -> PostgresCheckpointer:
        """The checkpointer half."""
        return self._checkpointer

    @property
    def scheduler(self) -> PostgresScheduler:
        """The scheduler half."""
        return self._scheduler

    async def arrive(self, workflow: str, key: str, value: object) -> Recorded:
        """See ``Durable.arrive``: supply and schedule now, one commit."""
        cp = self._checkpointer
        cp._workflow(workflow)
        cp._key(workflow, key)
        encoded = cp._encode(workflow, key, value)
        async with connect(self.pool, f"arriving at {workflow!r}/{key!r}", workflow, key) as conn:
            recorded = await cp._supply_on(conn, workflow, key, encoded)
            await self._scheduler._schedule_on(conn, workflow)
        self._scheduler._due_now(None)  # after the commit: NOTIFY never holds up this transaction
        return recorded

    async def deliver(self, workflow: str, message: object) -> str:
        """See ``Durable.deliver``: append and schedule now, one commit."""
        cp = self._checkpointer
        cp._workflow(workflow)
        encoded = cp._encode(workflow, INBOX_PREFIX, message)
        where = f"delivering to {workflow!r}"
        async with connect(self.pool, where, workflow, INBOX_PREFIX) as conn:
            key = await cp._append_on(conn, workflow, encoded)
            await self._scheduler._schedule_on(conn, workflow)
        self._scheduler._due_now(None)
        return key

    async def discard(self, workflow: str) -> None:
        """See ``Durable.discard``: raise the fence, forget the records, cancel; one commit."""
        self._checkpointer._workflow(workflow)
        async with connect(self.pool, f"discarding {workflow!r}", workflow) as conn:
            await self._checkpointer._discard_on(conn, workflow)
            await self._scheduler._cancel_on(conn, workflow)


def _typecheck(d: PostgresDurable) -> None:  # pragma: no cover - mypy proves it meets the protocol
    x: Durable[PostgresEffect] = d
    del x
