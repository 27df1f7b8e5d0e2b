"""``wd-chaos sim``: many seeded simulated runs (``wd_chaos.sim.world``), a verdict per run, the
command that replays each failing seed, and a sweep's failures kept in one file.

Exit codes: 0 every run valid, 1 any run invalid, 2 none invalid but a checker crashed on one
(unknown), 64 a usage error, 255 the simulator itself failed.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from ..faults import kinds
from ..scenario import Scenario, ScenarioError, available, find, load_file
from . import SIM_CHECKS, SIMULATED, simulated_stores, simulates
from .progress import Progress
from .shrink import parse_plan, plan_text

DEFAULT_SCENARIOS = ("lease-stall",)
"""What ``wd-chaos sim`` runs when no scenario is named."""

def not_simulable(scenario: Scenario, store: str) -> str | None:
    """Why ``--all`` leaves ``scenario`` out on ``store`` (a storm, a lifecycle run, no workers,
    another store's scenario, a fault kind with no ``simulated`` form), or None when it runs it."""
    if scenario.storm is not None or scenario.lifecycle is not None or scenario.workload.workers < 1:
        return "a storm or a lifecycle run, which sim does not model"
    if scenario.stores is not None and store not in scenario.stores:
        return f"a scenario for {', '.join(scenario.stores)} only"
    forms = {name for name, kind in kinds().items() if kind.simulated or kind.form is not None}
    other = sorted({f.kind for f in scenario.faults} - forms)
    if other:
        return f"its {', '.join(other)} fault(s) have no simulated form"
    return None


def simulable(store: str) -> list[Scenario]:
    """Every built-in scenario ``--all`` runs on ``store``, by name."""
    built_in = [load_file(path) for path in available().values()]
    return [sc for sc in built_in if not_simulable(sc, store) is None]


@dataclass(frozen=True)
class Judged:
    """One run's outcome as the command reports it (small, so it crosses a process boundary)."""

    scenario: str
    seed: int
    valid: bool | str
    failing: tuple[str, ...]
    steps: int
    history_sha256: str | None
    """The SHA-256 of the run's ``history.jsonl`` bytes for a run that was not valid (what its
    replay reproduces); None for a valid run, whose history a sweep never writes (serialising
    every run's history cost a sweep a tenth of its time)."""
    evidence: dict[str, Any] | None = None
    """The first evidence of the first checker that said no (``first_evidence``); None when valid."""
    stats: dict[str, int] = field(default_factory=dict)
    """How many faults of each kind the run injected (``kill``, ``stall``, ``lost_reply``...)."""
    coverage: dict[str, int] = field(default_factory=dict)
    """Hits of each coverage window the scenario names (counted, not judged)."""
    bites: dict[str, bool] = field(default_factory=dict)
    """Whether each replayed bite check of the faults the run drew bit (counted, not judged)."""
    probes: dict[str, str] = field(default_factory=dict)
    """How each of the run's probes ended (``Result.probes``)."""


EVIDENCE_FIELDS = ("f", "workflow", "key", "token", "op", "process", "pid", "role", "why")
"""What ``first_evidence`` keeps of an evidence item: the operation and where it wrote, and why."""


def first_evidence(verdicts: Iterable[Any]) -> dict[str, Any] | None:
    """The first checker that said no, its summary, and its first evidence item's operation,
    workflow, key and why (looked for one level down when the item nests the operation); None
    when no checker said no."""
    failed = next((v for v in verdicts if v.valid is False), None)
    if failed is None:
        return None
    out: dict[str, Any] = {"checker": failed.name, "summary": failed.summary}
    item = failed.evidence[0] if failed.evidence else {}
    if isinstance(item, dict) and not any(k in item for k in ("f", "workflow", "key")):
        nested = [v for v in item.values() if isinstance(v, dict) and ("workflow" in v or "f" in v)]
        if nested:
            item = {**nested[0], **{k: v for k, v in item.items() if k == "why"}}
    if isinstance(item, dict):
        out.update({k: item[k] for k in EVIDENCE_FIELDS if item.get(k) is not None})
    return out


def evidence_text(evidence: dict[str, Any]) -> str:
    """``first_evidence`` as one line: the checker, the operation, its workflow and key, and why."""
    what = " ".join(
        f"{k} {evidence[k]}" if k != "f" else str(evidence[k])
        for k in ("f", "workflow", "key", "token", "op")
        if k in evidence
    )
    why = evidence.get("why") or evidence.get("summary", "")
    return f"{evidence['checker']}: {what + ': ' if what else ''}{why}"


def replay_command(
    scenario: str, seed: int, store: str, mutant: str | None, plan: Iterable[str] | None = None
) -> str:
    """The command that runs exactly this simulated run again (same history, byte for byte);
    ``plan``: the faults a shrunk run injects (``--faults``), None for all the seed draws."""
    parts = ["wd-chaos", "sim", scenario, "--store", store, "--seed", str(seed), "--seeds", "1"]
    if mutant:
        parts += ["--mutant", mutant]
    if plan is not None:
        parts += ["--faults", plan_text(sorted(plan, key=_fault_order))]
    return shlex.join(parts)


def _fault_order(fault: str) -> tuple[str, int]:
    kind, _, number = fault.rpartition("-")
    return kind, int(number) if number.isdigit() else 0


def simulate(
    scenario: Scenario,
    seed: int,
    mutant: str | None,
    plan: frozenset[str] | None = None,
    *,
    store: str,
) -> Any:
    """One simulated run's ``Result`` (``wd_chaos.sim.world``) on ``store``, with the catalogue
    mutant named, injecting only the faults ``plan`` names (None: every fault the seed draws)."""
    from .world import Sim

    broken = None
    if mutant:
        from ..mutation.catalogue import find_mutant

        broken = find_mutant(mutant, store)
    return Sim(scenario, seed, mutant=broken, plan=plan, store=store).run()


Job = tuple[Scenario, int, str | None, frozenset[str] | None, str]
"""One simulated run to judge: scenario, seed, mutant, fault plan, store."""


def _judge(job: Job) -> Judged:
    import hashlib

    _hush()
    scenario, seed, mutant, plan, store = job
    result = simulate(scenario, seed, mutant, plan, store=store)
    sha = None if result.valid is True else hashlib.sha256(result.history_bytes()).hexdigest()
    evidence = first_evidence(result.verdicts)
    return Judged(
        scenario.name,
        seed,
        result.valid,
        tuple(result.failing()),
        result.steps,
        sha,
        evidence,
        dict(result.stats),
        dict(result.coverage),
        dict(result.bites),
        dict(result.probes),
    )


_hushed = False


def _hush() -> None:
    """A crashed process's coroutines are collected after their run, some never started: that is
    the simulation working, not a warning for whoever reads the sweep. Once per process: each
    new filter resets the warnings registry's caches."""
    global _hushed
    if _hushed:
        return
    _hushed = True
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)


def default_jobs() -> int:
    """The processes ``--jobs`` defaults to: the cores this process may run on."""
    try:
        return max(1, min(64, len(os.sched_getaffinity(0))))
    except AttributeError:  # no affinity on this platform
        return max(1, min(64, os.cpu_count() or 1))


def _runs(jobs: list[Job], workers: int) -> Iterator[Judged]:
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            yield _judge(job)
        return
    from without_durability.testing.kit import find_kit

    from ..checks import checkers
    from . import world  # noqa: F401  # imported before the fork: each worker process inherits it

    # found before the fork too (each is looked up once, on a process's first run)
    checkers()
    for store in sorted({job[4] for job in jobs}):
        find_kit(store)
    # small chunks: a run is about a tenth of a second, and a big last chunk leaves the other
    # processes idle at the end of a short sweep
    with ProcessPoolExecutor(max_workers=workers) as pool:
        yield from pool.map(_judge, jobs, chunksize=max(1, min(4, len(jobs) // (workers * 8))))


def _scenarios(names: tuple[str, ...]) -> list[Scenario]:
    found: list[Scenario] = []
    for name in names or DEFAULT_SCENARIOS:
        try:
            scenario = find(name)
        except ScenarioError as exc:
            raise click.UsageError(str(exc)) from exc
        if scenario.storm is not None or scenario.workload.workers < 1 or scenario.lifecycle is not None:
            raise click.UsageError(
                f"scenario {scenario.name!r} is a storm or a lifecycle run, which sim does not model; "
                f"sim runs worker workloads such as {', '.join(DEFAULT_SCENARIOS)}"
            )
        found.append(scenario)
    return found


def _store(name: str | None) -> str:
    """The kit ``--store`` names (an alias reaches its kit), or the first that can be simulated;
    a usage error naming those that can when it cannot."""
    can = simulated_stores()
    if name is None and can:
        return can[0]
    if name is not None and simulates(name):
        from without_durability.testing.kit import resolve

        return resolve(name)
    raise click.UsageError(
        f"wd-chaos sim runs a store whose kit provides {SIMULATED!r}: "
        f"{', '.join(can) or 'none is installed'}{'' if name is None else f', not {name!r}'}"
    )


def write_run_folder(folder: Path, scenario: Scenario, result: Any, store: str, replay: str) -> None:
    """Write one simulated run as a run folder ``wd-chaos analyze`` judges: ``history.jsonl`` (the
    bytes a replay reproduces), ``final.json``, ``run.json`` and ``scenario.json``. The scenario
    stored is the judgement sim made (its checkers plus sim's own, no bite check or coverage
    windows: sim's faults are drawn per seed), so analyze gives the run sim's verdict."""
    folder.mkdir(parents=True, exist_ok=True)
    judged = scenario.model_copy(
        update={
            "checks": list(dict.fromkeys([*scenario.checks, *SIM_CHECKS])),
            "bite": "none",
            "coverage": [],
        }
    )
    (folder / "scenario.json").write_text(judged.model_dump_json(indent=1))
    (folder / "final.json").write_text(json.dumps(result.final, indent=1, default=str))
    work = scenario.workload
    meta = {
        "scenario": scenario.name,
        "store": store,
        "seed": result.seed,
        "sim": True,
        "time_limit": scenario.time_limit,
        "workers": work.workers,
        "workflows": work.workflows,
        "mutant": result.mutant,
        "schedule_from": "seed",
        # virtual seconds, first line to last: the run's length on its own clock
        "wall_seconds": round((result.lines[-1]["mono"] - result.lines[0]["mono"]) / 1e9, 3)
        if result.lines
        else 0,
        "replay": replay,
        "fired": list(result.fired),
    }
    (folder / "run.json").write_text(json.dumps(meta, indent=1))
    (folder / "history.jsonl").write_bytes(result.history_bytes())


@click.command("sim")
@click.argument("scenarios", nargs=-1, metavar="[SCENARIO]...")
@click.option(
    "--store",
    default=None,
    metavar="KIT",
    help=f"The store simulated: an installed kit that provides {SIMULATED!r} "
    "(default: the first of them by name).",
)
@click.option(
    "--all",
    "run_all",
    is_flag=True,
    help="Run every built-in scenario whose faults the simulator has a form of on --store "
    "(--seeds seeds each).",
)
@click.option(
    "--seeds",
    type=click.IntRange(1),
    default=100,
    show_default=True,
    help="How many seeds to run (per scenario).",
)
@click.option("--seed", "first", type=click.IntRange(0), default=0, show_default=True, help="The first seed.")
@click.option("--mutant", default=None, help="Run a catalogue mutant of the store instead of the real one.")
@click.option(
    "--jobs",
    type=click.IntRange(1, 64),
    default=default_jobs,
    show_default="the machine's cores",
    help="Processes to run seeds in.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON line per failing seed, then a summary line.")
@click.option(
    "--failures",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Append each new failing seed's replay command to this file (a sweep's findings).",
)
@click.option(
    "--history",
    type=click.Path(path_type=Path),
    default=None,
    help="With one seed: write its history here (what a replay reproduces byte for byte): a path "
    "ending in .jsonl gets the history alone, any other a run folder that wd-chaos analyze judges.",
)
@click.option(
    "--faults",
    "faults_text",
    default=None,
    metavar="IDS",
    help="With one seed: inject only these faults (ids joined by commas, or none), as a shrink prints them.",
)
@click.option(
    "--shrink",
    is_flag=True,
    help="Reduce the first failing seed's faults to a smaller plan that still fails the same checker; "
    "print the plan and its replay command.",
)
@click.option(
    "--shrink-runs",
    type=click.IntRange(1),
    default=200,
    show_default=True,
    help="The most simulated runs a shrink spends.",
)
@click.option(
    "--cluster",
    default=None,
    metavar="ADDRESS",
    help="Run the seeds on the Dask distributed cluster whose scheduler is at ADDRESS (tcp://host:8786) "
    "instead of local processes (needs the [cluster] extra).",
)
def sim_command(
    scenarios: tuple[str, ...],
    store: str | None,
    run_all: bool,
    seeds: int,
    first: int,
    mutant: str | None,
    jobs: int,
    as_json: bool,
    failures: Path | None,
    history: Path | None,
    faults_text: str | None,
    shrink: bool,
    shrink_runs: int,
    cluster: str | None,
) -> None:
    """Run SCENARIO (default: lease-stall) on a deterministic simulation of many workers and
    workflows in one process, for --seeds seeds from --seed: the library's own Worker, Run and dag
    code, faults at its awaits (crashes, stalls past the lease, cancels, lost replies, deliveries
    handed out twice, wall-clock steps, a reboot), judged by the same checkers as wd-chaos run.
    Every failing seed prints the command that replays it. Exit 0 all valid, 1 any invalid."""
    if run_all and scenarios:
        raise click.UsageError("give scenario names or --all, not both")
    store = _store(store)
    found = simulable(store) if run_all else _scenarios(scenarios)
    if mutant:
        from ..mutation.catalogue import find_mutant

        try:
            find_mutant(mutant, store)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from exc
    if history is not None and (seeds != 1 or len(found) != 1):
        raise click.UsageError("--history writes one run's history: give one scenario and --seeds 1")
    plan: frozenset[str] | None = None
    if faults_text is not None:
        if seeds != 1 or len(found) != 1:
            raise click.UsageError("--faults is one seed's plan: give one scenario and --seeds 1")
        try:
            plan = parse_plan(faults_text)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from exc
    if history is not None:
        result = simulate(found[0], first, mutant, plan, store=store)
        if history.suffix == ".jsonl":
            history.write_bytes(result.history_bytes())
        else:
            write_run_folder(
                history, found[0], result, store, replay_command(found[0].name, first, store, mutant, plan)
            )
    jobs_list: list[Job] = [
        (sc, seed, mutant, plan, store) for sc in found for seed in range(first, first + seeds)
    ]
    known = set(failures.read_text().splitlines()) if failures is not None and failures.exists() else set()
    started = time.monotonic()
    runs = invalid = unknown = 0
    worst = 0
    first_failing: Judged | None = None
    jobs = 1 if cluster is not None else min(jobs, len(jobs_list))
    if cluster is not None:
        from .cluster import run_on_cluster

        judged_runs = run_on_cluster(cluster, jobs_list, _judge)
    else:
        judged_runs = _runs(jobs_list, jobs)
    faults: Counter[str] = Counter()
    reached: dict[str, Counter[str]] = {sc.name: Counter(dict.fromkeys(sc.coverage, 0)) for sc in found}
    bitten: dict[str, tuple[int, int]] = {}
    probed: dict[str, Counter[str]] = {}
    """Per probe: how many runs ended it each way (a probe the store made fail shows here)."""
    """Per replayed bite check: the runs where it bit, and the runs that drew its fault."""
    progress = Progress(len(jobs_list))
    try:
        with progress:
            for judged in judged_runs:
                runs += 1
                faults.update(judged.stats)
                reached[judged.scenario].update(w for w, hits in judged.coverage.items() if hits)
                for name, how in judged.probes.items():
                    probed.setdefault(name, Counter())[how.partition(":")[0]] += 1
                for name, bit in judged.bites.items():
                    bitten[name] = bitten.get(name, (0, 0))
                    bitten[name] = (bitten[name][0] + bit, bitten[name][1] + 1)
                if judged.valid is False and first_failing is None:
                    first_failing = judged
                if judged.valid is not True:
                    invalid, unknown, worst = _report(
                        judged, store, mutant, plan, as_json, failures, known, invalid, unknown, worst,
                        progress.echo,
                    )  # fmt: skip
                progress.advance(invalid, unknown)
    except Exception as exc:
        from .cluster import ClusterUnavailable

        if not isinstance(exc, ClusterUnavailable):
            raise
        click.echo(f"wd-chaos sim: {exc}", err=True)
        sys.exit(255)
    elapsed = max(time.monotonic() - started, 1e-9)
    if shrink:
        if first_failing is None:
            click.echo("--shrink: no seed failed, nothing to shrink", err=True)
        else:
            _shrink(first_failing, found, store, mutant, plan, shrink_runs, as_json)
    probes = {name: dict(sorted(hows.items())) for name, hows in sorted(probed.items())}
    summary = {
        "runs": runs,
        "runs_per_minute": round(runs * 60 / elapsed, 1),
        "failures": invalid,
        "unknown": unknown,
        "jobs": jobs,
        "cluster": cluster,
        "seconds": round(elapsed, 2),
        "store": store,
        "scenarios": [sc.name for sc in found],
        "mutant": mutant,
        "faults": dict(sorted(faults.items())),
        "coverage": {name: dict(windows) for name, windows in reached.items() if windows},
        "bites": {name: {"bit": bit, "runs": n} for name, (bit, n) in sorted(bitten.items())},
        "probes": probes,
    }
    if as_json:
        click.echo(json.dumps(summary))
    else:
        where = f"cluster {cluster}" if cluster else f"{jobs} job(s)"
        click.echo(
            f"{runs} runs, {invalid} invalid, {unknown} unknown, {summary['runs_per_minute']} runs/min "
            f"({where}, {summary['seconds']} s)",
            err=as_json,
        )
        for name, hows in probes.items():
            click.echo(f"{name} probe: " + ", ".join(f"{n} {how}" for how, n in hows.items()))
    sys.exit(worst)


def _report(
    judged: Judged,
    store: str,
    mutant: str | None,
    plan: frozenset[str] | None,
    as_json: bool,
    failures: Path | None,
    known: set[str],
    invalid: int,
    unknown: int,
    worst: int,
    echo: Callable[[str], None] = click.echo,
) -> tuple[int, int, int]:
    """Print one run that was not valid with ``echo`` (and add it to the failures file); the new
    counts."""
    command = replay_command(judged.scenario, judged.seed, store, mutant, plan)
    if judged.valid is False:
        invalid += 1
        worst = 1
    else:
        unknown += 1
        worst = max(worst, 2) if worst != 1 else 1
    verdict = "invalid" if judged.valid is False else "unknown"
    if as_json:
        line = {
            "scenario": judged.scenario,
            "seed": judged.seed,
            "verdict": verdict,
            "failing": list(judged.failing),
            "evidence": judged.evidence,
            "replay": command,
        }
        echo(json.dumps(line, default=str))
    else:
        failing = ", ".join(judged.failing) or "a checker crashed"
        lines = [f"{verdict.upper()} {judged.scenario} seed {judged.seed}: {failing}"]
        if judged.evidence is not None:
            lines.append(f"  first evidence: {evidence_text(judged.evidence)}")
        lines.append(f"  replay: {command}")
        echo("\n".join(lines))  # one print: a progress bar is drawn again once, below all three
    if failures is not None and command not in known:
        known.add(command)
        with failures.open("a") as handle:
            handle.write(command + "\n")
    return invalid, unknown, worst


def _shrink(
    failing: Judged,
    found: list[Scenario],
    store: str,
    mutant: str | None,
    plan: frozenset[str] | None,
    budget: int,
    as_json: bool,
) -> None:
    """Shrink ``failing``'s fault plan (``wd_chaos.sim.shrink``) and print the smaller plan and
    the command that replays it."""
    from .shrink import shrink as shrink_plan

    scenario = next(sc for sc in found if sc.name == failing.scenario)

    def run(trial: frozenset[str] | None) -> Any:
        _hush()
        return simulate(scenario, failing.seed, mutant, plan if trial is None else trial, store=store)

    shrunk = shrink_plan(scenario, failing.seed, run, budget=budget)
    if shrunk is None:  # the seed failed in the sweep: a run that does not fail again is the harness's
        raise RuntimeError(f"seed {failing.seed} failed in the sweep and not when run again")
    command = replay_command(failing.scenario, failing.seed, store, mutant, shrunk.plan)
    if as_json:
        line = {
            "shrink": True,
            "scenario": failing.scenario,
            "seed": failing.seed,
            "checker": shrunk.checker,
            "faults_before": len(shrunk.before),
            "plan": list(shrunk.plan),
            "runs": shrunk.runs,
            "minimal": shrunk.complete,
            "replay": command,
        }
        click.echo(json.dumps(line))
        return
    click.echo(
        f"SHRUNK {failing.scenario} seed {failing.seed}: {shrunk.checker} still fails with "
        f"{len(shrunk.plan)} of {len(shrunk.before)} faults ({shrunk.runs} runs"
        f"{'' if shrunk.complete else ', budget spent before one-minimal'}): {plan_text(shrunk.plan)}"
    )
    click.echo(f"  replay: {command}")
