"""The test workflow, written once (``test_workflow``), and the two ways a worker process runs it.

The workflow: ``charge`` (a step with an external effect), ``ledger`` (a transact whose effect
inserts a ledger row inside the store's commit), the codec's two (a dag node ``listed`` whose list
result must come back equal, a step ``pair`` that records a tuple), the writers' approvals, a
lifecycle run's failure on purpose, ``nap`` (a durable sleep), ``seen`` (a step recording the
inbox keys it saw) and ``done``. It is written against ``Steps``, which two drivers implement:

- ``HarnessSteps``: the harness's own explicit loop (``Worker.run_pass``): each step is skipped
  when the pass's ``load`` already holds its record; a wait ends the pass (``Wait``) with when to
  wake it, so a fault lands on a known call.
- ``LibrarySteps``: a ``Run`` body under the library's own ``Worker`` (``library_body``), whose
  ``step``, ``transact``, ``awaiting``, ``sleep`` and dag runner do the same.

Both run a step's external effect through one function (``external_effect``) and build the
ledger's effect in one place (``ledger_effect``), so what the checkers see of an effect (its
``effect`` lines, its nonce, the ``after-effect-before-record`` failpoint) is the same either way.
What the steps ask of the process running them is a ``Host``: a worker process (``Worker``), or a
simulated one (``wd-chaos sim``'s), so the simulator runs this workflow, not a copy of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import random
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from without_durability import Contended, Delivery, Fenced, InvalidInput, Pass
from without_durability import Worker as LibraryWorker
from without_durability.dag import Node, run_durably

from ..config import LifecycleConfig, RunConfig
from ..history import CARELESS_LEDGER_KEY, HistoryWriter
from ..scenario import Workload
from ..stores import Opened
from . import careless
from .recorder import Recorder, T, recording_durable


class Steps(Protocol):
    """What the test workflow asks of whoever runs it (see the module docstring)."""

    async def step(self, key: str, **extra: Any) -> None:
        """Run the external effect of step ``key`` and record it with ``extra``."""
        ...

    async def ledger(self) -> None:
        """Transact ``ledger``: its effect inserts a ledger row inside the store's commit."""
        ...

    async def codec(self) -> None:
        """Run the dag node ``listed`` (its list result must come back equal) and the step
        ``pair``, which records a tuple (the store hands back a list, and it still won)."""
        ...

    async def approvals(self) -> None:
        """Wait for every writer's ``approval-<w>`` (and, for the harness, every message)."""
        ...

    async def nap(self) -> None:
        """Sleep ``nap_seconds`` durably."""
        ...

    def inbox(self) -> list[str]:
        """The inbox keys the pass sees."""
        ...

    async def done(self) -> None:
        """Record ``done``: the workflow finished."""
        ...

    def fail_on_purpose(self) -> None:
        """End this attempt with an error (a lifecycle run's failing workflow)."""
        ...


async def test_workflow(steps: Steps, failing: bool, version: int = 1) -> None:
    """The test workflow (the module docstring); ``failing``: it fails every attempt after its
    steps and arrivals (so no arrive comes after it failed and was swept, which would start the id
    afresh). ``version`` 2 (a deploy's new release, ``workflow_version``) adds one step, ``audit``,
    after ``seen``: a compatible change, so either version finishes what the other started."""
    await steps.step("charge")
    await steps.ledger()
    await steps.codec()
    await steps.approvals()
    if failing:
        steps.fail_on_purpose()
    await steps.nap()
    await steps.step("seen", inbox=steps.inbox())
    if version >= 2:
        await steps.step("audit")
    await steps.done()


class Host(Protocol):
    """What the workflow's steps ask of the process running them: a worker process (``Worker``)
    or a simulated one (``wd_chaos.sim.world``)."""

    @property
    def hist(self) -> HistoryWriter:
        """Where the process's history lines go."""
        ...

    @property
    def work(self) -> Workload:
        """The scenario's workload."""
        ...

    @property
    def failing(self) -> set[str]:
        """The workflows that fail on purpose (a lifecycle run's)."""
        ...

    @property
    def version(self) -> int:
        """The test workflow's version this process runs."""
        ...

    def effect_nonce(self, token: int) -> str:
        """A nonce no other effect of the run has."""
        ...

    def effect_seconds(self, workflow: str, key: str) -> float:
        """How long this run of step ``key``'s effect takes."""
        ...

    def failpoint(self, point: str, **where: Any) -> None:
        """Die here if ``point`` is armed (a no-op where nothing arms one)."""
        ...

    def store_ledger_effect(self, workflow: str, key: str, token: int, failpoint: Callable[[], None]) -> Any:
        """The store's effect that appends one ledger row, calling ``failpoint`` inside it."""
        ...


async def external_effect(w: Host, workflow: str, key: str, token: int) -> str:
    """A step's external effect: ``effect_seconds`` of the outside world, written as an ``effect``
    operation and line (durable before the record is attempted), then the
    ``after-effect-before-record`` failpoint. Returns the effect's nonce."""
    nonce = w.effect_nonce(token)
    op = w.hist.invoke("effect", workflow=workflow, key=key, token=token)
    await asyncio.sleep(w.effect_seconds(workflow, key))  # the outside world is slow
    w.hist.event("effect", workflow=workflow, key=key, token=token, nonce=nonce)
    w.hist.complete(op, "effect", "ok", nonce=nonce)
    w.failpoint("after-effect-before-record", workflow=workflow, key=key, token=token)
    return nonce


def ledger_effect(w: Host, workflow: str, token: int) -> Any:
    """The ``ledger`` transact's effect, with the ``inside-transact`` failpoint in it."""
    return w.store_ledger_effect(
        workflow,
        "ledger",
        token,
        lambda: w.failpoint("inside-transact", workflow=workflow, key="ledger", token=token),
    )


@dataclass
class Wait(Exception):
    """The harness's pass ends here: wake it at ``until`` (None: only an outside event wakes it)."""

    until: datetime | None


class HarnessSteps:
    """The workflow under the harness's explicit loop: one pass, whose ``load`` was ``recs``."""

    def __init__(self, w: Worker, p: Pass, recs: dict[str, object]) -> None:
        self.w = w
        self.p = p
        self.recs = recs

    async def step(self, key: str, **extra: Any) -> None:
        if key in self.recs:
            return
        w, p = self.w, self.p
        await w.retrying(lambda: w.rec.renew(p))
        nonce = await external_effect(w, p.workflow, key, p.token)
        await w.retrying(lambda: w.rec.record(p, key, {"nonce": nonce, "token": p.token, **extra}))

    async def ledger(self) -> None:
        if "ledger" in self.recs:
            return
        w, p = self.w, self.p
        await w.careless_transact(p)
        effect = ledger_effect(w, p.workflow, p.token)
        await w.retrying(lambda: w.rec.transact(p, "ledger", effect))

    async def codec(self) -> None:
        """Nothing: the explicit loop records through the checkpointer, with no dag runner or
        ``Run.step`` of the library's whose codec the two would test."""

    async def approvals(self) -> None:
        approvals = [f"approval-{n}" for n in range(self.w.work.writers)]
        if any(a not in self.recs for a in approvals) or len(self.inbox()) < self.w.work.messages:
            raise Wait(None)

    async def nap(self) -> None:
        w, p = self.w, self.p
        now = await w.rec.now()
        if "nap" not in self.recs:
            until = now + timedelta(seconds=w.work.nap_seconds)
            await w.retrying(lambda: w.rec.record(p, "nap", until.isoformat()))
            raise Wait(until)
        nap = datetime.fromisoformat(str(self.recs["nap"]))
        if now < nap:
            raise Wait(nap)

    def inbox(self) -> list[str]:
        return [k for k in self.recs if k.startswith("inbox/")]

    async def done(self) -> None:
        w, p = self.w, self.p
        await w.retrying(lambda: w.rec.record(p, "done", {"token": p.token}))

    def fail_on_purpose(self) -> None:
        raise RuntimeError(f"{self.p.workflow} fails on purpose")


def _as_dict(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected a mapping, got {value!r}")
    return value


def _returning(value: object) -> Callable[[], Awaitable[object]]:
    async def effect() -> object:
        return value

    return effect


def _as_list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {value!r}")
    return value


class LibrarySteps:
    """The workflow as a ``Run`` body under the library's ``Worker``: ``run`` is the body's run."""

    def __init__(self, w: Host, run: Any) -> None:
        self.w = w
        self.run = run

    async def step(self, key: str, **extra: Any) -> None:
        w, run = self.w, self.run

        async def effect() -> object:
            token = run.pass_.token
            nonce = await external_effect(w, run.workflow, key, token)
            return {"nonce": nonce, "token": token, **extra}

        await run.step(key, effect, _as_dict)

    async def ledger(self) -> None:
        run = self.run
        await run.transact("ledger", ledger_effect(self.w, run.workflow, run.pass_.token), _as_dict)

    async def codec(self) -> None:
        run = self.run
        token = run.pass_.token

        async def listed(_inputs: dict[str, object]) -> object:
            return [token, "list"]  # survives the codec unchanged: a real store hands it back equal

        await run_durably([Node("listed", listed)], run)
        # a tuple: the store hands back a list, and won stays True
        await run.step("pair", _returning((token, "pair")), _as_list)

    async def approvals(self) -> None:
        for writer in range(self.w.work.writers):
            await self.run.awaiting(f"approval-{writer}", _as_dict)

    async def nap(self) -> None:
        await self.run.sleep("nap", timedelta(seconds=self.w.work.nap_seconds))

    def inbox(self) -> list[str]:
        return [k for k, _ in self.run.inbox()]

    async def done(self) -> None:
        await self.run.step("done", _returning({"token": self.run.pass_.token}), _as_dict)

    def fail_on_purpose(self) -> None:
        run = self.run
        self.w.hist.event("info", what="attempt", workflow=run.workflow, token=run.pass_.token)
        raise RuntimeError(f"{run.workflow} fails on purpose")


# -- failpoints and the worker ----------------------------------------------------------------------


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
        self.failing = set(cfg.failing)
        self.version = 1
        """The test workflow's version this worker runs (its variant's ``workflow_version``)."""
        self.stopping = False
        self.nonce = 0
        if self.work.transact_seconds > 0:
            opened.pause = self.transact_pause

    def effect_nonce(self, token: int) -> str:
        """This process's next effect's nonce: its name, pid, the pass's token and a counter."""
        self.nonce += 1
        return f"{self.name}:{os.getpid()}:{token}:{self.nonce}"

    def failpoint(self, point: str, **where: Any) -> None:
        """Die here if the nemesis armed ``point`` (``Failpoints.hit``)."""
        self.fail.hit(point, **where)

    def store_ledger_effect(self, workflow: str, key: str, token: int, failpoint: Callable[[], None]) -> Any:
        """The store's ledger effect (``Opened.ledger_effect``)."""
        return self.opened.ledger_effect(workflow, key, token, failpoint)

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
        inner = self.opened.ledger_effect(p.workflow, CARELESS_LEDGER_KEY, p.token, lambda: None)
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

    async def run_pass(self, p: Pass) -> datetime | str | None:
        """One pass of ``test_workflow`` (``HarnessSteps``); returns when to wake it next (None:
        only an outside event wakes it; ``"finished"``)."""
        recs = await self.retrying(lambda: self.rec.load(p))
        try:
            await test_workflow(HarnessSteps(self, p, recs), p.workflow in self.failing, self.version)
        except Wait as wait:
            return wait.until
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
        self.holding(d)
        try:
            p = await self.rec.claim(d.workflow, self.alive, self.budget)
        except Contended:
            with contextlib.suppress(Exception):
                await self.rec.wake_at(d, await self.rec.now() + self.alive)
            self.answered()
            return True
        except Exception:
            return True  # the delivery reappears after its visibility
        try:
            wake = await self.run_pass(p)
        except Fenced:
            # a newer pass holds it, so a newer take does: the answer below is stale and must act
            # on nothing (stale-answer), whichever kind it is
            await self.stale_answer(d, p)
            self.answered()
            return True
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
            self.answered()
            await self.rec.release(p)
        return True

    async def stale_answer(self, d: Delivery, p: Pass) -> None:
        """Answer ``d`` after this pass was fenced, as a careless worker does: done, retry now or
        retry later, the kind fixed by the seed, the workflow and the token. The store must ignore
        it (a later take superseded ``d``'s receipt)."""
        kind = random.Random(f"{self.cfg.seed}:stale:{p.workflow}:{p.token}").choice(["done", "now", "later"])
        with contextlib.suppress(Exception):
            now = await self.rec.now()
            at = {"done": None, "now": now, "later": now + self.alive}[kind]
            await self.rec.wake_at(d, at, fenced=True)

    def _held_file(self) -> Path:
        return self.cfg.run_dir / "held" / f"{self.name}.pickle"

    def holding(self, d: Delivery) -> None:
        """Keep the delivery this worker holds in a file of its own, so that if it is killed its
        restarted self can answer it late (``answer_orphan``). A receipt that does not pickle is
        not kept."""
        path = self._held_file()
        with contextlib.suppress(Exception):
            path.parent.mkdir(exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(pickle.dumps(d))
            os.replace(tmp, path)

    def answered(self) -> None:
        """Forget the kept delivery once this worker has answered it: only a delivery its holder
        never answered (killed first) is answered again by its restarted self."""
        self._held_file().unlink(missing_ok=True)

    async def answer_orphan(self) -> None:
        """A restarted worker answers the delivery its killed self held, due now, once that
        delivery's visibility has run out (so another worker has likely taken it again): a late
        answer from a killed holder, which must act on nothing if it is stale (``stale-answer``),
        and is harmless (due now) if it is not."""
        path = self._held_file()
        try:
            d = pickle.loads(path.read_bytes())
        except Exception:
            return
        path.unlink(missing_ok=True)
        await asyncio.sleep(self.visibility.total_seconds() + 0.5)
        with contextlib.suppress(Exception):
            await self.rec.wake_at(d, await self.rec.now(), orphan=True)

    async def run(self) -> None:
        orphan = asyncio.create_task(self.answer_orphan())  # beside the loop: it waits a visibility
        while not self.stopping:
            if not await self.one():
                await self.idle()
        orphan.cancel()

    async def idle(self) -> None:
        """Wait out the poll interval: on the store's wakeup when the run gave one (it returns
        early when work may be due; one that fails is slept out), else asleep. A wakeup's counts of
        lost and renewed subscriptions, when they change, are a ``wakeup`` line."""
        wakeup = self.opened.wakeup
        if wakeup is None:
            await asyncio.sleep(self.poll)
            return
        try:
            await wakeup.wait(timedelta(seconds=self.poll))
        except Exception:
            await asyncio.sleep(self.poll)
        seen = (int(getattr(wakeup, "reads_lost", 0)), int(getattr(wakeup, "resubscribed", 0)))
        if seen != getattr(self, "_wakeup_seen", (0, 0)):
            self._wakeup_seen = seen
            self.hist.event("info", what="wakeup", lost=seen[0], resubscribed=seen[1])


class LibraryClient:
    """The same workflow as a ``Run`` body, run by the library's ``Worker`` (``worker`` mode)."""

    def __init__(self, worker: Worker) -> None:
        self.w = worker

    def body(self) -> Callable[[Any], Awaitable[object]]:
        """The ``Run`` body (``library_body``)."""
        return library_body(self.w)

    async def run(self) -> None:
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
            wakeup=w.opened.wakeup,
        )
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stop)
        await worker.run()


def library_body(w: Host) -> Callable[[Any], Awaitable[object]]:
    """The ``Run`` body a library ``Worker`` of ``w`` runs: ``test_workflow`` (``LibrarySteps``)
    as one ``body`` operation."""

    async def body(run: Any) -> object:
        # the body as one operation, so no-hung-pass can tell when the pass outlived it
        op = w.hist.invoke("body", workflow=run.workflow, token=run.pass_.token)
        try:
            await test_workflow(LibrarySteps(w, run), run.workflow in w.failing, w.version)
        except BaseException as exc:  # a wait (Suspended), Fenced, a failure: the body ended
            w.hist.complete(op, "body", "ok", token=run.pass_.token, ended=type(exc).__name__)
            raise
        w.hist.complete(op, "body", "ok", token=run.pass_.token, ended="returned")
        return None

    return body


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
