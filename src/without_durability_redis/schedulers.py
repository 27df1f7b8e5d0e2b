"""The two Redis schedulers: a sorted set scored by visibility, and a stream with a consumer group.

Both keep a namespace's keys under one ``{namespace}`` hash tag, so each script is single-slot on a
Redis Cluster, and both read time from the server inside their scripts. Neither shares a slot with
any workflow's checkpoint, which is why ``SplitDurable`` is the ``Durable`` over them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar

from without_durability._values import Delivery
from without_durability.errors import InvalidInput, StoreError
from without_durability.protocols import AnswersAndTakes
from without_durability.rules import check_time, check_visibility

from ._keys import check_id, check_name
from ._scripts import DRIVER_ERRORS, Client, Scripts, boundary, from_micros, micros, span, text, translated

WAIT_GRACE = timedelta(seconds=1)
"""How long past its block a ``RedisStreamScheduler.wait`` read may go unanswered before it is
given up as a dead connection (a loaded server or machine answers a block's end well within it)."""

log = logging.getLogger("without_durability_redis.schedulers")


@dataclass(frozen=True, slots=True)
class _SetReceipt:
    visible_at: int  # the score the take set, microseconds
    took: int  # the take's number


@dataclass(frozen=True, slots=True)
class _StreamReceipt:
    entry: str  # the delivery's stream entry id
    timer: int  # the timer the take set, microseconds


class _Base:
    script_overrides: ClassVar[Mapping[str, str]] = {}
    """Replacement script texts by name (see ``script_source``), for a subclass that breaks a
    guarantee on purpose so a harness can prove it notices. Empty in the real schedulers."""

    def __init__(self, client: Client, *, namespace: str, prefix: str) -> None:
        self.client = client
        self.namespace = check_name("namespace", namespace)
        self.prefix = check_name("prefix", prefix, allow_empty=True)
        self._scripts = Scripts(client, self.script_overrides, coalesce=True)
        self._clock_key = f"{prefix}clock:{{{namespace}}}"

    async def _run(self, what: str, name: str, keys: list[str], args: list[object]) -> Any:
        # not ``boundary``: a generator context manager per call is felt at 10,000 calls a second;
        # the same rules, inline (a cancel the driver swallowed still raises, see ``boundary``)
        task = asyncio.current_task()
        asked = task.cancelling() if task is not None else 0
        try:
            reply = await self._scripts.run(name, keys, args)
        except DRIVER_ERRORS as exc:
            raise translated(self.client, what, exc) from exc
        if task is not None and task.cancelling() > asked:
            raise asyncio.CancelledError(f"cancelled while {what} (it may have been applied)")
        return reply

    async def now(self) -> datetime:
        """See ``Scheduler.now``: the clock of the node holding this namespace's queue."""
        return from_micros(await self._run("now", "now", [self._clock_key], []))

    def _at(self, at: datetime | None) -> str:
        return "" if at is None else str(micros(at))


def _check_limit(limit: object) -> None:
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise InvalidInput(f"take_many limit must be a positive int, got {limit!r}")


class RedisSetScheduler(_Base):
    """``Scheduler`` over one sorted set per namespace (``<prefix>queue:{namespace}``): member = the
    workflow, score = when it becomes visible (server microseconds).

    ``take`` is one script that finds the earliest visible member and moves its score to now +
    visibility; scripts run one at a time, so two takes never hand out the same delivery. The
    receipt is the score the take set and the take's number (every take of the namespace is
    numbered, ``<prefix>takes:{namespace}``, and each member's last number kept in the hash
    ``<prefix>took:{namespace}``), so ``wake_at`` answers only while both are still there: a cancel
    removed the member (not reinstated), a wakeup moved its score (that one stands), another take
    renumbered it (this answer is stale), even when that take set the very same score. There is no
    blocking read: a poller waits out its poll interval.
    """

    def __init__(self, client: Client, *, namespace: str = "default", prefix: str = "wd:") -> None:
        super().__init__(client, namespace=namespace, prefix=prefix)
        self.key = f"{prefix}queue:{{{namespace}}}"
        self.took_key = f"{prefix}took:{{{namespace}}}"
        """The hash of each queued workflow's last take number (same hash slot as ``key``)."""
        self.takes_key = f"{prefix}takes:{{{namespace}}}"
        """The counter every take of the namespace draws its number from."""
        self._clock_key = self.key
        self._keys = [self.key, self.took_key, self.takes_key]

    async def schedule(self, workflow: str, at: datetime | None = None) -> None:
        """See ``Scheduler.schedule``."""
        check_id(workflow)
        check_time("schedule at", at)
        await self._run(f"schedule {workflow!r}", "set_schedule", [self.key], [workflow, self._at(at)])

    async def take(self, visibility: timedelta) -> Delivery | None:
        """See ``Scheduler.take``: the visible workflow with the earliest time."""
        check_visibility(visibility)
        reply = await self._run("take", "set_take", self._keys, [span(visibility)])
        if reply is None:
            return None
        return Delivery(text(reply[0]), _SetReceipt(int(text(reply[1])), int(reply[2])))

    async def wake_at(self, delivery: Delivery, at: datetime | None) -> None:
        """See ``Scheduler.wake_at``."""
        check_time("wake_at at", at)
        receipt = self._receipt(delivery)
        await self._run(
            f"wake_at {delivery.workflow!r}",
            "set_wake",
            self._keys[:2],
            [delivery.workflow, receipt.visible_at, receipt.took, self._at(at)],
        )

    async def answer_and_take(
        self, delivery: Delivery, at: datetime | None, visibility: timedelta
    ) -> Delivery | None:
        """See ``AnswersAndTakes``: ``wake_at(delivery, at)`` and ``take(visibility)`` as one
        script, one round trip (what ``Worker`` uses between passes)."""
        check_time("wake_at at", at)
        check_visibility(visibility)
        receipt = self._receipt(delivery)
        reply = await self._run(
            f"answering for {delivery.workflow!r} and taking",
            "set_answer_take",
            self._keys,
            [delivery.workflow, receipt.visible_at, receipt.took, self._at(at), span(visibility)],
        )
        if reply is None:
            return None
        return Delivery(text(reply[0]), _SetReceipt(int(text(reply[1])), int(reply[2])))

    async def take_many(self, visibility: timedelta, limit: int) -> list[Delivery]:
        """Batching option: up to ``limit`` visible workflows, earliest first, in one script, each
        hidden for ``visibility`` exactly as ``take`` hides one (same guarantees, one round trip).
        Keep ``limit`` to what will be answered well within ``visibility``."""
        check_visibility(visibility)
        _check_limit(limit)
        reply = await self._run("take_many", "set_take_many", self._keys, [span(visibility), limit])
        hidden = int(text(reply[0]))
        pairs = zip(reply[1::2], reply[2::2], strict=True)
        return [Delivery(text(w), _SetReceipt(hidden, int(took))) for w, took in pairs]

    async def finish_many(self, deliveries: list[Delivery]) -> None:
        """Batching option: ``wake_at(d, None)`` for every delivery, in one script; each is removed
        only if it is still the delivery that was taken (as ``wake_at`` decides)."""
        args: list[object] = []
        for d in deliveries:
            receipt = self._receipt(d)
            args += [d.workflow, receipt.visible_at, receipt.took]
        if args:
            what = f"answering {len(deliveries)} deliveries"
            await self._run(what, "set_finish_many", self._keys[:2], args)

    def _receipt(self, delivery: Delivery) -> _SetReceipt:
        if not isinstance(delivery.receipt, _SetReceipt):
            raise InvalidInput(f"{delivery!r} was not handed out by a RedisSetScheduler")
        return delivery.receipt

    async def cancel(self, workflow: str) -> None:
        """See ``Scheduler.cancel``."""
        check_id(workflow)
        await self._run(f"cancel {workflow!r}", "set_cancel", self._keys[:2], [workflow])


class RedisStreamScheduler(_Base):
    """``Scheduler`` over a stream with a consumer group, its pending list, and a timer set, per
    namespace (``<prefix>stream:{ns}``, ``<prefix>timers:{ns}``, ``<prefix>entries:{ns}``).

    A workflow due now has one entry in the stream; a sleeping one has a timer. ``take`` first moves
    every due timer into the stream (the internal ``wake_due``), then reads one entry for the
    group (so it joins this consumer's pending list) and sets the timer that brings it back if
    nobody answers within ``visibility``; all in one script. ``wake_at`` asks whether its entry is
    still the workflow's current one and its timer the one the take set, so a cancelled delivery
    is never reinstated and a wakeup that came since stands (it changes the entry or moves the
    timer, at least a microsecond earlier). A schedule that is already due goes into the stream at
    once, so a reader blocked on the stream (``XREAD BLOCK``) wakes for it.

    Answered entries are acknowledged and deleted, so the stream stays as short as the ready work.
    ``consumer`` names this scheduler's pending list (default: host and process id).

    ``wait_client`` (optional) is a client of its own for ``wait``'s blocking read (default:
    ``client``): a read blocks its connection for up to ``at_most``, which a small pool shared with
    the store's calls may not spare. A blocking read whose connection died silently (a proxy or a
    NAT dropped it: no reply, no error) is given up ``WAIT_GRACE`` past its block, its connection
    dropped (with every idle connection of ``wait_client``'s pool, which went the same way), and
    the next ``wait`` reads on a new one: so a dead wakeup path is replaced within
    ``at_most + WAIT_GRACE`` (plus one connection attempt) once the server can be reached again;
    meanwhile the caller polls. ``reads_lost`` counts the reads given up or failed, and
    ``resubscribed`` the reads answered after one was lost.
    """

    def __init__(
        self,
        client: Client,
        *,
        namespace: str = "default",
        prefix: str = "wd:",
        consumer: str | None = None,
        wake_batch: int = 1000,
        wait_client: Client | None = None,
    ) -> None:
        super().__init__(client, namespace=namespace, prefix=prefix)
        self.wait_client = client if wait_client is None else wait_client
        self.reads_lost = 0
        """Blocking reads of ``wait`` given up (no reply within their block and ``WAIT_GRACE``)
        or failed: each one's connection is dropped and the next ``wait`` reads on a new one."""
        self.resubscribed = 0
        """Blocking reads answered after one was lost: how many times ``wait`` read the stream
        again on a new connection."""
        self._read_lost = False
        self.stream_key = f"{prefix}stream:{{{namespace}}}"
        self.timers_key = f"{prefix}timers:{{{namespace}}}"
        self.entries_key = f"{prefix}entries:{{{namespace}}}"
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        if wake_batch < 1:
            raise InvalidInput(f"wake_batch must be at least 1, got {wake_batch!r}")
        self.wake_batch = wake_batch
        self._keys = [self.stream_key, self.timers_key, self.entries_key]
        self._clock_key = self.stream_key
        self._idle: tuple[str, str] | None = None

    async def schedule(self, workflow: str, at: datetime | None = None) -> None:
        """See ``Scheduler.schedule``."""
        check_id(workflow)
        check_time("schedule at", at)
        await self._run(f"schedule {workflow!r}", "stream_schedule", self._keys, [workflow, self._at(at)])

    async def take(self, visibility: timedelta) -> Delivery | None:
        """See ``Scheduler.take``: due timers join the stream, then the oldest entry is read."""
        check_visibility(visibility)
        reply = await self._run(
            "take", "stream_take", self._keys, [span(visibility), self.consumer, self.wake_batch]
        )
        return self._taken(reply)

    def _taken(self, reply: Any) -> Delivery | None:
        """A take script's reply as a delivery, or None, noting where a ``wait`` starts from."""
        if text(reply[0]) == "":
            self._idle = (text(reply[1]), text(reply[2]))
            return None
        return Delivery(text(reply[0]), _StreamReceipt(text(reply[1]), int(text(reply[2]))))

    async def wait(self, at_most: timedelta) -> None:
        """Block until there may be work, instead of sleeping out a poll interval: until an entry
        joins the stream after this scheduler's last empty ``take``, the earliest timer falls due,
        or ``at_most`` passes, whichever is first. It may return early (and ``take`` then finds
        nothing), never later than ``at_most``. Without an empty ``take`` before it, an entry that
        arrived in between is noticed only by the next one."""
        if not isinstance(at_most, timedelta) or at_most <= timedelta(0):
            raise InvalidInput(f"wait at_most must be a positive timedelta, got {at_most!r}")
        idle, self._idle = self._idle, None
        if idle is None:
            reply = await self._run("wait", "stream_idle", self._keys, [])
            idle = (text(reply[1]), text(reply[2]))
        after, next_timer = idle
        block = span(at_most) // 1000
        if next_timer:
            until_due = (int(float(next_timer)) - micros(await self.now())) // 1000
            block = min(block, until_due)
        if block <= 0:
            return  # a timer is due already: take moves it
        await self._blocking_read(after, max(1, block))

    async def _blocking_read(self, after: str, block: int) -> None:
        """Block on the stream after entry ``after`` for ``block`` ms on ``wait_client``; a read
        not answered ``WAIT_GRACE`` past its block is given up (its connection goes with the
        cancel) and counted in ``reads_lost``, as is one that failed (then raised)."""
        try:
            with boundary(self.wait_client, "wait"):
                await self._scripts.ready()
                async with asyncio.timeout(block / 1000 + WAIT_GRACE.total_seconds()):
                    await self.wait_client.xread({self.stream_key: after}, count=1, block=block)
        except TimeoutError:
            await self._lost_read()
            log.warning("stream wait: no reply within its block and %s; reading on a new connection next", WAIT_GRACE)
            return
        except StoreError:
            await self._lost_read()
            raise
        if self._read_lost:
            self._read_lost = False
            self.resubscribed += 1

    async def _lost_read(self) -> None:
        """Count a lost read, and drop the wait client's idle connections: they went through the
        same path, so any of them may be as dead (a read that takes one would be lost too)."""
        self.reads_lost += 1
        self._read_lost = True
        pool = getattr(self.wait_client, "connection_pool", None)
        if pool is not None:
            with contextlib.suppress(Exception):
                await pool.disconnect(inuse_connections=False)

    async def wake_at(self, delivery: Delivery, at: datetime | None) -> None:
        """See ``Scheduler.wake_at``."""
        check_time("wake_at at", at)
        receipt = self._receipt(delivery)
        await self._run(
            f"wake_at {delivery.workflow!r}",
            "stream_wake",
            self._keys,
            [delivery.workflow, receipt.entry, receipt.timer, self._at(at)],
        )

    async def answer_and_take(
        self, delivery: Delivery, at: datetime | None, visibility: timedelta
    ) -> Delivery | None:
        """See ``AnswersAndTakes``: ``wake_at(delivery, at)`` and ``take(visibility)`` as one
        script, one round trip (what ``Worker`` uses between passes). When it finds nothing, a
        ``wait`` after it starts from where this take left off, as after an empty ``take``."""
        check_time("wake_at at", at)
        check_visibility(visibility)
        receipt = self._receipt(delivery)
        reply = await self._run(
            f"answering for {delivery.workflow!r} and taking",
            "stream_answer_take",
            self._keys,
            [
                delivery.workflow,
                receipt.entry,
                receipt.timer,
                self._at(at),
                span(visibility),
                self.consumer,
                self.wake_batch,
            ],
        )
        return self._taken(reply)

    async def take_many(self, visibility: timedelta, limit: int) -> list[Delivery]:
        """Batching option: up to ``limit`` deliveries in one script, each taken and hidden for
        ``visibility`` exactly as ``take`` takes one (same guarantees, one round trip). Keep
        ``limit`` to what will be answered well within ``visibility``."""
        check_visibility(visibility)
        _check_limit(limit)
        reply = await self._run(
            "take_many",
            "stream_take_many",
            self._keys,
            [span(visibility), self.consumer, self.wake_batch, limit],
        )
        return [
            Delivery(text(reply[i]), _StreamReceipt(text(reply[i + 1]), int(text(reply[i + 2]))))
            for i in range(0, len(reply), 3)
        ]

    async def finish_many(self, deliveries: list[Delivery]) -> None:
        """Batching option: ``wake_at(d, None)`` for every delivery, in one script; each is removed
        only if it is still the delivery that was taken (as ``wake_at`` decides)."""
        args: list[object] = []
        for d in deliveries:
            receipt = self._receipt(d)
            args += [d.workflow, receipt.entry, receipt.timer]
        if args:
            await self._run(
                f"answering {len(deliveries)} deliveries", "stream_finish_many", self._keys, args
            )

    def _receipt(self, delivery: Delivery) -> _StreamReceipt:
        if not isinstance(delivery.receipt, _StreamReceipt):
            raise InvalidInput(f"{delivery!r} was not handed out by a RedisStreamScheduler")
        return delivery.receipt

    async def cancel(self, workflow: str) -> None:
        """See ``Scheduler.cancel``."""
        check_id(workflow)
        await self._run(f"cancel {workflow!r}", "stream_cancel", self._keys, [workflow])


def _typecheck(client: Client) -> None:  # pragma: no cover - mypy proves they offer the capability
    a: AnswersAndTakes = RedisSetScheduler(client)
    b: AnswersAndTakes = RedisStreamScheduler(client)
    del a, b
