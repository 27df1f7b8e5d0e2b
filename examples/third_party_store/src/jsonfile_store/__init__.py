"""A store that lives outside without-durability: every workflow's records, claims, queue and the
application's own data in one JSON file, each operation one read-modify-write under an exclusive
``flock`` on a lock file beside it, the new document written aside, fsynced and renamed into place.

It is small on purpose, and it is a real store: many processes on one machine share it, a process
killed mid-operation leaves the previous document whole (the rename is the commit, and the kernel
drops a dead process's lock), and an acknowledged write is on disk (fsync of the file and its
folder). Claim deadlines are on the machine's monotonic clock, which every process reads alike and
no wall-clock step moves; record times are on the wall clock, never before the workflow's latest.

A ``transact`` effect is a function over the whole document (``doc["data"]`` is the application's
part); it runs on a copy inside the lock, and the copy is written only if the record commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from without_durability import Delivery, Entry, Pass, Recorded, SplitDurable
from without_durability.clock import Clock, LeaseClock, lease_clock_for, system_clock
from without_durability.codec import JsonCodec
from without_durability.errors import Contended, Fenced, InvalidInput
from without_durability.rules import (
    MAX_VALUE_BYTES,
    check_key,
    check_lease,
    check_pass,
    check_time,
    check_visibility,
    check_workflow,
    encode_value,
    inbox_key,
)

__all__ = ["FileCheckpointer", "FileDurable", "FileEffect", "FileScheduler", "JsonFile", "open_durable"]

FileEffect = Callable[[dict[str, Any]], object]
"""A transact effect: a function over the document (write the application's data under
``doc["data"]``); its return value is the record's value."""

T = TypeVar("T")
_MICRO = timedelta(microseconds=1)


class JsonFile:
    """The document at ``path``, read and rewritten whole under an exclusive lock on ``path.lock``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.path.parent.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel if this process dies
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> dict[str, Any]:
        try:
            doc: dict[str, Any] = json.loads(self.path.read_text())
        except FileNotFoundError:
            doc = {}
        for part in ("claims", "records", "queues", "data"):
            doc.setdefault(part, {})
        return doc

    def _write(self, doc: dict[str, Any]) -> None:
        aside = self.path.with_name(self.path.name + ".new")
        with open(aside, "w") as out:
            json.dump(doc, out, separators=(",", ":"))
            out.flush()
            os.fsync(out.fileno())
        os.replace(aside, self.path)  # the commit: readers see the old document or the new one
        folder = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself survives a power cut
        finally:
            os.close(folder)

    def _step(self, job: Callable[[dict[str, Any]], tuple[T, bool]]) -> T:
        with self._locked():
            doc = self._read()
            result, changed = job(doc)
            if changed:
                self._write(doc)
            return result

    async def step(self, job: Callable[[dict[str, Any]], tuple[T, bool]]) -> T:
        """Run ``job(doc) -> (result, changed)`` under the lock, in a thread (a lock wait must not
        stop the event loop); the document is written back when ``changed``."""
        return await asyncio.to_thread(self._step, job)


def _iso(moment: datetime) -> str:
    return moment.isoformat()


class FileCheckpointer:
    """``Checkpointer[FileEffect]`` over a ``JsonFile``."""

    def __init__(
        self,
        file: JsonFile,
        *,
        clock: Clock = system_clock,
        lease_clock: LeaseClock | None = None,
        max_value_bytes: int = MAX_VALUE_BYTES,
    ) -> None:
        self.file = file
        self.codec = JsonCodec()
        self.clock = clock
        self.lease_clock: LeaseClock = lease_clock if lease_clock is not None else lease_clock_for(clock)
        self.max_value_bytes = max_value_bytes

    # -- the claim: {token, held_until, alive_until, alive_for}, micros on the lease clock --------

    # --8<-- [start:claim]
    async def claim(self, workflow: str, *, alive: timedelta, budget: timedelta) -> Pass:
        """See ``Checkpointer.claim``."""
        check_workflow(workflow)
        check_lease(workflow, alive, budget)

        def job(doc: dict[str, Any]) -> tuple[Pass, bool]:
            now = self.lease_clock()
            held = doc["claims"].get(workflow)
            # a deadline further ahead than its own window could reach predates a reboot
            if held is not None and now < held["alive_until"] <= now + held["alive_for"]:
                raise Contended(workflow)
            token = 1 if held is None else held["token"] + 1
            alive_for, held_for = alive // _MICRO, budget // _MICRO
            doc["claims"][workflow] = {
                "token": token,
                "held_until": now + held_for,
                "alive_until": now + min(alive_for, held_for),
                "alive_for": alive_for,
            }
            return Pass(workflow, token), True

        return await self.file.step(job)

    def _fence(self, doc: dict[str, Any], pass_: Pass) -> dict[str, Any]:
        held: dict[str, Any] | None = doc["claims"].get(pass_.workflow)
        if held is None or held["token"] != pass_.token:
            raise Fenced(pass_.workflow, pass_.token)
        return held

    def _renew(self, held: dict[str, Any]) -> None:
        held["alive_until"] = min(self.lease_clock() + held["alive_for"], held["held_until"])

    # --8<-- [end:claim]

    async def renew(self, pass_: Pass) -> None:
        """See ``Checkpointer.renew``."""
        check_pass(pass_)

        def job(doc: dict[str, Any]) -> tuple[None, bool]:
            self._renew(self._fence(doc, pass_))
            return None, True

        await self.file.step(job)

    async def release(self, pass_: Pass) -> None:
        """See ``Checkpointer.release``."""
        check_pass(pass_)

        def job(doc: dict[str, Any]) -> tuple[None, bool]:
            held = doc["claims"].get(pass_.workflow)
            if held is None or held["token"] != pass_.token:
                return None, False
            now = self.lease_clock()
            held["held_until"] = min(held["held_until"], now)
            held["alive_until"] = min(held["alive_until"], now)
            return None, True

        await self.file.step(job)

    async def discard(self, workflow: str) -> None:
        """See ``Checkpointer.discard``: the records go, the token goes up (never back to 1)."""
        check_workflow(workflow)

        def job(doc: dict[str, Any]) -> tuple[None, bool]:
            doc["records"].pop(workflow, None)
            held = doc["claims"].get(workflow)
            if held is not None:
                now = self.lease_clock()
                held["token"] += 1
                held["held_until"] = min(held["held_until"], now)
                held["alive_until"] = min(held["alive_until"], now)
            return None, True

        await self.file.step(job)

    # -- records: {workflow: [[key, encoded, written_at], ...]} in write order --------------------

    def _put(self, doc: dict[str, Any], workflow: str, key: str, encoded: str) -> Recorded:
        records: list[list[str]] = doc["records"].setdefault(workflow, [])
        for stored_key, stored, _ in records:
            if stored_key == key:
                return Recorded(self.codec.decode(stored), stored == encoded)
        now = self.clock()
        if records:  # never before the latest record: a wall clock stepped back keeps the order
            now = max(now, datetime.fromisoformat(records[-1][2]))
        records.append([key, encoded, _iso(now)])
        return Recorded(self.codec.decode(encoded), True)

    def _encode(self, workflow: str, key: str, value: object) -> str:
        return encode_value(self.codec, workflow, key, value, self.max_value_bytes)

    # --8<-- [start:record]
    async def record(self, pass_: Pass, key: str, value: object) -> Recorded:
        """See ``Checkpointer.record``."""
        check_pass(pass_)
        check_key(pass_.workflow, key)
        encoded = self._encode(pass_.workflow, key, value)

        def job(doc: dict[str, Any]) -> tuple[Recorded, bool]:
            held = self._fence(doc, pass_)
            self._renew(held)
            return self._put(doc, pass_.workflow, key, encoded), True

        return await self.file.step(job)

    # --8<-- [end:record]
    async def supply(self, workflow: str, key: str, value: object) -> Recorded:
        """See ``Checkpointer.supply``."""
        check_workflow(workflow)
        check_key(workflow, key)
        encoded = self._encode(workflow, key, value)
        return await self.file.step(lambda doc: (self._put(doc, workflow, key, encoded), True))

    async def append(self, workflow: str, value: object) -> str:
        """See ``Checkpointer.append``: the key's number is the count of the workflow's records."""
        check_workflow(workflow)
        encoded = self._encode(workflow, "inbox/", value)

        def job(doc: dict[str, Any]) -> tuple[str, bool]:
            key = inbox_key(len(doc["records"].get(workflow, [])))
            self._put(doc, workflow, key, encoded)
            return key, True

        return await self.file.step(job)

    async def load(self, workflow: str) -> dict[str, object]:
        """See ``Checkpointer.load``."""
        check_workflow(workflow)

        def job(doc: dict[str, Any]) -> tuple[dict[str, object], bool]:
            rows = doc["records"].get(workflow, [])
            return {key: self.codec.decode(encoded) for key, encoded, _ in rows}, False

        return await self.file.step(job)

    async def history(self, workflow: str) -> list[Entry]:
        """See ``Checkpointer.history``."""
        check_workflow(workflow)

        def job(doc: dict[str, Any]) -> tuple[list[Entry], bool]:
            rows = doc["records"].get(workflow, [])
            return [Entry(k, self.codec.decode(e), datetime.fromisoformat(at)) for k, e, at in rows], False

        return await self.file.step(job)

    async def transact(self, pass_: Pass, key: str, effect: FileEffect) -> Recorded:
        """See ``Checkpointer.transact``: the effect and the record in one locked step; the effect
        runs on a copy of the document, written only if the record commits."""
        check_pass(pass_)
        check_key(pass_.workflow, key)

        def job(doc: dict[str, Any]) -> tuple[Recorded, bool]:
            for stored_key, stored, _ in doc["records"].get(pass_.workflow, []):
                if stored_key == key:
                    return Recorded(self.codec.decode(stored), False), False
            self._fence(doc, pass_)
            scratch = copy.deepcopy(doc)
            result = effect(scratch)
            encoded = self._encode(pass_.workflow, key, result)
            held = self._fence(scratch, pass_)  # the effect may have let a newer pass in: refuse
            self._renew(held)
            recorded = self._put(scratch, pass_.workflow, key, encoded)
            doc.clear()
            doc.update(scratch)
            return recorded, True

        return await self.file.step(job)


class FileScheduler:
    """``Scheduler`` over a ``JsonFile``: per workflow and namespace, a visibility time and a
    revision that every ``schedule`` and ``take`` raises. A delivery's receipt is the time and the
    revision its take set, so ``wake_at`` tells its own delivery from a wakeup or a cancel that came
    since, even when the wakeup's time did not move the entry (a wall clock stepped forward past a
    delivery's hiding time makes ``now`` later than it)."""

    def __init__(self, file: JsonFile, *, clock: Clock = system_clock, namespace: str = "default") -> None:
        self.file = file
        self.clock = clock
        self.namespace = namespace

    def _queue(self, doc: dict[str, Any]) -> dict[str, list[Any]]:
        queue: dict[str, list[Any]] = doc["queues"].setdefault(self.namespace, {})
        return queue

    async def now(self) -> datetime:
        """See ``Scheduler.now``."""
        return self.clock()

    async def schedule(self, workflow: str, at: datetime | None = None) -> None:
        """See ``Scheduler.schedule``: the earlier of the queued time and ``at`` (now if None)."""
        check_workflow(workflow)
        check_time("schedule at", at)

        def job(doc: dict[str, Any]) -> tuple[None, bool]:
            when = at if at is not None else self.clock()
            queue = self._queue(doc)
            current = queue.get(workflow)
            if current is None:
                queue[workflow] = [_iso(when), 1]
            else:  # a new revision even when the time stays: a delivery out now must not drop it
                queue[workflow] = [_iso(min(datetime.fromisoformat(current[0]), when)), current[1] + 1]
            return None, True

        await self.file.step(job)

    async def take(self, visibility: timedelta) -> Delivery | None:
        """See ``Scheduler.take``: the earliest visible workflow, hidden for ``visibility``."""
        check_visibility(visibility)

        def job(doc: dict[str, Any]) -> tuple[Delivery | None, bool]:
            now = self.clock()
            queue = self._queue(doc)
            due = [(datetime.fromisoformat(at), wf) for wf, (at, _) in queue.items()]
            due = [(at, wf) for at, wf in due if at <= now]
            if not due:
                return None, False
            _, workflow = min(due)
            entry = queue[workflow] = [_iso(now + visibility), queue[workflow][1] + 1]
            return Delivery(workflow, ("jsonfile", self.namespace, *entry)), True

        return await self.file.step(job)

    async def wake_at(self, delivery: Delivery, at: datetime | None) -> None:
        """See ``Scheduler.wake_at``."""
        check_time("wake_at at", at)
        receipt = delivery.receipt
        if not (isinstance(receipt, tuple) and len(receipt) == 4 and receipt[0] == "jsonfile"):
            raise InvalidInput(f"{delivery!r} was not handed out by a FileScheduler")

        def job(doc: dict[str, Any]) -> tuple[None, bool]:
            queue = self._queue(doc)
            if queue.get(delivery.workflow) != list(receipt[2:]):
                return None, False  # cancelled since (not reinstated) or woken since (that stands)
            if at is None:
                del queue[delivery.workflow]
            else:
                queue[delivery.workflow] = [_iso(at), receipt[3] + 1]
            return None, True

        await self.file.step(job)

    async def cancel(self, workflow: str) -> None:
        """See ``Scheduler.cancel``."""
        check_workflow(workflow)
        await self.file.step(lambda doc: (self._queue(doc).pop(workflow, None), True))


FileDurable = SplitDurable[FileEffect]
"""The checkpointer and scheduler together: each call records first, then schedules."""


def open_durable(
    path: str | Path, *, clock: Clock = system_clock, lease_clock: LeaseClock | None = None,
    namespace: str = "default",
) -> SplitDurable[FileEffect]:
    """A ``Durable`` over the JSON file at ``path`` (created on the first write)."""
    file = JsonFile(path)
    return SplitDurable(
        FileCheckpointer(file, clock=clock, lease_clock=lease_clock),
        FileScheduler(file, clock=clock, namespace=namespace),
    )
