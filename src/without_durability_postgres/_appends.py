"""Group commit for ``PostgresCheckpointer.append``: appends made concurrently share a transaction.

An append alone is one autocommit statement: one round trip and one commit. Under concurrency the
commit is most of the server's work per append and the driver's per-call cost most of the
client's; appends waiting together are therefore sent as one transaction (BEGIN, each APPEND,
COMMIT, in one pipelined flight), so they share one commit and one round trip. Each caller still
gets its own key or its own error:

- The statements run in the order of their workflow ids, so two batches in flight take the
  workflows' turns (``TAKE_TURN``) in one order and cannot deadlock on them (two ids sharing a turn,
  a hash collision, can; Postgres then refuses one batch, which goes out again as below).
- A batch the server refused (a value it cannot take, a deadlock) committed nothing: each of its
  appends is sent again alone, so one caller's bad value fails that caller only.
- A batch whose outcome is unknown (the connection failed) leaves each caller with that error, as
  the same failure would for an append alone: the append may or may not have happened.
- A caller cancelled before its batch is sent is left out of it: that append never happens. The
  batch is cut from the waiting callers once its connection is in hand, just before its
  statements are queued, so a caller that timed out while the batch waited for a pooled
  connection is left out too. One cancelled after its batch was sent may still have appended,
  as for any call cut off in flight: its outcome is unknown.
  An append made while nothing else is under way is sent alone from its caller's own task, as
  without batching: cancelling it cancels its statement at the server.

Turns are held from each statement to the batch's commit, so a workflow's appends still commit in
``seq`` order and every load stays a prefix of every later one; within a batch, appends to one
workflow get rising keys in the order their calls were made.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from without_durability.errors import InvalidInput, StoreError, StoreUnavailable

from ._boundary import one_flight

if TYPE_CHECKING:
    from .checkpointer import PostgresCheckpointer

SENDERS = 2
"""Batches in flight at once, each on a pooled connection of its own."""

MOST = 64
"""The most appends one batch carries."""

_Waiting = tuple[str, str, "asyncio.Future[str]"]


class AppendBatcher:
    """The appends of one ``PostgresCheckpointer``, sent in batches by at most ``SENDERS`` tasks;
    a task starts when appends are waiting and ends when none are, so nothing runs while idle."""

    def __init__(self, checkpointer: PostgresCheckpointer) -> None:
        self._cp = checkpointer
        self._waiting: list[_Waiting] = []
        self._senders: set[asyncio.Task[None]] = set()
        self._alone_now = 0  # appends sent alone from their callers' own tasks, in flight

    async def append(self, workflow: str, encoded: str) -> str:
        """Append ``encoded`` (validated already) to ``workflow``; its key."""
        if not self._waiting and not self._senders and not self._alone_now:
            # Nothing else under way: sent alone from the caller's own task, exactly as without
            # batching (so cancelling the caller cancels the statement at the server too).
            self._alone_now += 1
            try:
                return await self._cp._append_alone(workflow, encoded)
            finally:
                self._alone_now -= 1
        loop = asyncio.get_running_loop()
        done: asyncio.Future[str] = loop.create_future()
        self._waiting.append((workflow, encoded, done))
        if len(self._senders) < SENDERS:
            self._senders.add(loop.create_task(self._send()))
        return await done

    async def _send(self) -> None:
        me = asyncio.current_task()
        try:
            while self._waiting:
                batch = [w for w in self._waiting[:MOST] if not w[2].done()]  # a cancelled caller: left out
                del self._waiting[:MOST]
                try:
                    if len(batch) == 1:
                        await self._alone(batch[0])
                    elif batch:
                        await self._together(batch)
                except BaseException as exc:  # this task cancelled (the loop closing): none left hanging
                    for _, _, done in batch:
                        if done.done():
                            continue
                        if isinstance(exc, asyncio.CancelledError):
                            done.cancel()
                        else:
                            done.set_exception(exc)
                    raise
        finally:
            # Gone from the set in the same step that found nothing waiting (a done-callback would
            # run later): an append made after that step starts a sender, never waits on this one.
            self._senders.discard(me)

    async def _alone(self, waiting: _Waiting) -> None:
        workflow, encoded, done = waiting
        try:
            key = await self._cp._append_alone(workflow, encoded, wanted=lambda: not done.done())
        except _NotWanted:  # its caller gave up while this waited for a connection: never sent
            return
        except Exception as exc:
            if not done.done():
                done.set_exception(exc)
        else:
            if not done.done():
                done.set_result(key)

    async def _together(self, batch: list[_Waiting]) -> None:
        ordered = sorted(batch, key=lambda w: w[0])  # stable: one workflow's appends keep call order
        cp = self._cp
        try:
            async with one_flight(cp.pool, f"appending {len(ordered)} values together") as flight:
                # The connection is held now: a caller cancelled while the batch waited for it is
                # left out here, with no await before the first statement is queued (a cancel
                # landing while the rest are queued is a cancel in flight: its outcome unknown).
                ordered = [w for w in ordered if not w[2].done()]
                cursors = [
                    await flight.conn.execute(cp.APPEND, {"workflow": workflow, "value": encoded})
                    for workflow, encoded, _ in ordered
                ]  # queued: read after the flight
            keys: list[str] = []
            for cursor in cursors:
                row = await cursor.fetchone()
                assert row is not None  # an INSERT ... SELECT of one drawn row returns it
                keys.append(str(row[0]))
        except StoreUnavailable as exc:  # it may have committed: each caller gets what one alone would
            for workflow, _, done in ordered:
                if not done.done():
                    done.set_exception(_for_one(exc, workflow, len(ordered)))
            return
        except (StoreError, InvalidInput):  # refused: nothing committed, so each goes again alone
            for waiting in ordered:
                if not waiting[2].done():
                    await self._alone(waiting)
            return
        for (_, _, done), key in zip(ordered, keys, strict=True):
            if not done.done():
                done.set_result(key)


class _NotWanted(Exception):
    """Raised by ``_append_alone`` when its ``wanted`` says no once a connection is held."""


def _for_one(exc: StoreUnavailable, workflow: str, together: int) -> StoreUnavailable:
    """``exc`` as one caller of a batch of ``together`` gets it: naming its workflow, caused by
    the batch's error, so no two callers share (and extend) one exception's traceback."""
    try:
        mine = type(exc)(f"appending to {workflow!r} (one of {together} sent together): {exc}")
    except TypeError:  # a subclass built otherwise: the batch's own error
        return exc
    mine.__cause__ = exc
    return mine
