"""One run of one scenario on one store: services, processes, nemesis, final heal, final state,
checkers, report. ``run`` is what ``wd-chaos run`` calls; ``analyze`` re-checks a stored run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from without_durability.testing.kit import default_kit

from .. import __version__, history

# moved to wd_chaos.analyze (runner -> report -> shrink -> runner was a cycle); kept importable here
from ..analyze import DamagedRun as DamagedRun
from ..analyze import Outcome, analyze
from ..analyze import analyze_partial as analyze_partial
from ..analyze import read_parts as read_parts
from ..client.recorder import Recorder
from ..config import validate as validate_config
from ..faults import Nemesis, service_needs
from ..fleet import fleet_specs
from ..history import HistoryWriter
from ..mutation.catalogue import find_mutant, mutant_wrap
from ..rundir import FinalState, read_store_final
from ..rundir import FinalUnread as FinalUnread
from ..scenario import OptionError, Scenario, TimeLimit, WorkerCount, WorkflowCount, bounded, plan
from ..stores import Spec, open_store, prepare, store_clocks
from .cluster import Cluster as Cluster
from .cluster import Watch as Watch
from .cluster import drain_storm, run_storm, run_workload, wait_for_heal
from .kits import check_store
from .lifeline import Lifeline
from .services import check_urls, clean_up, services, sweep_stale
from .toxi import ToxiproxyStuck

Progress = Callable[[dict[str, Any]], None]


@dataclass
class Options:
    """What the command line may change about a scenario."""

    store: str = field(default_factory=default_kit)
    """The kit to run on; unset, the registry's ``default_kit`` (a store that needs no server)."""
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
    opened = await open_store(spec, mutant_wrap(spec))
    try:
        rec = Recorder(opened.durable, hist)
        now = await rec.now()
        for wf, start in zip(workflows, starts, strict=True):
            await rec.schedule(wf, now + timedelta(seconds=start))
    finally:
        await opened.close()


async def read_final(
    spec: Spec,
    workflows: list[str],
    lifecycle: dict[str, Any] | None = None,
    failing: list[str] | None = None,
    fleet: list[dict[str, Any]] | None = None,
    poll_interval: float | None = None,
    wakeup: dict[str, float] | None = None,
) -> FinalState:
    """The store's final state: every workflow's history (key, value, written_at) and load
    order, the ledger rows, and which clocks the store ran on (``stores.store_clocks``); a
    lifecycle run's ``lifecycle`` and ``failing`` (what its checkers judge against) with it;
    ``poll_interval``, the longest any worker polled at (``pickup``'s bound), when given;
    ``wakeup``, the run's wakeup bounds (``wakeup-pickup``'s), when its workers had wakeups."""
    opened = await open_store(spec, mutant_wrap(spec))
    try:
        cp = opened.durable.checkpointer
        more = {
            **store_clocks(spec, cp),
            **({"lifecycle": lifecycle, "failing": failing} if lifecycle is not None else {}),
            # fencing's takeover rule: on when any worker (a mixed fleet's or a deploy's too)
            # asked for it, on a kit whose spec knows the setting
            "fast_failover": "fast_failover" in spec
            and any(bool(s.get("fast_failover")) for s in (spec, *(fleet or []))),
            **(await _queue(opened)),
            **({"poll_interval": poll_interval} if poll_interval is not None else {}),
            **({"wakeup": wakeup} if wakeup is not None else {}),
        }
        return await read_store_final(cp, workflows, opened.read_ledger, more)
    finally:
        await opened.close()


async def _queue(opened: Any) -> dict[str, Any]:
    """The queue's entries per workflow where the kit reads them (``queue-bounded``), else nothing."""
    if opened.read_queue is None:
        return {}
    return {"queue": await opened.read_queue(), "queue_entries_per_workflow": opened.queue_entries_per_workflow}


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"wd-chaos": __version__, "python": platform.python_version()}
    for dist in ("without-durability", "psycopg", "redis", "toxiproxy-python", "locust"):
        with contextlib.suppress(PackageNotFoundError):
            out[dist] = version(dist)
    return out


def check_options(scenario: Scenario, opts: Options) -> None:
    """Refuse, with ``OptionError`` naming the option and its limit, what the command line may not
    ask of ``scenario``: numbers outside the bounds its file is held to, a time limit so short that
    no fault starts, or one that scales its workflows past the workflow limit; a store it does not
    apply to; an unknown mutant. Starts nothing."""
    opts.store = check_store(scenario, opts.store)  # an alias (redis) becomes its kit's name
    if opts.mutant:
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


@dataclass(frozen=True)
class RunPlan:
    """One run decided before anything starts, from the scenario, the options and the seed alone:
    the same plan for the same inputs (``plan_run``)."""

    scenario: Scenario
    opts: Options
    seed: int
    limit: float
    """Seconds of workload (or storm) and faults."""
    n_workers: int
    names: list[str]
    """The worker processes' names (none for a storm, whose users are locust's)."""
    work: dict[str, Any]
    """The scenario's ``[workload]`` with ``workers`` and ``client`` as the options set them."""
    workflows: list[str]
    starts: list[float]
    """Seconds after the workload's start at which each of ``workflows`` starts."""
    events: list[dict[str, Any]]
    """The fault schedule: the seed's, or the options' replayed one."""
    failing: list[str]
    """Workflows whose body fails on purpose (a lifecycle run's, picked by the seed)."""

    @property
    def judged_lifecycle(self) -> dict[str, Any] | None:
        """The lifecycle the checkers judge against (with the claim budget), or None."""
        life = self.scenario.lifecycle
        return None if life is None else {**life.model_dump(), "claim_budget": self.scenario.lease.budget}


def plan_run(scenario: Scenario, opts: Options) -> RunPlan:
    """The run ``opts`` asks of ``scenario``; ``OptionError`` (``check_options``) for options
    the scenario's bounds refuse. Starts nothing and writes nothing."""
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
    failing: list[str] = []
    life = scenario.lifecycle
    if life is not None:  # the seed picks which workflows fail on purpose
        failing = sorted(
            random.Random(f"{seed}:failing").sample(workflows, min(life.failing, len(workflows)))
        )
    names = [] if storm is not None else [f"worker-{i}" for i in range(n_workers)]
    return RunPlan(scenario, opts, seed, limit, n_workers, names, work, workflows, starts, events, failing)


class _Reporter:
    """The progress callback's view of a run: its phase, elapsed time and folder."""

    def __init__(self, progress: Progress | None, run_dir: Path) -> None:
        self.progress = progress
        self.run_dir = run_dir
        self.started = time.monotonic()
        self.phase = "starting"

    def __call__(self, **more: Any) -> None:
        if self.progress is not None:
            elapsed = time.monotonic() - self.started
            self.progress({"phase": self.phase, "elapsed": elapsed, "run_dir": str(self.run_dir), **more})


@dataclass
class Provisioned:
    """A run's folder, its controller's history and lifeline, made before any server starts."""

    run_dir: Path
    lifeline: Lifeline
    hist: HistoryWriter
    report: _Reporter

    def interrupted(self, exc: BaseException) -> None:
        """Say in the folder why the run stopped, keeping the per-process histories."""
        (self.run_dir / "INTERRUPTED").write_text(f"{type(exc).__name__}: {exc}\n")
        self.hist.close()
        self.lifeline.release()


def provision(p: RunPlan, progress: Progress | None) -> Provisioned:
    """Check the server URLs the run needs, clear what killed runs left, and make the run's
    folder (``scenario.json``, the controller's history with its ``run`` line)."""
    # a refused or malformed URL variable is named now, as --check names it, not by a driver later
    check_urls(p.opts.store, **service_needs(p.events))
    sweep_stale()  # servers an earlier, killed run left behind
    run_dir = _run_dir(p.opts.report_dir, p.scenario.name, p.opts.store)
    lifeline = Lifeline(run_dir)
    (run_dir / "scenario.json").write_text(p.scenario.model_dump_json(indent=2))
    report = _Reporter(progress, run_dir)
    hist = HistoryWriter(run_dir / "procs" / f"controller.{os.getpid()}.jsonl", "controller")
    hist.event(
        "info",
        what="run",
        scenario=p.scenario.name,
        store=p.opts.store,
        seed=p.seed,
        time_limit=p.limit,
        workers=p.n_workers,
        workflows=len(p.workflows),
        schedule=p.events,
    )
    report()
    return Provisioned(run_dir, lifeline, hist, report)


def _variants(p: RunPlan) -> list[dict[str, Any]]:
    """Every setting a worker of the run may have run with: a mixed fleet's, and those a fault's
    events restart workers onto (their ``to``, as a deploy's)."""
    out: list[dict[str, Any]] = list(fleet_specs(p.scenario.fleet, p.n_workers).values())
    return out + [dict(e["to"]) for e in p.events if isinstance(e.get("to"), dict)]


def _poll(p: RunPlan) -> float:
    """The longest poll interval a worker of the run may have had: the run's ``[lease]``'s, or a
    variant's (a mixed fleet's, a deploy's) where longer."""
    lease = [v.get("lease") for v in _variants(p)]
    polls = [float(x["poll_interval"]) for x in lease if isinstance(x, dict) and "poll_interval" in x]
    return max([p.scenario.lease.poll_interval, *polls])


def _wakeup(p: RunPlan) -> dict[str, float] | None:
    """The run's wakeup bounds (``[lease]``), None when its workers had no wakeup."""
    lease = p.scenario.lease
    if not lease.wakeup:
        return None
    return {"bound": lease.wakeup_bound, "resubscribe": lease.wakeup_resubscribe}


def _configure(p: RunPlan, svc: Any, prov: Provisioned) -> Path:
    """With the servers up: prepare the store, schedule the workflows, and write the config.json
    every process reads (refused here, not in a worker, when malformed)."""
    storm, life = p.scenario.storm, p.scenario.lifecycle
    asyncio.run(prepare(svc.spec, mutant_wrap(svc.spec)))
    if svc.careless_spec is not None:
        asyncio.run(prepare(svc.careless_spec, mutant_wrap(svc.careless_spec)))
    if storm is None or storm.kind == "take":
        asyncio.run(_seed_workflows(svc.spec, prov.hist, p.workflows, p.starts))
    if svc.lazyfs is not None:  # a power loss tests the workload's writes, not the setup's
        svc.lazyfs.sync()
    store_spec = dict(svc.spec)
    if p.scenario.lease.wakeup:  # idle workers wait on the store's wakeup; writers notify it
        store_spec["wakeup"] = True
    if life is not None:  # for a store whose retention is a time to live
        store_spec["ttl"] = life.ttl  # small, so the waits outlast it
    cfg = {
        "run_dir": str(prov.run_dir),
        "store": store_spec,
        "lifecycle": life.model_dump() if life is not None else None,
        "failing": p.failing,
        "worker_urls": svc.worker_urls,
        "wakeup_urls": svc.wakeup_urls,
        "worker_specs": fleet_specs(p.scenario.fleet, p.n_workers),
        "lease": p.scenario.lease.model_dump(),
        "workload": p.work,
        "seed": p.seed,
        "workflows": p.workflows,
        "starts": p.starts,
        "t0": time.time(),
        "retry_seconds": p.scenario.lease.budget * 2 + 10,
        "storm": storm.model_dump() if storm is not None else None,
    }
    if svc.careless_spec is not None:  # the careless clients' own store (wd_chaos.client.clients)
        cfg["careless_store"] = svc.careless_spec
    config = prov.run_dir / "config.json"
    config.write_text(validate_config(cfg, str(config)).to_json())
    return config


def execute(p: RunPlan, svc: Any, prov: Provisioned, config: Path) -> None:
    """Start the processes and run the workload under the fault schedule (or the storm), then the
    final heal and the wait for every workflow to finish; the processes are stopped and every
    fault healed whatever happens."""
    hist, report, storm, life = prov.hist, prov.report, p.scenario.storm, p.scenario.lifecycle
    cluster = Cluster(config, prov.run_dir, hist)
    watch = Watch(prov.run_dir / "procs")
    nemesis = Nemesis(
        p.events,
        hist,
        prov.run_dir,
        pids=cluster.pids,
        busy=watch.busy,
        writes=watch,
        seed=p.seed,
        services={
            "toxi": svc.toxi,
            "proxies": svc.proxies,
            "wakeup_proxies": svc.wakeup_proxies,
            "server": svc.server,
            "lazyfs": svc.lazyfs,
        },
    )
    try:
        if storm is not None:
            report.phase = "storm"
            run_storm(storm, p.limit, cluster, watch, report, p.opts.locust_workers)
            if storm.kind == "take":  # the storm's workflows finished afterwards (liveness)
                report.phase = "draining"
                drain_storm(p.scenario.heal_seconds, svc.spec, p.workflows, cluster, watch, report)
        else:
            report.phase = "workload"
            if life is not None:
                cluster.start("sweeper", "sweeper")
            careless = p.work["careless_clients"]
            run_workload(
                p.names,
                p.work["writers"],
                p.work["readers"],
                p.limit,
                cluster,
                watch,
                nemesis,
                report,
                careless,
            )
            report.phase = "healing"
            nemesis.heal()
            heal = p.scenario.heal_seconds
            done = wait_for_heal(heal, svc.spec, p.workflows, cluster, watch, report, life is not None)
            hist.event("fault", fault="heal", phase="stop", finished=done)
    finally:
        # when the processes were asked to end: no-hung-pass judges who never did
        hist.event("info", what="stop")
        cluster.stop()
        nemesis.heal()


def collect(
    p: RunPlan, prov: Provisioned, final: FinalState, cleaned: list[dict[str, str]] | None = None
) -> Outcome:
    """Store what the run left (``final.json``, the merged ``history.jsonl``, ``run.json``, with
    ``store_cleanup``: what ``clean_up`` removed from the store or kept, and why) and judge it
    (``analyze``)."""
    run_dir = prov.run_dir
    (run_dir / "final.json").write_text(json.dumps(final.to_json(), indent=1, default=str))
    prov.hist.close()
    history.merge(sorted((run_dir / "procs").glob("*.jsonl")), run_dir / "history.jsonl")
    shutil.rmtree(run_dir / "procs")
    shutil.rmtree(run_dir / "armed", ignore_errors=True)
    opts = p.opts
    meta = {
        "scenario": p.scenario.name,
        "store": opts.store,
        "seed": p.seed,
        "time_limit": p.limit,
        "workers": p.n_workers,
        "workflows": len(p.workflows),
        "schedule": p.events,
        # a replayed schedule did not come from the seed: say so, and from where
        "schedule_from": "seed" if opts.schedule is None else (opts.schedule_source or "replay"),
        "mutant": opts.mutant,
        "client": p.work.get("client", "harness"),
        "wall_seconds": round(time.monotonic() - prov.report.started, 2),
        "versions": _versions(),
        "store_cleanup": cleaned or [],
    }
    (run_dir / "run.json").write_text(json.dumps(meta, indent=2))
    # released after the merge and the verdict: a kill before them still leaves INTERRUPTED
    try:
        return analyze(run_dir)
    finally:
        prov.lifeline.release()


def run(scenario: Scenario, opts: Options, progress: Progress | None = None) -> Outcome:
    """Run ``scenario`` on ``opts.store`` and store it under ``opts.report_dir``: plan, provision,
    execute, collect. Options the scenario's bounds refuse raise ``OptionError``
    (``check_options``) before anything starts."""
    p = plan_run(scenario, opts)
    prov = provision(p, progress)
    try:
        needs = service_needs(p.events)
        careless = p.work["careless_clients"] > 0
        with services(
            opts.store, prov.run_dir, p.names, mutant=opts.mutant, careless=careless, **needs
        ) as svc:
            try:
                config = _configure(p, svc, prov)
                execute(p, svc, prov, config)
                prov.report.phase = "checking"
                prov.report()
                final = asyncio.run(
                    read_final(
                        svc.spec, p.workflows, p.judged_lifecycle, p.failing, _variants(p), _poll(p), _wakeup(p)
                    )
                )
            finally:  # what the run created on a user's server goes, whatever happened (or says why not)
                cleaned = clean_up(svc)
                prov.hist.event("info", what="cleanup", store=cleaned)
    except BaseException as exc:
        # Ctrl-C, a server that would not start, a crashed storm: say so in the folder, keep the
        # per-process histories for a post-mortem, and let the caller report it
        prov.interrupted(exc)
        if isinstance(exc, ToxiproxyStuck):  # the caller may run the case again: say where this one is
            exc.run_dir = prov.run_dir
        raise
    return collect(p, prov, final, cleaned)


_workload = run_workload
"""The name ``run_workload`` had before it moved to ``wd_chaos.control.cluster`` (a test drives it)."""
