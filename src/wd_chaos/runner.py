"""One run of one scenario on one store: services, processes, nemesis, final heal, final state,
checkers, report. ``run`` is what ``wd-chaos run`` calls; ``analyze`` re-checks a stored run.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from . import __version__, checks, history, wallclock
from .checks.coverage import hits_of
from .config import validate as validate_config
from .faults import Nemesis, service_needs
from .history import HistoryWriter, Tail
from .lifeline import Lifeline, die_with_parent
from .scenario import OptionError, Scenario, TimeLimit, WorkerCount, WorkflowCount, bounded, plan
from .services import check_urls, services, sweep_stale
from .stores import Spec, open_store, prepare, store_clocks
from .workload import Recorder

Progress = Callable[[dict[str, Any]], None]


@dataclass
class Options:
    """What the command line may change about a scenario."""

    store: str = "sqlite"
    seed: int | None = None
    time_limit: float | None = None
    workers: int | None = None
    report_dir: Path = Path("reports")
    client: str | None = None
    mutant: str | None = None
    schedule: list[dict[str, Any]] | None = None
    """An exact fault schedule to run instead of the one ``plan`` makes from the seed (a replay)."""
    schedule_source: str | None = None
    """Where ``schedule`` came from (a file), recorded in run.json so a reader knows."""
    locust_workers: int = 0
    """A storm's locust in its distributed mode: a master and this many worker processes (0: one
    process)."""


@dataclass
class Outcome:
    """A finished run: where it is stored and its verdicts."""

    run_dir: Path
    verdicts: list[checks.Verdict]
    valid: checks.Valid
    summary: dict[str, Any] = field(default_factory=dict)


class Cluster:
    """The workload's processes: start, restart after a kill, stop."""

    def __init__(self, config: Path, run_dir: Path, hist: HistoryWriter) -> None:
        self.config = config
        self.run_dir = run_dir
        self.hist = hist
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping = False
        self.restarts = 0
        self.log = (run_dir / "processes.log").open("ab")

    def start(self, role: str, name: str, command: list[str] | None = None, *, patched: bool = False) -> None:
        """Start a process; ``patched``: let locust monkey-patch it (a distributed storm's master,
        whose messaging to its workers needs that, and which runs no user)."""
        command = command or [sys.executable, "-m", "wd_chaos.workload", role, str(self.config), name]
        env = {**os.environ, "WD_CHAOS_CONFIG": str(self.config), "LOCUST_SKIP_MONKEY_PATCH": "1"}
        if patched:
            del env["LOCUST_SKIP_MONKEY_PATCH"]
        # A new session: Ctrl-C in the terminal reaches the runner only, which stops them itself;
        # the kernel kills them if the runner dies without doing so (lifeline.die_with_parent)
        me = os.getpid()
        self.procs[name] = subprocess.Popen(
            command,
            env=env,
            stdout=self.log,
            stderr=self.log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=lambda: die_with_parent(me),  # prctl must run in the child, before exec
        )

    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self.procs.items()}

    def supervise(self) -> None:
        """Restart a worker that died (a failpoint kill); writers that finished stay finished."""
        for name, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None or self.stopping or not name.startswith("worker"):
                continue
            old = proc.pid
            self.start("worker", name)
            self.restarts += 1
            self.hist.event(
                "fault",
                fault="kill",
                phase="stop",
                target=name,
                target_pid=old,
                returncode=code,
                restarted_pid=self.procs[name].pid,
            )

    def writers_done(self) -> bool:
        return all(p.poll() is not None for n, p in self.procs.items() if n.startswith("writer"))

    def alive(self, name: str) -> bool:
        return name in self.procs and self.procs[name].poll() is None

    def stop(self, grace: float = 5.0) -> None:
        """SIGCONT (a stalled process cannot exit), SIGTERM, then SIGKILL what is left."""
        self.stopping = True
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.log.close()


READY_WAIT = 10.0
"""The most a run's fault phase is stretched for workers slow to make their first calls."""


class Watch:
    """Tails every process's history file: who is inside an effect, and running counts."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tails: dict[Path, Tail] = {}
        self.in_effect: dict[str, str | None] = {}
        self.counts: Counter[str] = Counter()
        self.terminal: set[str] = set()
        """Workflows with an acknowledged ``wd/finished`` or ``wd/failed/`` record (lifecycle)."""
        self._terminal_ops: dict[str, str] = {}
        self.effect_workflow: dict[str, str | None] = {}
        self.effect_began: dict[str, int] = {}
        self._writes: dict[str, tuple[str, int]] = {}
        self.last_write: dict[str, tuple[int, int]] = {}
        """Per workflow, its latest write that took (won, or an append): (invoke, complete) mono ns."""
        self.began: set[str] = set()
        """Processes that have invoked their first store call."""

    def poll(self) -> None:
        for path in self.folder.glob("*.jsonl"):
            tail = self.tails.setdefault(path, Tail(path))
            for line in tail.read():
                name = str(line.get("process"))
                if line["type"] == "invoke":
                    self.began.add(name)
                if line["type"] == "invoke" and line["f"] == "record":
                    key = str(line.get("key"))
                    if key == "wd/finished" or key.startswith("wd/failed/"):
                        self._terminal_ops[str(line["op"])] = str(line.get("workflow"))
                if (
                    line["type"] == "complete"
                    and line["outcome"] == "ok"
                    and line["op"] in self._terminal_ops
                ):
                    self.terminal.add(self._terminal_ops[line["op"]])
                if line["type"] == "invoke" and line["f"] in ("record", "transact", "supply", "append"):
                    self._writes[str(line["op"])] = (str(line.get("workflow")), int(line["mono"]))
                elif line["type"] == "complete" and str(line["op"]) in self._writes:
                    wf, invoked = self._writes.pop(str(line["op"]))
                    if line["outcome"] == "ok" and line.get("won", True):
                        self.last_write[wf] = max(self.last_write.get(wf, (0, 0)), (invoked, int(line["mono"])))
                if line["type"] == "invoke" and line["f"] == "effect":
                    self.in_effect[name] = str(line.get("key"))
                    self.effect_workflow[name] = str(line.get("workflow"))
                    self.effect_began[name] = int(line["mono"])
                elif line["type"] == "complete":
                    if line["f"] == "effect":
                        self.in_effect[name] = None
                    self.counts["ops"] += 1
                    self.counts[line["outcome"]] += 1
                elif line["type"] == "info" and line.get("what") == "start":
                    self.in_effect[name] = None
                elif line["type"] == "fault" and line.get("phase") == "start":
                    self.counts["faults"] += 1

    def busy(self, inside: str = "step") -> set[str]:
        """Workers inside a step's effect (``step``) or a transact's (``transact``)."""
        transact = inside == "transact"
        return {
            n for n, k in self.in_effect.items()
            if k is not None and (k == "ledger") == transact and n.startswith("worker")
        }  # fmt: skip

    def busy_after_write(self, since_ns: int, within: float) -> dict[str, str]:
        """Workers inside a step's effect (with its workflow), begun less than ``within`` seconds
        ago, whose workflow took a write invoked after ``since_ns`` (monotonic) and acknowledged
        less than ``within`` seconds ago: the record ending the step is that workflow's next write,
        so a clock moved now lands between the two. (An older effect may have been stalled, its
        pass superseded: its record would be refused.)"""
        now = time.monotonic_ns()
        fresh = {}
        for name in self.busy("step"):
            wf = str(self.effect_workflow.get(name))
            invoked, acked = self.last_write.get(wf, (0, 0))
            began = self.effect_began.get(name, 0)
            if invoked > since_ns and now - acked < within * 1e9 and now - began < within * 1e9:
                fresh[name] = wf
        return fresh

    def written_since(self, workflow: str, since_ns: int) -> bool:
        """Whether ``workflow`` took a write invoked after ``since_ns`` (monotonic), acknowledged."""
        return self.last_write.get(workflow, (0, 0))[0] > since_ns


def _run_dir(base: Path, scenario: str, store: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    path = base / f"{stamp}-{scenario}-{store}"
    n = 1
    while path.exists():
        n += 1
        path = base / f"{stamp}-{scenario}-{store}-{n}"
    path.mkdir(parents=True)
    return path


async def _seed_workflows(spec: Spec, hist: HistoryWriter, workflows: list[str], starts: list[float]) -> None:
    opened = await open_store(spec)
    try:
        rec = Recorder(opened.durable, hist)
        now = await rec.now()
        for wf, start in zip(workflows, starts, strict=True):
            await rec.schedule(wf, now + timedelta(seconds=start))
    finally:
        await opened.close()


async def _workflows_done(spec: Spec, workflows: list[str]) -> int:
    opened = await open_store(spec)
    try:
        done = 0
        for wf in workflows:
            if "done" in await opened.durable.checkpointer.load(wf):
                done += 1
        return done
    finally:
        await opened.close()


async def read_final(spec: Spec, workflows: list[str]) -> dict[str, Any]:
    """The store's final state: every workflow's history (key, value, written_at) and load
    order, the ledger rows, and which clocks the store ran on (``stores.store_clocks``)."""
    opened = await open_store(spec)
    try:
        cp = opened.durable.checkpointer
        out: dict[str, Any] = {}
        for wf in workflows:
            entries = await cp.history(wf)
            loaded = await cp.load(wf)
            out[wf] = {
                "history": [[e.key, e.value, e.written_at.isoformat()] for e in entries],
                "load_keys": list(loaded),
            }
        return {
            "workflows": out,
            "ledger": await opened.read_ledger(workflows),
            "expected_workflows": workflows,
            **store_clocks(spec, cp),
        }
    finally:
        await opened.close()


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"wd-chaos": __version__, "python": platform.python_version()}
    for dist in ("without-durability", "psycopg", "redis", "toxiproxy-python", "locust"):
        with contextlib.suppress(PackageNotFoundError):
            out[dist] = version(dist)
    return out


def _storm(
    storm: Any,
    seconds: float,
    cluster: Cluster,
    watch: Watch,
    report: Callable[..., None],
    locust_workers: int = 0,
) -> None:
    """Run the locust storm headless, in one process or (``locust_workers``) as locust's own
    master and worker processes, and wait for it (with a hard deadline)."""
    # the locustfile by path, never imported here: importing locust monkey-patches this process
    spec = importlib.util.find_spec("wd_chaos.storms")
    locustfile = str(spec.origin) if spec is not None else ""
    readers = storm.readers if storm.kind == "append" else 0
    # ReadUser has a fixed count (the config's readers); locust gives the other users the rest
    users = {"take": ["TakeUser"], "append": ["AppendUser"] + (["ReadUser"] if readers else [])}[storm.kind]
    command = [
        sys.executable, "-m", "locust", "-f", locustfile, "--headless",
        "-u", str(storm.users + readers), "-r", str(storm.spawn_rate + readers), "-t", f"{seconds:.0f}s",
        "--stop-timeout", "5", "--only-summary", "--loglevel", "WARNING",
        "--exit-code-on-error", "0", *users,
    ]  # fmt: skip
    if locust_workers:
        from without_durability.testing.servers import free_port

        port = free_port()
        command += ["--master", "--expect-workers", str(locust_workers), "--master-bind-port", str(port)]
        for i in range(locust_workers):
            cluster.start("locust", f"locust-worker-{i}", [
                sys.executable, "-m", "locust", "-f", locustfile, "--worker", "--master-host", "127.0.0.1",
                "--master-port", str(port), "--loglevel", "WARNING",
            ])  # fmt: skip
    cluster.start("locust", "locust", command, patched=bool(locust_workers))
    deadline = time.monotonic() + seconds + 60
    started = time.monotonic()
    while cluster.alive("locust"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the locust storm did not stop within {seconds + 60:.0f}s")
        watch.poll()
        report(
            ops=watch.counts["ops"],
            fenced=watch.counts["fenced"],
            limit=seconds,
            elapsed_storm=time.monotonic() - started,
        )
        time.sleep(0.2)
    code = cluster.procs["locust"].returncode
    if code != 0:
        raise RuntimeError(f"the locust storm exited {code}: see {cluster.run_dir}/processes.log")


def _workload(
    names: list[str],
    writers: int,
    readers: int,
    limit: float,
    cluster: Cluster,
    watch: Watch,
    nemesis: Nemesis,
    report: Callable[..., None],
    careless: int = 0,
) -> None:
    """Start the workers, the outside writers, the readers and the careless clients, and run the
    fault schedule for ``limit`` s."""
    for name in names:
        cluster.start("worker", name)
    for i in range(writers):
        cluster.start("writer", f"writer-{i}")
    for i in range(readers):
        cluster.start("reader", f"reader-{i}")
    for i in range(careless):
        cluster.start("careless", f"careless-{i}")
    mono0 = time.monotonic()
    late: float | None = None
    at_limit: set[int] | None = None
    while True:
        elapsed = time.monotonic() - mono0
        watch.poll()
        if late is None and set(names) <= watch.began:
            late = elapsed
        if elapsed >= limit:
            # on a loaded machine workers can spend seconds importing before their first call:
            # faults still waiting for a worker, or begun only past the limit, get that long
            # again past it to start and run their course, no longer
            grace = min(late if late is not None else elapsed, READY_WAIT)
            if at_limit is None:
                at_limit = {id(a) for a in nemesis.active}
            begun_late = any(id(a) not in at_limit for a in nemesis.active)
            if not ((nemesis.waiting(elapsed) or begun_late) and elapsed < limit + grace):
                break
        nemesis.tick(elapsed)
        cluster.supervise()
        report(
            ops=watch.counts["ops"],
            fenced=watch.counts["fenced"],
            faults=nemesis.count,
            restarts=cluster.restarts,
            limit=limit,
            stalled=len(nemesis.stalled),
        )
        time.sleep(0.05)


def _heal(
    seconds: float,
    spec: Spec,
    workflows: list[str],
    cluster: Cluster,
    watch: Watch,
    report: Callable[..., None],
    lifecycle: bool = False,
) -> int:
    """After the final heal: wait (at most ``seconds``) for every workflow to finish; returns how
    many did."""
    deadline = time.monotonic() + seconds
    last_check = 0.0
    done = 0
    while time.monotonic() < deadline:
        watch.poll()
        cluster.supervise()
        if time.monotonic() - last_check > 0.5 and cluster.writers_done():
            last_check = time.monotonic()
            # With retention set small a terminal workflow may be gone from the store already:
            # count what the history says reached a terminal record instead.
            if lifecycle:
                done = len(watch.terminal & set(workflows))
            else:
                done = asyncio.run(_workflows_done(spec, workflows))
            if done == len(workflows):
                break
        report(
            ops=watch.counts["ops"],
            fenced=watch.counts["fenced"],
            done=done,
            total=len(workflows),
            restarts=cluster.restarts,
        )
        time.sleep(0.1)
    return done


def check_options(scenario: Scenario, opts: Options) -> None:
    """Refuse, with ``OptionError`` naming the option and its limit, what the command line may not
    ask of ``scenario``: numbers outside the bounds its file is held to, a time limit so short that
    no fault starts, or one that scales its workflows past the workflow limit; a store it does not
    apply to; an unknown mutant. Starts nothing."""
    from .kits import check_store

    opts.store = check_store(scenario, opts.store)  # an alias (redis) becomes its kit's name
    if opts.mutant:
        from .stores import find_mutant

        try:
            find_mutant(opts.mutant, opts.store)
        except ValueError as exc:
            raise OptionError(f"--mutant: {exc}") from exc
    if opts.workers is not None:
        bounded(WorkerCount, opts.workers, "--workers")
    if opts.schedule is not None:
        _check_schedule(scenario, opts)
    if opts.time_limit is None:
        return
    limit = float(bounded(TimeLimit, opts.time_limit, "--time-limit"))
    if scenario.storm is None:
        n_wf = max(1, round(scenario.workload.workflows * limit / scenario.time_limit))
        bounded(
            WorkflowCount,
            n_wf,
            f"--time-limit {limit:g} scales {scenario.name}'s {scenario.workload.workflows} workflows "
            f"(per {scenario.time_limit:g} s) to {n_wf}; workflows",
        )
    seed = scenario.seed if opts.seed is None else opts.seed
    workers = opts.workers or scenario.workload.workers
    if opts.schedule is None and scenario.faults and not plan(scenario, seed, workers, limit):
        first = min(f.at for f in scenario.faults)
        raise OptionError(
            f"--time-limit: {limit:g} s ends before {scenario.name}'s first fault (at {first:g} s), "
            f"so the run would test nothing; give more than {first:g}"
        )


def _check_schedule(scenario: Scenario, opts: Options) -> None:
    """A replayed schedule must fit the run: its workers exist, its faults start inside the time
    limit, and a storm scenario (which has no nemesis) takes none."""
    source = opts.schedule_source or "--schedule"
    schedule = opts.schedule or []
    if scenario.storm is not None and schedule:
        raise OptionError(f"{source}: {scenario.name} is a storm scenario; it runs no fault schedule")
    workers = opts.workers or scenario.workload.workers
    limit = scenario.time_limit if opts.time_limit is None else opts.time_limit
    for i, ev in enumerate(schedule):
        target = str(ev.get("target", ""))
        if target.startswith("worker-") and int(target.removeprefix("worker-")) >= workers:
            raise OptionError(
                f"{source}: event [{i}].target: {target} does not exist in a run of {workers} workers "
                f"(worker-0 to worker-{workers - 1}); give --workers or edit the event"
            )
        if float(ev["at"]) >= limit:
            raise OptionError(
                f"{source}: event [{i}].at: {ev['at']} s is not inside the time limit ({limit:g} s), "
                f"so it would never start; give a longer --time-limit or drop the event"
            )


def run(scenario: Scenario, opts: Options, progress: Progress | None = None) -> Outcome:
    """Run ``scenario`` on ``opts.store`` and store it under ``opts.report_dir``. Options the
    scenario's bounds refuse raise ``OptionError`` (``check_options``) before anything starts."""
    check_options(scenario, opts)
    seed = scenario.seed if opts.seed is None else opts.seed
    limit = scenario.time_limit if opts.time_limit is None else opts.time_limit
    scale = limit / scenario.time_limit
    n_workers = opts.workers or scenario.workload.workers
    work = scenario.workload.model_dump()
    work["workers"] = n_workers
    if opts.client is not None:
        work["client"] = opts.client
    n_wf = max(1, round(scenario.workload.workflows * scale))
    spread = scenario.workload.spread_seconds * scale
    rng = random.Random(f"{seed}:workload")
    storm = scenario.storm
    if storm is not None:
        n_wf = storm.workflows
        limit = storm.seconds if opts.time_limit is None else opts.time_limit
        spread = 0.0
    workflows = [f"{scenario.name}-s{seed}-{i:04d}" for i in range(n_wf)]
    starts = sorted(round(rng.uniform(0, spread), 3) for _ in workflows)
    events = plan(scenario, seed, n_workers, limit) if opts.schedule is None else list(opts.schedule)
    # a refused or malformed URL variable is named now, as --check names it, not by a driver later
    check_urls(opts.store, **service_needs(events))
    sweep_stale()  # servers an earlier, killed run left behind
    run_dir = _run_dir(opts.report_dir, scenario.name, opts.store)
    lifeline = Lifeline(run_dir)
    (run_dir / "scenario.json").write_text(scenario.model_dump_json(indent=2))
    names = [] if storm is not None else [f"worker-{i}" for i in range(n_workers)]
    started = time.monotonic()
    hist = HistoryWriter(run_dir / "procs" / f"controller.{os.getpid()}.jsonl", "controller")
    hist.event(
        "info",
        what="run",
        scenario=scenario.name,
        store=opts.store,
        seed=seed,
        time_limit=limit,
        workers=n_workers,
        workflows=n_wf,
        schedule=events,
    )
    phase = "starting"

    def report(**more: Any) -> None:
        if progress is not None:
            progress({"phase": phase, "elapsed": time.monotonic() - started, "run_dir": str(run_dir), **more})

    report()
    try:
        with services(
            opts.store,
            run_dir,
            names,
            mutant=opts.mutant,
            careless=work["careless_clients"] > 0,
            **service_needs(events),
        ) as svc:
            asyncio.run(prepare(svc.spec))
            if svc.careless_spec is not None:
                asyncio.run(prepare(svc.careless_spec))
            if storm is None or storm.kind == "take":
                asyncio.run(_seed_workflows(svc.spec, hist, workflows, starts))
            t0 = time.time()
            life = scenario.lifecycle
            store_spec = dict(svc.spec)
            if life is not None:  # for a store whose retention is a time to live
                store_spec["ttl"] = life.ttl  # small, so the waits outlast it
            failing: list[str] = []
            if life is not None:  # the seed picks which workflows fail on purpose
                picked = random.Random(f"{seed}:failing").sample(workflows, min(life.failing, len(workflows)))
                failing = sorted(picked)
            cfg = {
                "run_dir": str(run_dir),
                "store": store_spec,
                "lifecycle": life.model_dump() if life is not None else None,
                "failing": failing,
                "worker_urls": svc.worker_urls,
                "lease": scenario.lease.model_dump(),
                "workload": work,
                "seed": seed,
                "workflows": workflows,
                "starts": starts,
                "t0": t0,
                "retry_seconds": scenario.lease.budget * 2 + 10,
                "storm": storm.model_dump() if storm is not None else None,
            }
            if svc.careless_spec is not None:  # the careless clients' own store (wd_chaos.clients)
                cfg["careless_store"] = svc.careless_spec
            config = run_dir / "config.json"
            config.write_text(validate_config(cfg, str(config)).to_json())  # refused here, not in a worker
            cluster = Cluster(config, run_dir, hist)
            watch = Watch(run_dir / "procs")
            nemesis = Nemesis(
                events,
                hist,
                run_dir,
                pids=cluster.pids,
                busy=watch.busy,
                writes=watch,
                seed=seed,
                toxi=svc.toxi,
                proxies=svc.proxies,
                server=svc.server,
            )
            try:
                if storm is not None:
                    phase = "storm"
                    _storm(storm, limit, cluster, watch, report, opts.locust_workers)
                else:
                    phase = "workload"
                    if life is not None:
                        cluster.start("sweeper", "sweeper")
                    careless = work["careless_clients"]
                    _workload(names, work["writers"], work["readers"], limit, cluster, watch, nemesis, report, careless)
                    phase = "healing"
                    nemesis.heal()
                    done = _heal(
                        scenario.heal_seconds, svc.spec, workflows, cluster, watch, report, life is not None
                    )
                    hist.event("fault", fault="heal", phase="stop", finished=done)
            finally:
                # when the processes were asked to end: no-hung-pass judges who never did
                hist.event("info", what="stop")
                cluster.stop()
                nemesis.heal()
            phase = "checking"
            report()
            final = asyncio.run(read_final(svc.spec, workflows))
            if life is not None:  # what the lifecycle checkers judge against
                final["lifecycle"] = {**life.model_dump(), "claim_budget": scenario.lease.budget}
                final["failing"] = failing
    except BaseException as exc:
        # Ctrl-C, a server that would not start, a crashed storm: say so in the folder, keep the
        # per-process histories for a post-mortem, and let the caller report it
        (run_dir / "INTERRUPTED").write_text(f"{type(exc).__name__}: {exc}\n")
        hist.close()
        lifeline.release()
        raise
    (run_dir / "final.json").write_text(json.dumps(final, indent=1, default=str))
    hist.close()
    history.merge(sorted((run_dir / "procs").glob("*.jsonl")), run_dir / "history.jsonl")
    shutil.rmtree(run_dir / "procs")
    shutil.rmtree(run_dir / "armed", ignore_errors=True)
    meta = {
        "scenario": scenario.name,
        "store": opts.store,
        "seed": seed,
        "time_limit": limit,
        "workers": n_workers,
        "workflows": n_wf,
        "schedule": events,
        # a replayed schedule did not come from the seed: say so, and from where
        "schedule_from": "seed" if opts.schedule is None else (opts.schedule_source or "replay"),
        "mutant": opts.mutant,
        "client": work.get("client", "harness"),
        "wall_seconds": round(time.monotonic() - started, 2),
        "versions": _versions(),
    }
    (run_dir / "run.json").write_text(json.dumps(meta, indent=2))
    # released after the merge and the verdict: a kill before them still leaves INTERRUPTED
    try:
        return analyze(run_dir)
    finally:
        lifeline.release()


class DamagedRun(ValueError):
    """A run folder ``analyze`` refuses to judge (interrupted, a file missing, cut or altered);
    the message names the folder, the file and what is wrong."""


def read_parts(run_dir: Path, *names: str) -> tuple[Scenario, list[dict[str, Any]]]:
    """A run folder's ``scenario.json`` and the named JSON files, each of which must hold an
    object; anything missing or malformed raises ``DamagedRun`` naming the folder."""
    try:
        scenario = Scenario.model_validate_json((run_dir / "scenario.json").read_text())
        parts = [json.loads((run_dir / name).read_text()) for name in names]
    except (OSError, ValueError) as exc:
        raise DamagedRun(f"{run_dir}: not a finished run's folder: {exc}") from exc
    if not all(isinstance(part, dict) for part in parts):
        raise DamagedRun(f"{run_dir}: {' and '.join(names)} must each hold a JSON object")
    return scenario, parts


def _read_run(run_dir: Path) -> tuple[Scenario, dict[str, Any], list[history.Op], dict[str, Any]]:
    """Everything ``analyze`` judges, read and verified before anything in the folder is written."""
    if not run_dir.is_dir():
        raise DamagedRun(f"{run_dir}: not a run folder (no such directory)")
    stopped = run_dir / "INTERRUPTED"
    if stopped.exists() and not (run_dir / "history.jsonl").exists():
        why = stopped.read_text(errors="replace").strip()
        raise DamagedRun(
            f"{run_dir}: the run did not finish ({why}); nothing to judge as a finished run "
            "(wd-chaos analyze --partial judges what it recorded)"
        )
    scenario, (meta, final) = read_parts(run_dir, "run.json", "final.json")
    try:
        ops = history.load_finished(run_dir / "history.jsonl")
    except history.DamagedHistory as exc:
        raise DamagedRun(str(exc)) from exc
    return scenario, meta, ops, final


def analyze(run_dir: Path) -> Outcome:
    """Re-run the checkers on a stored run (history.jsonl, final.json, scenario.json) and rewrite
    its summary.json and report.html. A folder that is not a finished run's, or whose history
    fails its end line's check, raises ``DamagedRun`` and is left as it was."""
    from .report import write_report

    scenario, meta, ops, final = _read_run(run_dir)
    steps = wallclock.steps(ops)
    verdicts = checks.check(
        ops, {**final, "wall_clock_steps": steps}, scenario.checks, scenario.bite, scenario.coverage
    )
    valid = checks.overall(verdicts)
    counts = Counter(f"{o['f']}:{o['outcome']}" for o in ops if o["type"] == "complete")
    summary = {
        **meta,
        "valid": valid,
        "exit_code": checks.exit_code(valid),
        "verdicts": [v.as_dict() for v in verdicts],
        "coverage": hits_of(verdicts),
        "counts": dict(sorted(counts.items())),
        "faults": [o for o in ops if o["type"] == "fault"],
        "store_clock": final.get("store_clock", "unrecorded"),
        "lease_clock": final.get("lease_clock", "unrecorded"),
        "wall_clock_steps": steps,
        "analyzed_at": datetime.now(UTC).isoformat(),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    write_report(run_dir, summary, ops, final)
    return Outcome(run_dir, verdicts, valid, summary)


class FinalUnread(LookupError):
    """What a checker meets when it reads the store's final state in a partial analysis: an
    interrupted run never read it."""


class _Unread(dict[str, Any]):
    """The final state of an interrupted run: only what it holds (the wall-clock steps, read from
    the history; the clocks, unrecorded); any other read raises ``FinalUnread``, so a checker that
    needs the store's final state says unknown rather than judging an empty store."""

    def __getitem__(self, key: str) -> Any:
        if dict.__contains__(self, key):
            return super().__getitem__(key)
        raise FinalUnread(key)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key]

    def __contains__(self, key: object) -> bool:
        if dict.__contains__(self, key):
            return True
        raise FinalUnread(key)


def _read_partial(run_dir: Path) -> tuple[Scenario, dict[str, Any], list[history.Op]]:
    """An interrupted run's scenario, what its controller recorded about the run, and every
    complete line its processes wrote (a torn last line, cut by the kill, skipped)."""
    try:
        scenario = Scenario.model_validate_json((run_dir / "scenario.json").read_text())
    except (OSError, ValueError) as exc:
        raise DamagedRun(f"{run_dir}: not a run's folder: {exc}") from exc
    files = sorted((run_dir / "procs").glob("*.jsonl"))
    if not files:
        raise DamagedRun(f"{run_dir}: no per-process histories (procs/*.jsonl): nothing was recorded")
    ops: list[history.Op] = []
    for path in files:
        try:
            ops.extend(history.read_lines(path))
        except ValueError as exc:
            raise DamagedRun(f"{path}: a line that is not JSON ({exc}); this history cannot be judged") from exc
    ops.sort(key=lambda o: (o.get("mono", 0), o.get("process", ""), o.get("op", "")))
    started = next((o for o in ops if o.get("type") == "info" and o.get("what") == "run"), None)
    if started is None:
        raise DamagedRun(f"{run_dir}: the controller's history never recorded the run's start")
    meta = {k: started.get(k) for k in ("scenario", "store", "seed", "time_limit", "workers", "workflows", "schedule")}
    return scenario, meta, ops


def analyze_partial(run_dir: Path) -> Outcome:
    """Judge what an interrupted run recorded: its per-process histories, never merged, and no
    final state (the run stopped before reading it). Checkers that need the final state are
    unknown; the others judge the history as far as it goes. The outcome is never valid (a run
    cut short proves nothing whole): invalid on a violation found, else unknown. Writes
    ``summary.json`` with ``"partial": true`` (the folder stays ``INTERRUPTED``); a finished run's
    folder is analyzed as ``analyze`` does."""
    if not (run_dir / "INTERRUPTED").exists() or (run_dir / "history.jsonl").exists():
        return analyze(run_dir)
    scenario, meta, ops = _read_partial(run_dir)
    steps = wallclock.steps(ops)
    judged = checks.check(
        ops,
        _Unread({"wall_clock_steps": steps, "store_clock": "unrecorded", "lease_clock": "unrecorded"}),
        scenario.checks,
        scenario.bite,
        scenario.coverage,
    )
    verdicts = []
    for v in judged:
        if v.valid == checks.UNKNOWN and "FinalUnread" in str(v.evidence[:1]):
            v = checks.Verdict(v.name, checks.UNKNOWN, "not judged: it needs the store's final state, which "
                               "the interrupted run never read")  # fmt: skip
        verdicts.append(v)
    valid: checks.Valid = False if checks.overall(verdicts) is False else checks.UNKNOWN
    why = (run_dir / "INTERRUPTED").read_text(errors="replace").strip()
    counts = Counter(f"{o['f']}:{o['outcome']}" for o in ops if o.get("type") == "complete")
    summary = {
        **meta,
        "partial": True,
        "interrupted": why,
        "valid": valid,
        "exit_code": checks.exit_code(valid),
        "verdicts": [v.as_dict() for v in verdicts],
        "coverage": hits_of(verdicts),
        "counts": dict(sorted(counts.items())),
        "faults": [o for o in ops if o.get("type") == "fault"],
        "wall_clock_steps": steps,
        "analyzed_at": datetime.now(UTC).isoformat(),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return Outcome(run_dir, verdicts, valid, summary)
