"""The recording proxy every store call of a worker, writer, reader or careless client goes
through: ``Recorder`` writes an invoke line before and a complete line after each call, classifying
what the store raised (``classify``); ``recording_durable`` wraps a recorder as a Durable for the
library's own ``Worker``. Runs inside the workload's processes; it knows the history and the store's
public API, nothing else of the harness.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from without_durability import Contended, Delivery, Fenced, InvalidInput, Pass, TakesAndClaims

from ..history import HistoryWriter, observation

T = TypeVar("T")

READS = ("load", "history", "now")


def classify(exc: BaseException, f: str) -> str:
    """The history outcome of a call that raised ``exc``."""
    if isinstance(exc, Fenced):
        return "fenced"
    if isinstance(exc, Contended):
        return "contended"
    if isinstance(exc, InvalidInput) or f in READS:
        return "failed"
    return "unknown"  # a lost connection or a timeout: the write may or may not have landed


def error_fields(exc: BaseException) -> dict[str, Any]:
    """What a complete line says of the error a call raised: ``error`` (its type and message) and
    ``error_types``, its classes, most specific first (so a checker tells a refusal,
    ``InvalidInput`` and below, from a store failure without importing the store)."""
    types = [c.__name__ for c in type(exc).__mro__ if c not in (object, BaseException, Exception)]
    return {"error": f"{type(exc).__name__}: {exc}"[:300], "error_types": types}


def receipt_text(receipt: object) -> str | None:
    """A receipt as the history records it: a string that is the same for equal receipts in every
    process (its ``repr``: the stores' receipts are frozen dataclasses), so a checker matches an
    answer to the take that handed its receipt out. None for a receipt whose ``repr`` is Python's
    default (an address, different for equal receipts): such answers are not matched to takes."""
    text = repr(receipt)
    if text.startswith("<") and " at 0x" in text:
        return None
    return text


class Recorder:
    """Wraps a Durable: every call is an invoke line, the call, and a complete line."""

    def __init__(self, durable: Any, hist: HistoryWriter) -> None:
        self.durable = durable
        self.cp = durable.checkpointer
        self.sch = durable.scheduler
        self.hist = hist
        self.on_claim: Callable[[Pass], None] = lambda p: None

    async def _call(
        self,
        f: str,
        fields: dict[str, Any],
        call: Callable[[], Awaitable[T]],
        done: Callable[[T], dict[str, Any]],
    ) -> T:
        op = self.hist.invoke(f, **fields)
        try:
            result = await call()
        except BaseException as exc:
            self.hist.complete(op, f, classify(exc, f), **error_fields(exc))
            raise
        self.hist.complete(op, f, "ok", **done(result))
        return result

    async def claim(self, workflow: str, alive: timedelta, budget: timedelta) -> Pass:
        p: Pass = await self._call(
            "claim",
            {
                "workflow": workflow,
                "alive": alive.total_seconds(),
                "budget": budget.total_seconds(),
            },
            lambda: self.cp.claim(workflow, alive=alive, budget=budget),
            lambda p: {"token": p.token},
        )
        self.on_claim(p)
        return p

    async def renew(self, p: Pass) -> None:
        await self._call(
            "renew",
            {"workflow": p.workflow, "token": p.token},
            lambda: self.cp.renew(p),
            lambda _: {},
        )

    async def release(self, p: Pass) -> None:
        await self._call(
            "release",
            {"workflow": p.workflow, "token": p.token},
            lambda: self.cp.release(p),
            lambda _: {},
        )

    async def record(self, p: Pass, key: str, value: object) -> Any:
        return await self._call(
            "record",
            {"workflow": p.workflow, "token": p.token, "key": key, "value": value},
            lambda: self.cp.record(p, key, value),
            lambda r: {"value": r.value, "won": r.won},
        )

    async def transact(self, p: Pass, key: str, effect: Any, **mark: Any) -> Any:
        return await self._call(
            "transact",
            {"workflow": p.workflow, "token": p.token, "key": key, **mark},
            lambda: self.cp.transact(p, key, effect),
            lambda r: {"value": r.value, "won": r.won},
        )

    async def load(self, p: Pass) -> dict[str, object]:
        return await self._call(
            "load",
            {"workflow": p.workflow, "token": p.token},
            lambda: self.cp.load(p.workflow),
            lambda r: observation(r.items()),
        )

    async def read(self, workflow: str, how: str = "load", via: str = "reader") -> list[tuple[str, object]]:
        """A read from outside any pass: ``load`` or ``history``, as (key, value) pairs in the
        order the store returned them. ``via: reader`` marks a reader that walks the inbox with a
        cursor (the checker replays it); a writer checking its own writes says ``writer``."""

        async def call() -> list[tuple[str, object]]:
            if how == "history":
                return [(e.key, e.value) for e in await self.cp.history(workflow)]
            return list((await self.cp.load(workflow)).items())

        return await self._call(how, {"workflow": workflow, "via": via}, call, observation)

    async def arrive(self, workflow: str, key: str, value: object) -> Any:
        return await self._call(
            "supply",
            {"workflow": workflow, "key": key, "value": value, "via": "arrive"},
            lambda: self.durable.arrive(workflow, key, value),
            lambda r: {"value": r.value, "won": r.won},
        )

    async def supply(self, workflow: str, key: str, value: object, **mark: Any) -> Any:
        return await self._call(
            "supply",
            {"workflow": workflow, "key": key, "value": value, **mark},
            lambda: self.cp.supply(workflow, key, value),
            lambda r: {"value": r.value, "won": r.won},
        )

    async def deliver(self, workflow: str, value: object) -> str:
        return await self._call(
            "append",
            {"workflow": workflow, "value": value, "via": "deliver"},
            lambda: self.durable.deliver(workflow, value),
            lambda k: {"key": k},
        )

    async def append(self, workflow: str, value: object) -> str:
        return await self._call(
            "append",
            {"workflow": workflow, "value": value},
            lambda: self.cp.append(workflow, value),
            lambda k: {"key": k},
        )

    async def schedule(self, workflow: str, at: datetime | None = None) -> None:
        await self._call(
            "schedule",
            {"workflow": workflow, "at": at and at.isoformat()},
            lambda: self.sch.schedule(workflow, at),
            lambda _: {},
        )

    async def take(self, visibility: timedelta) -> Delivery | None:
        return await self._call(
            "take",
            {"visibility": visibility.total_seconds()},
            lambda: self.sch.take(visibility),
            lambda d: {"workflow": d.workflow, "receipt": receipt_text(d.receipt)} if d else {"workflow": None},
        )

    async def wake_at(self, d: Delivery, at: datetime | None, **mark: Any) -> None:
        """Answer ``d``: recorded with the receipt it answers with (``receipt_text``) and ``at``."""
        await self._call(
            "wake_at",
            {"workflow": d.workflow, "at": at and at.isoformat(), "receipt": receipt_text(d.receipt), **mark},
            lambda: self.sch.wake_at(d, at),
            lambda _: {},
        )

    async def now(self) -> datetime:
        return await self.sch.now()  # type: ignore[no-any-return]


class _RecordingCheckpointer:
    """The checkpointer half of ``RecordingDurable``: the protocol's signatures, every call
    recorded. ``load`` is stamped with the token this process last claimed for the workflow."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.tokens: dict[str, int] = {}

    async def claim(self, workflow: str, *, alive: timedelta, budget: timedelta) -> Pass:
        p = await self.rec.claim(workflow, alive, budget)
        self.tokens[workflow] = p.token
        return p

    async def renew(self, pass_: Pass) -> None:
        await self.rec.renew(pass_)

    async def release(self, pass_: Pass) -> None:
        await self.rec.release(pass_)

    async def record(self, pass_: Pass, key: str, value: object) -> Any:
        return await self.rec.record(pass_, key, value)

    async def transact(self, pass_: Pass, key: str, effect: Any) -> Any:
        return await self.rec.transact(pass_, key, effect)

    async def load(self, workflow: str) -> dict[str, object]:
        token = self.tokens.get(workflow)
        return await self.rec._call(
            "load", {"workflow": workflow, "token": token},
            lambda: self.rec.cp.load(workflow), lambda r: observation(r.items()),
        )  # fmt: skip

    async def supply(self, workflow: str, key: str, value: object) -> Any:
        return await self.rec._call(
            "supply", {"workflow": workflow, "key": key, "value": value},
            lambda: self.rec.cp.supply(workflow, key, value),
            lambda r: {"value": r.value, "won": r.won},
        )  # fmt: skip

    async def append(self, workflow: str, value: object) -> str:
        return await self.rec.append(workflow, value)

    async def history(self, workflow: str) -> Any:
        return await self.rec._call(
            "history", {"workflow": workflow}, lambda: self.rec.cp.history(workflow),
            lambda r: observation((e.key, e.value) for e in r),
        )  # fmt: skip

    async def discard(self, workflow: str) -> None:
        await self.rec._call(
            "discard", {"workflow": workflow}, lambda: self.rec.cp.discard(workflow), lambda _: {}
        )


class _RecordingScheduler:
    """The scheduler half of ``RecordingDurable``."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec

    async def now(self) -> datetime:
        return await self.rec.now()

    async def schedule(self, workflow: str, at: datetime | None = None) -> None:
        await self.rec.schedule(workflow, at)

    async def take(self, visibility: timedelta) -> Delivery | None:
        return await self.rec.take(visibility)

    async def wake_at(self, delivery: Delivery, at: datetime | None) -> None:
        await self.rec.wake_at(delivery, at)

    async def cancel(self, workflow: str) -> None:
        await self.rec._call(
            "cancel", {"workflow": workflow}, lambda: self.rec.sch.cancel(workflow), lambda _: {}
        )


class RecordingDurable:
    """A Durable whose every call is written to the history; what the library ``Worker`` is
    given in the ``worker`` client mode."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.checkpointer = _RecordingCheckpointer(rec)
        self.scheduler = _RecordingScheduler(rec)

    async def arrive(self, workflow: str, key: str, value: object) -> Any:
        return await self.rec.arrive(workflow, key, value)

    async def deliver(self, workflow: str, message: object) -> str:
        return await self.rec.deliver(workflow, message)

    async def discard(self, workflow: str) -> None:
        await self.checkpointer.discard(workflow)


class _RecordingTakingDurable(RecordingDurable):
    """``RecordingDurable`` for a durable that offers ``take_and_claim`` (``TakesAndClaims``), so
    the library ``Worker`` takes that path under the faults too."""

    def __init__(self, rec: Recorder) -> None:
        super().__init__(rec)
        self.calls = 0

    async def take_and_claim(
        self, visibility: timedelta, *, alive: timedelta, budget: timedelta
    ) -> tuple[Delivery, Pass | None, dict[str, object]] | None:
        """Recorded as the three calls it stands for, over the same interval: a ``take``, a
        ``claim`` and a ``load``, each ``via: take_and_claim`` with a shared ``call`` id, so the
        checkers judge each as that call (the claim's and the load's workflow, known only after,
        is on their complete line; a claim never made is left without one, as unknown).

        A None pass is a claim refused as ``Contended`` (evidence that a pass was alive) only when
        the store says it was not for a busy claim row, which ``TakesAndClaims`` allows: through
        ``take_and_claim_busy`` (Postgres has it). Otherwise it is recorded as a claim not made,
        which the checkers read as no evidence either way."""
        rec = self.rec
        hist = rec.hist
        self.calls += 1
        tag = {"via": "take_and_claim", "call": f"{os.getpid()}:{self.calls}"}
        take = hist.invoke("take", visibility=visibility.total_seconds(), **tag)
        claim = hist.invoke("claim", alive=alive.total_seconds(), budget=budget.total_seconds(), **tag)
        load = hist.invoke("load", **tag)
        telling = getattr(rec.durable, "take_and_claim_busy", None)
        busy: bool | None = None  # None: the store does not say
        try:
            taken: tuple[Delivery, Pass | None, dict[str, object]] | None
            if telling is not None:
                told = await telling(visibility, alive=alive, budget=budget)
                taken, busy = (None, None) if told is None else (told[:3], bool(told[3]))
            else:
                taken = await rec.durable.take_and_claim(visibility, alive=alive, budget=budget)
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
            for op, f in ((take, "take"), (claim, "claim"), (load, "load")):
                hist.complete(op, f, classify(exc, f), error=error)
            raise
        if taken is None:  # nothing due: no claim and no load were made
            hist.complete(take, "take", "ok", workflow=None)
            hist.complete(claim, "claim", "failed", error="not made: nothing was due")
            hist.complete(load, "load", "failed", error="not made: nothing was due")
            return None
        delivery, pass_, records = taken
        wf = delivery.workflow
        hist.complete(take, "take", "ok", workflow=wf, receipt=receipt_text(delivery.receipt))
        if pass_ is None:
            if busy is False:  # where the claim would raise Contended
                hist.complete(claim, "claim", "contended", workflow=wf, error="Contended: via take_and_claim")
            else:  # no claim was tried (or the store does not say): no evidence of a live pass
                why = (
                    "its claim row was busy"
                    if busy
                    else "refused or its claim row busy (the store does not say)"
                )
                hist.complete(claim, "claim", "failed", workflow=wf, error=f"not made: {why}")
            hist.complete(load, "load", "failed", workflow=wf, error="not made: no pass")
            return taken
        hist.complete(claim, "claim", "ok", workflow=wf, token=pass_.token)
        self.checkpointer.tokens[wf] = pass_.token
        hist.complete(load, "load", "ok", workflow=wf, token=pass_.token, **observation(records.items()))
        rec.on_claim(pass_)
        return taken


def recording_durable(rec: Recorder) -> RecordingDurable:
    """``rec``'s durable wrapped for the library ``Worker``: with ``take_and_claim`` exactly when
    the wrapped durable offers it (otherwise the attribute is absent, so the Worker makes the
    three calls)."""
    if isinstance(rec.durable, TakesAndClaims):
        return _RecordingTakingDurable(rec)
    return RecordingDurable(rec)
