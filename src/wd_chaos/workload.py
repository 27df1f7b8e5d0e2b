"""The workload: worker and writer processes, and the recording proxy every store call goes
through.

Each worker is its own OS process (``python -m wd_chaos.workload worker ...``) so SIGSTOP and
SIGKILL are real. It runs a test workflow through the store's Durable, wrapped in ``Recorder``,
which writes an invoke line before and a complete line after every call. The workflow:

1. ``charge``: a step. Its external effect takes ``step_seconds`` and is logged as an ``effect``
   line (the world outside the store, durable before the record is attempted); then it is recorded.
2. ``ledger``: a transact whose effect inserts a ledger row inside the store's own commit.
3. waits for ``approval-<w>`` from every outside writer (an ``arrive`` each writer makes after
   delivering its share of the ``messages``, so all approvals in means every message in; each
   writer later submits its approval again with other content, which must lose and move nothing);
4. ``nap``: a sleep, recorded as an ISO time, answered with ``wake_at``;
5. ``seen``: a step recording the inbox keys it saw; 6. ``done``: finished.

Two clients run it. ``harness`` (the default) is the harness's own loop, deliberately simple and
explicit (take, claim, load, one step at a time, renew between steps, wake_at, release), so a fault
lands on a known call and a stalled pass's first call on waking is its record. ``worker`` runs the
same workflow as a ``Run`` body under the library's own ``Worker`` (renewal tick, resume, waits),
its Durable wrapped in ``RecordingDurable``, so the library's worker loop is under the faults too
(with ``take_and_claim`` where the store offers it, recorded as the take, claim and load it joins).
Failpoints (``after-effect-before-record``, ``inside-transact``, ``after-claim``) are armed by the
nemesis through files in the run's ``armed/`` folder; the first worker to reach an armed point
takes the file and SIGKILLs itself there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from without_durability import Contended, Delivery, Fenced, InvalidInput, Pass

from . import careless
from .config import ConfigError, LifecycleConfig, RunConfig
from .config import load as load_config
from .history import HistoryWriter, observation
from .stores import Opened, open_store

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
            lambda d: {"workflow": d and d.workflow},
        )

    async def wake_at(self, d: Delivery, at: datetime | None) -> None:
        await self._call(
            "wake_at",
            {"workflow": d.workflow, "at": at and at.isoformat()},
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
        hist.complete(take, "take", "ok", workflow=wf, receipt=repr(delivery.receipt))
        if pass_ is None:
            if busy is False:  # where the claim would raise Contended
                hist.complete(claim, "claim", "contended", workflow=wf, error="Contended: via take_and_claim")
            else:  # no claim was tried (or the store does not say): no evidence of a live pass
                why = "its claim row was busy" if busy else "refused or its claim row busy (the store does not say)"
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
    from without_durability import TakesAndClaims

    if isinstance(rec.durable, TakesAndClaims):
        return _RecordingTakingDurable(rec)
    return RecordingDurable(rec)


# -- failpoints -----------------------------------------------------------------------------------


class Failpoints:
    """Armed by the nemesis as files ``armed/<point>.<n>``; the first process to rename one to
    itself owns it and dies there."""

    def __init__(self, run_dir: Path, hist: HistoryWriter) -> None:
        self.folder = run_dir / "armed"
        self.hist = hist

    def hit(self, point: str, **where: Any) -> None:
        """If ``point`` is armed, take it and SIGKILL this process (after writing why)."""
        try:
            names = [n for n in os.listdir(self.folder) if n.startswith(point + ".")]
        except FileNotFoundError:
            return
        for name in names:
            try:  # the rename is the claim: exactly one process gets each armed file
                os.rename(self.folder / name, self.folder / "taken" / f"{name}.{os.getpid()}")
            except FileNotFoundError:
                continue  # another worker took it first
            self.hist.event("fault", fault="kill", phase="start", failpoint=point, id=name, **where)
            os.kill(os.getpid(), signal.SIGKILL)


# -- the worker -----------------------------------------------------------------------------------


class Worker:
    """One worker process's loop (see the module docstring)."""

    def __init__(self, cfg: RunConfig, name: str, opened: Opened, hist: HistoryWriter) -> None:
        self.cfg = cfg
        self.name = name
        self.opened = opened
        self.rec = Recorder(opened.durable, hist)
        self.hist = hist
        self.fail = Failpoints(cfg.run_dir, hist)
        self.rec.on_claim = lambda p: self.fail.hit("after-claim", workflow=p.workflow, token=p.token)
        lease = cfg.lease
        self.alive = timedelta(seconds=lease.alive)
        self.budget = timedelta(seconds=lease.budget)
        self.visibility = timedelta(seconds=lease.visibility)
        self.poll = lease.poll_interval
        self.work = cfg.workload
        self.stopping = False
        self.nonce = 0
        if self.work.transact_seconds > 0:
            opened.pause = self.transact_pause

    async def retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        """Retry a call that failed with a store error (a partition, a restart) for as long as
        the lease budget and then some: a partitioned pass comes back and tries its write, which
        is what lets the fence refuse it after the heal."""
        deadline = time.monotonic() + self.cfg.retry_seconds
        while True:
            try:
                return await call()
            except (Fenced, Contended, InvalidInput):
                raise
            except Exception:
                if time.monotonic() > deadline or self.stopping:
                    raise
                await asyncio.sleep(0.2)

    async def transact_pause(self, workflow: str, token: int) -> None:
        """Inside a transact's effect (its row written, its transaction open): take
        ``transact_seconds``, announced like a step's effect so a stall can target it."""
        op = self.hist.invoke("effect", workflow=workflow, key="ledger", token=token)
        await asyncio.sleep(self.work.transact_seconds)
        self.hist.complete(op, "effect", "ok")

    async def careless_transact(self, p: Pass) -> None:
        """In ``careless_effects`` of the workflows (the seed picks which, and how each is careless:
        three in four try to COMMIT), a pass first tries the ``ledger`` transact with a careless
        effect (see ``misuse``): it must fail and leave nothing; the pass then transacts properly.
        Fenced still ends the pass."""
        share = self.work.careless_effects
        rng = random.Random(f"{self.cfg.seed}:careless:{p.workflow}")
        if share <= 0 or rng.random() >= share:
            return
        how = "commits" if rng.random() < 0.75 else "fails"
        inner = self.opened.ledger_effect(p.workflow, careless.CARELESS_LEDGER_KEY, p.token, lambda: None)
        effect = careless.careless_effect(inner, how)
        if effect is None:  # the store's effects are scripts: nothing a caller could end
            return
        try:
            await self.rec.transact(p, "ledger", effect, careless=how)
        except Fenced:
            raise
        except Exception:  # its refusal is in the history, for misuse to judge
            pass

    def effect_seconds(self, workflow: str, key: str) -> float:
        """How long this run of a step's effect takes: ``step_seconds``, except that the first
        pass (of any worker) to run a workflow's ``charge`` takes ``slow_first_seconds`` when set:
        the step that outlives its whole budget."""
        slow = self.work.slow_first_seconds
        if slow <= 0 or key != "charge":
            return self.work.step_seconds
        folder = self.cfg.run_dir / "slow"
        folder.mkdir(exist_ok=True)
        try:  # O_EXCL: exactly one pass per workflow is the slow one
            os.close(os.open(folder / workflow.replace("/", "_"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return self.work.step_seconds
        return slow

    async def step(self, p: Pass, key: str, value: Callable[[], dict[str, Any]]) -> None:
        await self.retrying(lambda: self.rec.renew(p))
        self.nonce += 1
        nonce = f"{self.name}:{os.getpid()}:{p.token}:{self.nonce}"
        op = self.hist.invoke("effect", workflow=p.workflow, key=key, token=p.token)
        await asyncio.sleep(self.effect_seconds(p.workflow, key))  # the outside world is slow
        self.hist.event("effect", workflow=p.workflow, key=key, token=p.token, nonce=nonce)
        self.hist.complete(op, "effect", "ok", nonce=nonce)
        self.fail.hit("after-effect-before-record", workflow=p.workflow, key=key, token=p.token)
        await self.retrying(lambda: self.rec.record(p, key, {"nonce": nonce, "token": p.token, **value()}))

    async def run_pass(self, p: Pass) -> datetime | str | None:
        """One pass; returns when to wake it next (None: only an outside event wakes it;
        ``"finished"``)."""
        recs = await self.retrying(lambda: self.rec.load(p))
        if "charge" not in recs:
            await self.step(p, "charge", lambda: {})
        if "ledger" not in recs:
            await self.careless_transact(p)
            effect = self.opened.ledger_effect(
                p.workflow,
                "ledger",
                p.token,
                lambda: self.fail.hit("inside-transact", workflow=p.workflow, key="ledger", token=p.token),
            )
            await self.retrying(lambda: self.rec.transact(p, "ledger", effect))
        inbox = [k for k in recs if k.startswith("inbox/")]
        approvals = [f"approval-{w}" for w in range(self.work.writers)]
        if any(a not in recs for a in approvals) or len(inbox) < self.work.messages:
            return None
        now = await self.rec.now()
        if "nap" not in recs:
            until = now + timedelta(seconds=self.work.nap_seconds)
            await self.retrying(lambda: self.rec.record(p, "nap", until.isoformat()))
            return until
        nap = datetime.fromisoformat(str(recs["nap"]))
        if now < nap:
            return nap
        if "seen" not in recs:
            await self.step(p, "seen", lambda: {"inbox": inbox})
        await self.retrying(lambda: self.rec.record(p, "done", {"token": p.token}))
        return "finished"

    async def one(self) -> bool:
        """Take and run one delivery; False when there was nothing to take."""
        try:
            d = await self.rec.take(self.visibility)
        except Exception:
            await asyncio.sleep(0.2)
            return False
        if d is None:
            return False
        try:
            p = await self.rec.claim(d.workflow, self.alive, self.budget)
        except Contended:
            with contextlib.suppress(Exception):
                await self.rec.wake_at(d, await self.rec.now() + self.alive)
            return True
        except Exception:
            return True  # the delivery reappears after its visibility
        try:
            wake = await self.run_pass(p)
        except Fenced:
            return True  # a newer pass holds it: stop at once, touch nothing
        except Exception as exc:
            self.hist.event(
                "info",
                what="pass abandoned",
                workflow=p.workflow,
                token=p.token,
                error=f"{type(exc).__name__}: {exc}"[:300],
            )
            return True
        with contextlib.suppress(Exception):
            await self.rec.wake_at(d, None if wake in (None, "finished") else wake)  # type: ignore[arg-type]
            await self.rec.release(p)
        return True

    async def run(self) -> None:
        while not self.stopping:
            if not await self.one():
                await asyncio.sleep(self.poll)


class LibraryClient:
    """The same workflow as a ``Run`` body, run by the library's ``Worker`` (``worker`` mode)."""

    def __init__(self, worker: Worker) -> None:
        self.w = worker

    def body(self) -> Callable[[Any], Awaitable[object]]:
        w = self.w
        work = w.work
        failing = set(w.cfg.failing)

        def as_dict(value: object) -> dict[str, Any]:
            if not isinstance(value, dict):
                raise TypeError(f"expected a mapping, got {value!r}")
            return value

        def external(run: Any, key: str, **extra: Any) -> Callable[[], Awaitable[object]]:
            async def effect() -> object:
                token = run.pass_.token
                w.nonce += 1
                nonce = f"{w.name}:{os.getpid()}:{token}:{w.nonce}"
                op = w.hist.invoke("effect", workflow=run.workflow, key=key, token=token)
                await asyncio.sleep(w.effect_seconds(run.workflow, key))
                w.hist.event("effect", workflow=run.workflow, key=key, token=token, nonce=nonce)
                w.hist.complete(op, "effect", "ok", nonce=nonce)
                w.fail.hit("after-effect-before-record", workflow=run.workflow, key=key, token=token)
                return {"nonce": nonce, "token": token, **extra}

            return effect

        async def body(run: Any) -> object:
            # the body as one operation, so no-hung-pass can tell when the pass outlived it
            op = w.hist.invoke("body", workflow=run.workflow, token=run.pass_.token)
            try:
                result = await steps(run)
            except BaseException as exc:  # a wait (Suspended), Fenced, a failure: the body ended
                w.hist.complete(op, "body", "ok", token=run.pass_.token, ended=type(exc).__name__)
                raise
            w.hist.complete(op, "body", "ok", token=run.pass_.token, ended="returned")
            return result

        async def steps(run: Any) -> object:
            await run.step("charge", external(run, "charge"), as_dict)
            token = run.pass_.token
            effect = w.opened.ledger_effect(
                run.workflow, "ledger", token,
                lambda: w.fail.hit("inside-transact", workflow=run.workflow, key="ledger",
                                   token=token),
            )  # fmt: skip
            await run.transact("ledger", effect, as_dict)
            for writer in range(work.writers):
                await run.awaiting(f"approval-{writer}", as_dict)
            if run.workflow in failing:
                # lifecycle: fails every attempt, after its steps and arrivals (so no arrive comes
                # after it failed and was swept, which would start the id afresh)
                w.hist.event("info", what="attempt", workflow=run.workflow, token=run.pass_.token)
                raise RuntimeError(f"{run.workflow} fails on purpose")
            await run.sleep("nap", timedelta(seconds=work.nap_seconds))
            inbox = [k for k, _ in run.inbox()]
            await run.step("seen", external(run, "seen", inbox=inbox), as_dict)
            await run.step("done", _done(run.pass_.token), as_dict)
            return None

        return body

    async def run(self) -> None:
        from without_durability import Worker as LibraryWorker

        w = self.w
        lease = w.cfg.lease
        worker: Any = LibraryWorker(
            recording_durable(w.rec),
            self.body(),
            alive=w.alive,
            budget=w.budget,
            visibility=w.visibility,
            poll_interval=timedelta(seconds=lease.poll_interval),
            retry_contended=w.alive,
            retry=_retry_policy(w.cfg.lifecycle),
        )
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stop)
        await worker.run()


def _retry_policy(lifecycle: LifecycleConfig | None) -> Any:
    """The scenario's ``RetryPolicy`` (None: the Worker's default)."""
    if lifecycle is None:
        return None
    from without_durability import RetryPolicy

    return RetryPolicy(
        initial_interval=timedelta(seconds=lifecycle.retry_initial),
        backoff_coefficient=1.0,
        maximum_attempts=lifecycle.max_attempts,
    )


async def sweep_in_background(cfg: RunConfig, opened: Opened, hist: HistoryWriter) -> None:
    """The scenario's sweeper: the store's ``Opened.sweep`` (a store whose retention is a process,
    such as Postgres's) every ``sweep_every`` s with ``older_than = sweep_age``, each run an ``info``
    line; a store without one (a TTL, or nothing to sweep) needs no process."""
    lifecycle = cfg.lifecycle
    sweep = opened.sweep
    if lifecycle is None or sweep is None:
        return
    age = timedelta(seconds=lifecycle.sweep_age)
    while True:
        try:
            swept = await sweep(age)
            hist.event("info", what="sweep", swept=swept)
        except Exception as exc:  # the store restarting: sweep again next time
            hist.event("info", what="sweep failed", error=f"{type(exc).__name__}: {exc}"[:300])
        await asyncio.sleep(lifecycle.sweep_every)


def _done(token: int) -> Callable[[], Awaitable[object]]:
    async def effect() -> object:
        return {"token": token}

    return effect


# -- the outside writers --------------------------------------------------------------------------


async def write_outside(cfg: RunConfig, index: int, rec: Recorder) -> None:
    """Deliver this writer's share of each workflow's messages and arrive its approvals, at
    times the seed fixes, spread from the start of the run."""
    work = cfg.workload
    writers = work.writers
    rng = random.Random(f"{cfg.seed}:writer:{index}")
    plan: list[tuple[float, str, str, int]] = []
    for wf, base in zip(cfg.workflows, cfg.starts, strict=True):
        for m in range(work.messages):
            if m % writers == index:
                plan.append((base + rng.uniform(0, 1.0), wf, "message", m))
        # each writer approves after its own messages, so all approvals in means every message in
        after = work.approve_after
        plan.append((base + after + rng.uniform(0, 0.5), wf, "approval", index))
        # the same approval submitted again later with other content, as a retrying client does:
        # it must lose (first writer wins) and move nothing (not the order, not written_at)
        plan.append((base + after + 1.5 + rng.uniform(0, 1.5), wf, "approval-again", index))
        if work.forged_keys:  # a careless client writing a lifecycle key: it must be refused
            plan.append((base + rng.uniform(0, 1.0), wf, "forge", index))
    plan.sort()
    t0 = cfg.t0
    for at, wf, what, m in plan:
        delay = t0 + at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        for _attempt in range(100):
            try:
                if what == "message":
                    await rec.deliver(wf, {"from": index, "n": m})
                elif what == "forge":
                    with contextlib.suppress(InvalidInput):  # refused: what misuse wants to see
                        await rec.supply(wf, careless.FORGED_KEY, {"by": index}, forged=True)
                elif what == "approval":
                    await rec.arrive(wf, f"approval-{index}", {"by": index})
                else:  # straight to the checkpointer: the value is there, no wakeup is needed
                    await rec.supply(wf, f"approval-{index}", {"by": index, "again": True})
                with contextlib.suppress(Exception):  # read your writes: the checker wants it shown
                    await rec.read(wf, via="writer")
                break
            except (Exception, Contended, Fenced):  # a refusal is the checkers' to judge
                await asyncio.sleep(0.3)  # a store error: ask again (arrive is first-writer-wins)


# -- the readers ----------------------------------------------------------------------------------


async def read_outside(cfg: RunConfig, index: int, rec: Recorder, stop: asyncio.Event) -> None:
    """Loop ``load`` and ``history`` over the workflows being written (those whose start has come),
    every ``read_pause`` seconds, until ``stop`` is set. What it saw is in its read lines (``via:
    reader``): the monotonic-loads checker judges them, and replays them as a consumer walking each
    inbox with a cursor to count what such a consumer would have skipped."""
    rng = random.Random(f"{cfg.seed}:reader:{index}")
    pause = cfg.workload.read_pause
    t0 = cfg.t0
    n = 0
    while not stop.is_set():
        due = [wf for wf, s in zip(cfg.workflows, cfg.starts, strict=True) if t0 + s <= time.time() + 0.5]
        if due:
            n += 1
            with contextlib.suppress(Exception):  # a failed read is in the history; read on
                await rec.read(rng.choice(due), "history" if n % 2 else "load")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), pause)


# -- process entry --------------------------------------------------------------------------------


async def _main(role: str, cfg: RunConfig, name: str) -> None:
    run_dir = cfg.run_dir
    hist = HistoryWriter(run_dir / "procs" / f"{name}.{os.getpid()}.jsonl", name)
    hist.event("info", what="start", role=role)
    spec = dict(cfg.store)
    if role == "worker" and cfg.worker_urls:
        spec["url"] = cfg.worker_urls[name]  # through this worker's own toxiproxy proxy
    if role == "careless":
        from .clients import careless_spec

        spec = careless_spec(cfg)
    opened = await open_store(spec)
    try:
        if role == "sweeper":
            await sweep_in_background(cfg, opened, hist)
        elif role == "worker":
            worker = Worker(cfg, name, opened, hist)
            if cfg.workload.client == "worker":
                await LibraryClient(worker).run()
            else:
                loop = asyncio.get_running_loop()
                loop.add_signal_handler(signal.SIGTERM, lambda: setattr(worker, "stopping", True))
                await worker.run()
        elif role == "careless":
            from .clients import run_careless

            await run_careless(cfg, name, opened, hist)
        elif role == "reader":
            stop = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
            await read_outside(cfg, int(name.rsplit("-", 1)[1]), Recorder(opened.durable, hist), stop)
        else:
            await write_outside(cfg, int(name.rsplit("-", 1)[1]), Recorder(opened.durable, hist))
    finally:
        hist.event("info", what="exit", role=role)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(opened.close(), 5)


def main(argv: list[str] | None = None) -> None:
    """``python -m wd_chaos.workload worker|writer|reader|sweeper|careless CONFIG NAME``."""
    parser = argparse.ArgumentParser(prog="wd_chaos.workload")
    parser.add_argument("role", choices=["worker", "writer", "reader", "sweeper", "careless"])
    parser.add_argument("config")
    parser.add_argument("name")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(Path(args.config))
    except ConfigError as exc:
        parser.error(str(exc))  # exits 2 with the file, field and what was wrong
    asyncio.run(_main(args.role, cfg, args.name))


if __name__ == "__main__":
    main()
