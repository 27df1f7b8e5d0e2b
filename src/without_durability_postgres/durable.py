"""PostgresDurable: the transitions across the two stores, each as one commit."""

from __future__ import annotations

from without_durability._values import Recorded
from without_durability.errors import InvalidInput
from without_durability.protocols import Durable
from without_durability.rules import INBOX_PREFIX

from ._boundary import AfterCommit, Pool, one_flight
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
        """See ``Durable.arrive``: supply and schedule now, one commit, one round trip."""
        cp = self._checkpointer
        cp._workflow(workflow)
        cp._key(workflow, key)
        encoded = cp._encode(workflow, key, value)
        supply = {"workflow": workflow, "key": key, "value": encoded}
        where = f"arriving at {workflow!r}/{key!r}"
        async with one_flight(self.pool, where, workflow, key, then=self._notify) as conn:
            supplied = await conn.execute(cp.SUPPLY, supply)
            await self._scheduler._schedule_on(conn, workflow)  # queues; reads nothing back
        row = await supplied.fetchone()  # read after the commit: the pipeline sent it all at once
        assert row is not None  # an upsert with DO UPDATE always returns its row
        return cp._recorded(row)

    async def deliver(self, workflow: str, message: object) -> str:
        """See ``Durable.deliver``: append and schedule now, one commit, one round trip."""
        cp = self._checkpointer
        cp._workflow(workflow)
        encoded = cp._encode(workflow, INBOX_PREFIX, message)
        where = f"delivering to {workflow!r}"
        async with one_flight(self.pool, where, workflow, INBOX_PREFIX, then=self._notify) as conn:
            appended = await conn.execute(cp.APPEND, {"workflow": workflow, "value": encoded})
            await self._scheduler._schedule_on(conn, workflow)
        row = await appended.fetchone()
        assert row is not None  # an INSERT ... SELECT of one drawn row returns it
        return str(row[0])

    async def discard(self, workflow: str) -> None:
        """See ``Durable.discard``: raise the fence, forget the records, cancel; one commit, one
        round trip (still three statements, each with its own snapshot)."""
        self._checkpointer._workflow(workflow)
        async with one_flight(self.pool, f"discarding {workflow!r}", workflow) as conn:
            await self._checkpointer._discard_on(conn, workflow)  # these only queue statements
            await self._scheduler._cancel_on(conn, workflow)

    @property
    def _notify(self) -> AfterCommit | None:
        """After the commit, on the committing connection: wake listeners (when notify=True)."""
        notifier = self._scheduler.notifier
        return None if notifier is None else notifier.send_on


def _typecheck(d: PostgresDurable) -> None:  # pragma: no cover - mypy proves it meets the protocol
    x: Durable[PostgresEffect] = d
    del x
