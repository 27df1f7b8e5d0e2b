"""One simulated run: the library's own Worker, Run and dag code against a store, in one process on a
``SimLoop``, with faults at its awaits, recorded as the process harness records a run.

Everything a run does follows from ``(scenario, seed, mutant)``: the workload (the scenario's
workflows, workers and writers, each a simulated *process*), the store's clocks (virtual: a wall
clock that steps forward and back, a lease clock that a reboot restarts), the nemesis's schedule and
the scheduler's choices. The history is the process harness's format (``wd_chaos.history``: the
same invoke, complete, effect, fault and info lines, stamped with virtual ``mono`` and ``wall``), so
the same checkers (``wd_chaos.checks``) judge it.

Faults (the nemesis's are the simulated forms of the fault registry's kinds, drawn by their shares:
``faults.base.SimulatedForm``; the kinds' modules say what each does, today):

- ``kill``: a worker process crashes (its tasks vanish at whatever await they were at; nothing in
  them runs again) and a new incarnation starts later;
- ``stall``: a worker is frozen past its lease (``over: alive``) or its whole budget, then resumes;
- ``wall-step``: the wall clock the store stamps records and queue times with steps forward or back;
- ``reboot``: every worker crashes and the store's lease clock restarts from a small number (the
  store's records are kept: the Memory store's as they are, the SQLite store's in its file, which
  the workers started after the reboot open again; ``wd_chaos.sim.stores``);
- at every store call (the *wire*): a request and a reply latency (an await where a cancel lands
  before the store applied the call, or after), a reply lost after the store applied it (the caller
  gets ``StoreUnavailable``: an unknown outcome), a delivery handed out twice by ``take``;
- writers give up on a call after a short timeout (``wait_for``): a cancel at any await of it.

A call cancelled before the store applied it is marked ``unsent`` on its complete line, one whose
cancel the call swallowed (it returned as if never cancelled) ``cancel_swallowed``:
``cancelled-calls`` judges both.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import random
import sys
import types
import warnings
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any

from without_durability import Delivery, Fenced, InvalidInput, RetryPolicy, Worker
from without_durability.errors import Contended
from without_durability.testing.kit import find_kit
from without_durability.testing.simulated import SimulatedStore

from .. import wallclock
from ..checks import UNKNOWN, bites, checkers, overall, run_checker
from ..checks.core import paired_once
from ..checks.coverage import coverage
from ..checks.receipts_distinct import REDELIVERED
from ..client import careless
from ..client.recorder import Recorder, receipt_text
from ..client.testflow import library_body
from ..client.workload import plan_writes, recording_durable
from ..faults.base import kinds, simulated_forms
from ..rundir import FinalState, read_store_final
from ..scenario import Scenario
from .loop import PROCESS, SimLoop
from .wire import (
    POLL_FLOOR,
    READ_BACK,
    READ_FLOOR,
    SIM_CHECKS,
    Rates,
    Result,
    SimDurable,
    SimHistory,
    SimRecorder,
    World,
)


def open_simulated(store: str, world: World, mutant: Any) -> SimulatedStore:
    """The store ``store`` for one simulated run on ``world``'s clocks, from its kit (one that
    provides ``simulated``), ``mutant`` (a catalogue entry, or None) applied to it."""
    kit = find_kit(store)
    wrap = mutant.wrap if mutant is not None else None
    return kit.open_simulated(world.wall, world.lease_micros, wrap)

RETAKE_UNIT = 0.25
"""The retake probe's time unit, in virtual seconds (a binary fraction: sums of it are exact)."""

# -- the processes -------------------------------------------------------------------------------------


class SimHost:
    """What the test workflow (``wd_chaos.client.testflow``) asks of a simulated worker process:
    its history, the scenario's workload, an effect's nonce and length (drawn from the run's
    seed), and the store's ledger effect; no failpoint is armed in a simulated run."""

    def __init__(self, sim: Sim, hist: SimHistory) -> None:
        self.sim = sim
        self.hist = hist
        self.work = sim.work
        self.failing: set[str] = set()  # sim runs no lifecycle scenario
        self.version = 1

    def effect_nonce(self, token: int) -> str:
        sim = self.sim
        sim.nonce += 1
        return f"{self.hist.process}:{self.hist.pid}:{token}:{sim.nonce}"

    def effect_seconds(self, workflow: str, key: str) -> float:
        return self.work.step_seconds * (0.5 + self.sim.rng.random())

    def failpoint(self, point: str, **where: Any) -> None:
        pass

    def store_ledger_effect(self, workflow: str, key: str, token: int, failpoint: Callable[[], None]) -> Any:
        return self.sim.sim_store.ledger_effect(workflow, key, token)


class Sim:
    """Builds and runs one simulated run (see the module docstring); ``run`` returns its ``Result``."""

    def __init__(
        self,
        scenario: Scenario,
        seed: int,
        *,
        mutant: Any = None,
        rates: Rates | None = None,
        plan: frozenset[str] | None = None,
        store: str,
    ) -> None:
        self.scenario = scenario
        self.seed = seed
        self.mutant = mutant
        self.rng = random.Random(f"sim:{scenario.name}:{seed}")
        self.loop = SimLoop(random.Random(f"sim-loop:{scenario.name}:{seed}"))  # type: ignore[abstract]
        self.world = World(self.loop, self.rng, rates or Rates(), plan)
        work = scenario.workload
        self.work = work
        self.lease = scenario.lease
        world = self.world
        self.store_name = find_kit(store).name
        self.sim_store = open_simulated(store, world, mutant)
        self.store = self.sim_store.durable
        self.workflows = [f"{scenario.name}-s{seed}-{i:04d}" for i in range(work.workflows)]
        self.starts = sorted(round(self.rng.uniform(0, work.spread_seconds), 3) for _ in self.workflows)
        self.workers: dict[str, tuple[str, Worker[Any]]] = {}
        self.serving: dict[str, asyncio.Task[Any]] = {}
        self.probes: dict[str, str] = {}
        """Each probe's outcome (``retake``: answered, not-taken, or the error that ended it)."""
        """Live worker by name: its process id on the loop and its library Worker."""
        self.killed: dict[str, tuple[int, str]] = {}
        """A killed worker's name, its old pid and the kind that killed it, until a new
        incarnation starts."""
        self.stalls: dict[str, tuple[str, str, dict[str, Any], asyncio.TimerHandle]] = {}
        """A stall that holds its process now, by id: the process, its kind, its line, its end's
        timer."""
        self.nemesis_hist: SimHistory | None = None
        """The nemesis's history writer, once it has started (it writes every fault line)."""
        self.incarnation = 0
        self.nonce = 0
        self.healed = False

    # -- helpers ---------------------------------------------------------------------------------

    def process(self, name: str, *, faults: bool = True) -> tuple[SimHistory, SimRecorder, str]:
        """A new simulated process's history writer, recorder (whose calls meet the wire's faults
        unless ``faults`` is False) and loop id."""
        world = self.world
        pid = world.pid()
        hist = SimHistory(world, name, pid)
        rec = SimRecorder(world, SimDurable(world, self.sim_store.durable), hist, self.sim_store.peek, faults=faults)
        return hist, rec, f"{name}#{pid}"

    def spawn(self, proc: str, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        context = contextvars.copy_context()
        context.run(PROCESS.set, proc)
        return self.loop.create_task(coro, context=context)

    def ledger_effect(self, workflow: str, key: str, token: int) -> Callable[[Any], object]:
        return self.sim_store.ledger_effect(workflow, key, token)

    # -- workers ---------------------------------------------------------------------------------

    def start_worker(self, name: str) -> None:
        hist, rec, proc = self.process(name)
        hist.event("info", what="start", role="worker")
        lease = self.lease
        worker: Worker[Any] = Worker(
            recording_durable(rec),
            library_body(SimHost(self, hist)),
            alive=timedelta(seconds=lease.alive),
            budget=timedelta(seconds=lease.budget),
            visibility=timedelta(seconds=lease.visibility),
            poll_interval=timedelta(seconds=max(lease.poll_interval, POLL_FLOOR)),
            retry_contended=timedelta(seconds=lease.alive),
            # any failure of the body is final: with a store that keeps its promises the body never
            # fails, so a workflow that fails shows up as unfinished (liveness)
            retry=RetryPolicy(maximum_attempts=1),
        )
        self.workers[name] = (proc, worker)
        old = self.killed.pop(name, None)
        if old is not None and self.nemesis_hist is not None:
            # the supervisor's line, as the process harness writes it when it restarts a dead
            # worker (``control.cluster``): what tells every checker the old process has ended
            pid, kind = old
            self.fault(self.nemesis_hist, kind, "stop", target=name, target_pid=pid, returncode=-9,
                       restarted_pid=hist.pid)  # fmt: skip

        async def serve() -> None:
            try:
                await worker.run()
            finally:
                hist.event("info", what="exit", role="worker")

        self.serving[name] = self.spawn(proc, serve())

    # -- outside writers and a reader --------------------------------------------------------------

    async def writer(self, index: int) -> None:
        hist, rec, _ = self.process(f"writer-{index}")
        work = self.work
        rng = random.Random(f"sim:{self.seed}:writer:{index}")
        plan = plan_writes(work, self.workflows, self.starts, index, rng)
        world = self.world
        for at, wf, what, m in plan:
            delay = at - world.elapsed()
            if delay > 0:
                await asyncio.sleep(delay)
            for attempt in range(100):
                timeout = (
                    world.rates.latency * rng.random() * 2 if rng.random() < world.rates.timeout else None
                )
                if timeout is not None and not world.permits(world.next_id("timeout")):
                    timeout = None
                try:
                    await asyncio.wait_for(self.write(rec, wf, what, index, m, attempt), timeout)
                    if rng.random() < READ_BACK:
                        with contextlib.suppress(Exception):
                            await rec.read(wf, via="writer")
                    break
                except (Exception, Contended, Fenced, asyncio.CancelledError) as exc:
                    if isinstance(exc, asyncio.CancelledError) and _cancelling():
                        raise  # this writer itself is being cancelled
                    await asyncio.sleep(0.3)
        del hist

    async def write(self, rec: SimRecorder, wf: str, what: str, index: int, m: int, attempt: int) -> None:
        """One attempt of a writer's call. Each attempt's value is its own (``try``), so a call that
        was cancelled or lost is told apart from its retry in the store (what cancelled-calls and
        order need to judge a call by its value)."""
        if what == "message":
            await rec.deliver(wf, {"from": index, "n": m, "try": attempt})
        elif what == "forge":
            with contextlib.suppress(InvalidInput):
                await rec.supply(wf, careless.FORGED_KEY, {"by": index, "try": attempt}, forged=True)
        elif what == "approval":
            await rec.arrive(wf, f"approval-{index}", {"by": index, "try": attempt})
        else:
            await rec.supply(wf, f"approval-{index}", {"by": index, "again": True, "try": attempt})

    async def reader(self, stop: asyncio.Event) -> None:
        _, rec, _ = self.process("reader-0")
        world = self.world
        n = 0
        while not stop.is_set():
            due = [
                wf for wf, s in zip(self.workflows, self.starts, strict=True) if s <= world.elapsed() + 0.5
            ]
            if due:
                n += 1
                with contextlib.suppress(Exception):
                    await rec.read(self.rng.choice(due), "history" if n % 2 else "load")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(self.work.read_pause, READ_FLOOR))

    # -- the nemesis -------------------------------------------------------------------------------

    def fault(self, hist: SimHistory, fault: str, phase: str, **more: Any) -> None:
        hist.event("fault", fault=fault, phase=phase, **more)

    async def nemesis(self, until: float) -> None:
        """Until ``until`` (or the heal), every so often one fault drawn from the simulated forms
        of the fault registry's kinds (``faults.base.simulated_forms``); each form draws its
        event's details and calls the primitives below, naming its kind for the fault lines."""
        hist, _, _ = self.process("nemesis")
        self.nemesis_hist = hist
        world, rng = self.world, self.rng
        forms = simulated_forms()
        n = 0
        while True:
            await asyncio.sleep(rng.expovariate(1 / world.rates.nemesis_every))
            if world.elapsed() >= until or self.healed:
                return
            n += 1
            roll = rng.random()
            for bound, _, form in forms:
                if roll < bound and form.applies(self):
                    await form.inject(self, n)
                    break

    # the primitives the simulated forms call (``faults.base.SimulatedForm``)

    def crash(self, kind: str, name: str, n: int, *, restart: bool = True) -> None:
        """Worker ``name`` crashes at whatever await it is (a ``kind`` line); restarted later."""
        assert self.nemesis_hist is not None
        proc, _ = self.workers.pop(name)
        pid = int(proc.rsplit("#", 1)[1])
        self.fault(self.nemesis_hist, kind, "start", id=f"{kind}-{n}", target=name, target_pid=pid)
        self.killed[name] = (pid, kind)
        self.loop.crash(proc)
        self.world.count(kind.replace("-", "_"))
        if restart:
            self.loop.call_later(
                self.rng.uniform(0.3, 2.0), lambda: self.restart(name), context=contextvars.Context()
            )

    def hold(self, kind: str, name: str, n: int, duration: float, over: str) -> None:
        """Worker ``name`` is frozen for ``duration`` seconds (past its lease or budget, ``over``)."""
        assert self.nemesis_hist is not None
        loop = self.loop
        proc, _ = self.workers[name]
        pid = int(proc.rsplit("#", 1)[1])
        ev = {"id": f"{kind}-{n}", "target": name, "target_pid": pid, "duration": duration, "over": over}
        self.fault(self.nemesis_hist, kind, "start", **ev)
        loop.stall(proc, loop.time() + duration)
        self.world.count(kind.replace("-", "_"))
        self.stalls[str(ev["id"])] = (
            proc,
            kind,
            ev,
            loop.call_at(
                loop.time() + duration, lambda: self.end_stall(str(ev["id"])), context=contextvars.Context()
            ),
        )

    async def reboot(self, kind: str, n: int, crash: str) -> None:
        """The machine reboots: every worker crashes (a ``crash`` line each), the machine stays
        down past a budget, the lease clock restarts small and the store is opened again."""
        assert self.nemesis_hist is not None
        hist, world = self.nemesis_hist, self.world
        self.fault(hist, kind, "start", id=f"{kind}-{n}")
        self.down = True  # no worker restarts on a machine that is down
        for name in sorted(self.workers):
            self.crash(crash, name, n, restart=False)
        # down for longer than a budget, as a reboot is: every claim of before lapses in real
        # time, so a claim after it is fair, and one refused for a deadline of the old
        # uptime is the store's mistake
        await asyncio.sleep(self.lease.budget + self.rng.uniform(0.5, 2.0))
        world.reboot()
        self.sim_store.reboot()  # a file store opens its file again
        self.store = self.sim_store.durable
        world.count(kind.replace("-", "_"))
        self.down = False
        for i in range(self.work.workers):
            if f"worker-{i}" not in self.workers:
                self.start_worker(f"worker-{i}")
        self.fault(hist, kind, "stop", id=f"{kind}-{n}")

    def step_wall(self, kind: str, n: int, seconds: float) -> None:
        """The store's virtual wall clock steps by ``seconds``."""
        assert self.nemesis_hist is not None
        self.world.wall_offset += seconds
        self.world.count(kind.replace("-", "_"))
        self.fault(self.nemesis_hist, kind, "start", id=f"{kind}-{n}", seconds=seconds, target="store")

    def end_stall(self, fault: str) -> None:
        """Write the stop line of the stall ``fault`` (its time came, or the heal ended it)."""
        _, kind, ev, _ = self.stalls.pop(fault)
        assert self.nemesis_hist is not None  # a stall is the nemesis's
        self.fault(self.nemesis_hist, kind, "stop", **ev)

    def heal_stalls(self) -> None:
        """The heal's SIGCONT, as the process harness's ``nemesis.heal`` gives it: every stall still
        holding a process ends now, so each worker can finish its workflow and exit when asked."""
        for fault in sorted(self.stalls):
            proc, _, _, timer = self.stalls[fault]
            timer.cancel()
            self.loop.resume(proc)
            self.end_stall(fault)

    def restart(self, name: str) -> None:
        if name not in self.workers and not self.healed_all and not self.down:
            self.start_worker(name)

    healed_all = False
    down = False

    # -- the run -----------------------------------------------------------------------------------

    async def main(self) -> FinalState:
        hist, rec, _ = self.process("controller", faults=False)
        scenario = self.scenario
        hist.event("info", what="run", scenario=scenario.name, store=self.store_name, seed=self.seed, sim=True,
                   workers=self.work.workers, workflows=len(self.workflows),
                   mutant=getattr(self.mutant, "name", None),
                   **({} if self.world.plan is None else {"faults": sorted(self.world.plan)}))  # fmt: skip
        now = await rec.now()
        for wf, start in zip(self.workflows, self.starts, strict=True):
            await rec.schedule(wf, now + timedelta(seconds=start))
        for i in range(self.work.workers):
            self.start_worker(f"worker-{i}")
        writers = [self.spawn(f"writer-{i}", self.writer(i)) for i in range(self.work.writers)]
        stop_reading = asyncio.Event()
        reader = self.spawn("reader-0", self.reader(stop_reading))
        limit = scenario.time_limit
        self.spawn("nemesis", self.nemesis(limit))
        await asyncio.sleep(limit)
        self.healed = True
        self.fault(hist, "heal", "start")
        self.heal_stalls()
        # the heal: no new faults; wait for every workflow to finish, or the heal's time to run out
        deadline = self.world.elapsed() + self.scenario.heal_seconds
        while self.world.elapsed() < deadline:
            finished = sum(1 for wf in self.workflows if self.sim_store.peek(wf, "done")[1])
            if finished == len(self.workflows) and all(w.done() for w in writers):
                break
            await asyncio.sleep(0.5)
        self.fault(hist, "heal", "stop", finished=finished)
        # the supervisor's last round: a worker killed too late for its restart to come first is
        # started now (and stopped with the rest), so each killed process is one that ended
        for name in sorted(self.killed):
            self.start_worker(name)
        hist.event("info", what="stop")
        self.healed_all = True
        stop_reading.set()
        for _, worker in self.workers.values():
            worker.stop()
        # room for passes to end (a hung one does not); a stopped worker's task ends with its pass
        serving = [self.serving[name] for name in self.workers if name in self.serving]
        if serving:
            await asyncio.wait(serving, timeout=self.lease.budget + 1)
        del reader
        await self.retake_probe()
        # the final reads, after everything: what cancelled-calls and the checkers compare against
        _, final_rec, _ = self.process("final-reader", faults=False)
        for wf in self.workflows:
            with contextlib.suppress(Exception):
                await final_rec.read(wf, "load")
        return await self.final()

    async def retake_probe(self) -> None:
        """Two takes of one workflow whose visibilities end at the same virtual instant: a take for
        3u, a wakeup u later, a take for 2u. In a queue of its own (``scheduler_in``: no worker
        takes from it) and with no wire between it and the store, so no latency moves the clock
        between the calls. Then the first holder answers late (done, retry later or retry now, by
        the seed), a take must find nothing, and the second holder answers. ``receipts-distinct``
        judges the two receipts (a receipt that is the hidden-until time alone repeats here)."""
        sched = self.sim_store.scheduler_in(f"retake-{self.seed}")
        if sched is None:
            return
        world = self.world
        hist = SimHistory(world, "retaker", world.pid())
        proc = f"retaker#{hist.pid}"
        rec = Recorder(types.SimpleNamespace(checkpointer=None, scheduler=sched), hist)
        wf, unit = f"probe/retake/{self.seed}", timedelta(seconds=RETAKE_UNIT)

        async def take(visibility: timedelta) -> Delivery | None:
            return await rec._call(
                "take", {"visibility": visibility.total_seconds(), "probe": True}, lambda: sched.take(visibility),
                lambda d: {"workflow": d and d.workflow, "receipt": d and receipt_text(d.receipt)},
            )  # fmt: skip

        async def probe() -> None:
            start = await rec.now()
            await rec.schedule(wf, start - unit)
            first = await take(3 * unit)
            await asyncio.sleep(RETAKE_UNIT)
            await rec.schedule(wf)  # a wakeup while the first take holds it: due again now
            # hidden until the first take's instant, to the microsecond (measured, not assumed)
            second = await take(start + 3 * unit - await rec.now())
            if first is None or second is None:
                outcome["retake"] = "not-taken"  # the coincidence could not be staged
                return
            late = (None, 4 * unit, timedelta(0))[self.seed % 3]
            await rec.wake_at(first, None if late is None else await rec.now() + late)
            await take(unit)  # the second take hides it: nothing is due
            await rec.wake_at(second, None)
            outcome["retake"] = "answered"

        outcome: dict[str, str] = {}
        self.loop.free = proc  # its steps cost no time: the calls land at the instants chosen
        try:
            await self.spawn(proc, probe())
        except Exception as exc:  # a store that fails the probe's calls: said, not hidden
            outcome["retake"] = f"error: {type(exc).__name__}"
        finally:
            self.loop.free = None
        self.probes.update(outcome)
        hist.event("info", what="retake-probe", ended=outcome.get("retake", "unfinished"))

    async def final(self) -> FinalState:
        """The store's final state, read as the process runner reads it (``read_store_final``),
        through the store's own ``history`` and ``load``."""
        store = self.sim_store

        async def ledger(_workflows: list[str]) -> list[dict[str, Any]]:
            return store.ledger_rows()  # only this run's workflows write to its store

        more = {
            "store_clock": "local",
            "lease_clock": "monotonic",
            "redelivers": True,  # the wire hands one delivery out twice now and then (take-exclusive)
            REDELIVERED: list(self.world.redelivered),  # those deliveries' receipts (receipts-distinct)
        }
        return await read_store_final(self.store.checkpointer, self.workflows, ledger, more, read_errors=True)

    def run(self) -> Result:
        with _quiet():
            try:
                read = self.loop.run_until_complete(self.main())
                self.world.closed = True
                self.loop.teardown()
                self.workers.clear()
            finally:
                self.sim_store.close()
        steps = self.loop.steps
        lines = self.world.lines
        checks = list(dict.fromkeys([*self.scenario.checks, *SIM_CHECKS]))
        # the scenario's checkers only: its bite check and coverage windows ask whether a planned
        # fault touched something, and sim's faults are drawn anew for every seed (counted in stats)
        judged_final = read.with_steps(wallclock.steps(lines))
        final = judged_final.to_json()
        found = checkers()
        with paired_once(lines):
            verdicts = [run_checker(name, found[name], lines, judged_final) for name in checks]
            windows = self.scenario.coverage
            reached = coverage(lines, windows).counts if windows else {}
            bit = self.bites(lines, judged_final)
        judged = verdicts
        # a checker with nothing to judge (no cancel this run) does not make the run unknown; one
        # that crashed does (never valid)
        crashed = any(v.summary == "the checker crashed" for v in judged)
        valid: bool | str = False if overall(judged) is False else UNKNOWN if crashed else True
        return Result(
            self.seed,
            self.scenario.name,
            getattr(self.mutant, "name", None),
            lines,
            final,
            verdicts,
            valid,
            steps,
            dict(self.world.stats),
            list(self.world.fired),
            dict(reached),
            bit,
            dict(self.probes),
        )

    def bites(self, lines: list[Any], final: FinalState) -> dict[str, bool]:
        """The bite checks of the kinds whose simulated form fired this run, replayed on it: each
        one's name and whether it bit (counted in a sweep's summary, never judged: sim draws its
        faults anew for every seed)."""
        fired = {fault.rpartition("-")[0] for fault in self.world.fired}
        checks = bites()
        return {
            name: run_checker(name, checks[name], lines, final).valid is True
            for kind, names in form_bites().items()
            if kind in fired
            for name in names
        }


@functools.cache
def form_bites() -> dict[str, tuple[str, ...]]:
    """The bite checks of each kind with a simulated form: those its own module defines."""
    by_module: dict[str, list[str]] = {}
    for name, check in bites().items():
        by_module.setdefault(check.fn.__module__, []).append(name)
    return {
        name: tuple(sorted(by_module.get(kind.spec.__module__, [])))
        for name, kind in kinds().items()
        if kind.form is not None
    }


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The library logs each fault it meets, and a crashed process's coroutines complain as they
    are closed; thousands of runs a minute would drown a terminal."""
    log = logging.getLogger("without_durability")
    was, hook = log.level, sys.unraisablehook
    log.setLevel(logging.CRITICAL + 1)  # its children (the worker's) inherit it
    sys.unraisablehook = lambda _unraisable: None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(was)
        sys.unraisablehook = hook
