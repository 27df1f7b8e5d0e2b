"""Lifecycle probes: short scripted sequences one storm user runs between its takes, on workflows
of its own, so the lifecycle guarantees no plain take/claim/record loop touches are under the storm
too. Every call goes through the ``Recorder``, so the checkers judge what the probe observed, not
what it expected:

- ``lapse``: a pass is superseded after it lapsed, writes anyway (refused), and the new holder then
  falls silent; a claim made after the new holder's own liveness ran out must be granted (a store
  whose refused write renewed the holder answers Contended: ``lease-lapses``);
- ``discard``: a workflow claimed, released, discarded and claimed again; the new token must exceed
  the old (``tokens-rise``), so the old pass's late write is refused;
- ``cancel``: a delivery taken, its workflow cancelled, then answered due now by the stale
  delivery; no later take may hand the workflow out (``cancel-sticks``);
- ``answer`` (a scheduler with ``answer_and_take``): the same workflow taken twice (the first
  receipt let run out), the stale receipt answered due now through ``answer_and_take`` (which must
  not act), and the hidden workflow must not be handed out again (``answer-receipts``); a pass
  answered through ``answer_and_take`` never gets its own workflow back;
- ``landing`` (a store whose ``Opened`` has ``holds``): a superseded pass's record meets a newer
  claim mid-commit, in one order every run (``wd_chaos/client/landing.py``; ``stale-landing``).

The probe's scheduler uses a namespace of its own (``<namespace>-probe-<user>``), so the storm's
takers never take a probe's workflow and the probe's takes see only its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import datetime, timedelta
from typing import Any

from without_durability import AnswersAndTakes, Contended, Delivery, Fenced

from .landing import HoldsOpener, landing
from .recorder import Recorder, classify, receipt_text

SHORT = timedelta(seconds=0.3)
"""A pass meant to lapse quickly."""
LONG = timedelta(seconds=1.0)
"""The new holder's liveness in ``lapse``: long enough that a refused write's renewal outlasts it."""
BUDGET = timedelta(seconds=10.0)
HIDE = timedelta(seconds=5.0)
"""A take's visibility that outlasts the rest of its sequence."""
BRIEF = timedelta(seconds=0.2)
"""A take's visibility meant to run out before the sequence takes the workflow again."""


def probe_namespace(spec: dict[str, Any], user: str) -> dict[str, Any]:
    """The store spec with a scheduler namespace of the probing ``user``'s own (a distributed
    storm has a probing user per locust process)."""
    return {**spec, "namespace": f"{spec.get('namespace', 'default')}-probe-{user}"}


class Probe:
    """One user's probe sequences (see the module docstring); ``round`` runs each once."""

    def __init__(self, rec: Recorder, name: str, holds: HoldsOpener | None = None) -> None:
        self.rec = rec
        self.name = name
        self.holds = holds
        self.rounds = 0
        self.calls = 0

    def _wf(self, what: str) -> str:
        return f"probe/{self.name}/{self.rounds}/{what}"

    async def round(self) -> None:
        """Run every sequence once; a store error ends that sequence (the history keeps it)."""
        self.rounds += 1
        sequences = [self.lapse, self.discard, self.cancel]
        if isinstance(self.rec.sch, AnswersAndTakes):
            sequences.append(self.answer)
        if self.holds is not None:  # first: a short storm still sees it every run
            sequences.insert(0, self.landing)
        for sequence in sequences:
            with contextlib.suppress(Exception, Fenced, Contended):
                await sequence(self._wf(sequence.__name__))

    async def lapse(self, wf: str) -> None:
        """Superseded after it lapsed, the old pass writes; the new holder falls silent; a claim
        past the new holder's own liveness must be granted."""
        old = await self.rec.claim(wf, SHORT, BUDGET)
        await asyncio.sleep(SHORT.total_seconds() + 0.15)
        new = await self.rec.claim(wf, LONG, BUDGET)
        claimed = time.monotonic()
        with contextlib.suppress(Contended):  # refused while ``new`` is alive: the rule's other side
            await self.rec.claim(wf, SHORT, BUDGET)
        await asyncio.sleep(0.5)
        with contextlib.suppress(Fenced):  # must be refused; and a refusal renews nobody
            await self.rec.record(old, "stale", {"token": old.token})
        await asyncio.sleep(max(0.0, claimed + LONG.total_seconds() + 0.25 - time.monotonic()))
        last = await self.rec.claim(wf, SHORT, BUDGET)
        await self.rec.release(last)
        del new  # silent on purpose: its own liveness is what lapsed

    async def landing(self, wf: str) -> None:
        """A superseded pass's record started while a newer claim waits to commit (see
        ``wd_chaos.client.landing``): it must be refused, never land after that claim."""
        assert self.holds is not None
        await landing(self.rec, self.holds, wf)

    async def discard(self, wf: str) -> None:
        """Claim, release, discard, claim again: the new token is higher, so the old pass's late
        write is refused. (The probe's writes are all meant to be refused: the final state reads
        only the workload's workflows, so an acknowledged probe write would look lost.)"""
        old = await self.rec.claim(wf, SHORT, BUDGET)
        await self.rec.release(old)
        await self.rec._call("discard", {"workflow": wf}, lambda: self.rec.cp.discard(wf), lambda _: {})
        new = await self.rec.claim(wf, SHORT, BUDGET)
        with contextlib.suppress(Fenced):
            await self.rec.record(old, "late", {"token": old.token})
        await self.rec.release(new)

    async def _take(self, visibility: timedelta) -> Delivery | None:
        return await self.rec._call(
            "take",
            {"visibility": visibility.total_seconds(), "probe": True},  # the probe's own queue
            lambda: self.rec.sch.take(visibility),
            lambda d: {"workflow": d and d.workflow, "receipt": d and receipt_text(d.receipt)},
        )

    async def _wake(self, d: Delivery, due_now: bool) -> None:
        at = await self.rec.now() if due_now else None
        await self.rec._call(
            "wake_at",
            {"workflow": d.workflow, "at": at and at.isoformat(), "receipt": receipt_text(d.receipt)},
            lambda: self.rec.sch.wake_at(d, at),
            lambda _: {},
        )

    async def _drain(self) -> None:
        """Answer (remove) whatever the probe's queue still hands out, so the next round starts
        from an empty queue; each such take is judged like any other."""
        for _ in range(10):
            d = await self._take(HIDE)
            if d is None:
                return
            await self._wake(d, due_now=False)

    async def cancel(self, wf: str) -> None:
        """Take, cancel, answer due now with the stale delivery; the workflow stays cancelled."""
        await self._drain()
        await self.rec.schedule(wf)
        d = await self._take(HIDE)
        if d is None:
            return
        await self.rec._call("cancel", {"workflow": d.workflow}, lambda: self.rec.sch.cancel(d.workflow), lambda _: {})
        await self._wake(d, due_now=True)  # stale: the cancel came since it was taken
        await self._drain()

    async def _answer_and_take(self, d: Delivery, at: datetime | None) -> Delivery | None:
        """``answer_and_take(d, at, HIDE)``, recorded as the two calls it stands for: a
        ``wake_at`` and a ``take`` over the same interval, both ``via: answer_and_take`` and
        sharing a ``call`` id (so take-exclusive judges its take and sees its answer)."""
        hist = self.rec.hist
        sch: Any = self.rec.sch
        self.calls += 1
        call = f"{self.name}:{self.calls}"
        tag = {"via": "answer_and_take", "call": call}
        answer = hist.invoke(
            "wake_at", workflow=d.workflow, at=at and at.isoformat(), receipt=receipt_text(d.receipt), **tag
        )
        take = hist.invoke("take", visibility=HIDE.total_seconds(), answered=d.workflow, probe=True, **tag)
        try:
            got: Delivery | None = await sch.answer_and_take(d, at, HIDE)
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
            hist.complete(answer, "wake_at", classify(exc, "wake_at"), error=error)
            hist.complete(take, "take", classify(exc, "take"), error=error)
            raise
        hist.complete(answer, "wake_at", "ok")
        hist.complete(take, "take", "ok", workflow=got and got.workflow, receipt=got and receipt_text(got.receipt))
        return got

    async def answer(self, wf: str) -> None:
        """A stale answer must act on nothing: the first receipt runs out, a second take hides
        the workflow again, and the first receipt is answered due now through
        ``answer_and_take``; a take right after must not hand the workflow out (it is still
        hidden). Then a wakeup arrives for the current delivery, which is answered through
        ``answer_and_take``: its take must not hand back the workflow it answered."""
        await self._drain()
        await self.rec.schedule(wf)
        first = await self._take(BRIEF)
        if first is None:
            return
        await asyncio.sleep(BRIEF.total_seconds() + 0.1)
        second = await self._take(HIDE)
        if second is None:
            return
        got = await self._answer_and_take(first, await self.rec.now())  # stale: acts on nothing
        if got is not None:
            await self._wake(got, due_now=False)
        stray = await self._take(HIDE)  # the workflow is still hidden by ``second``
        if stray is not None:
            await self._wake(stray, due_now=False)
        await self.rec.schedule(wf)  # a wakeup since ``second`` was taken: it stands
        later = await self.rec.now() + HIDE
        got = await self._answer_and_take(second, later)  # must not hand ``wf`` back
        if got is not None:
            await self._wake(got, due_now=False)
        await self._drain()
