"""wd-chaos sim: the deterministic loop, replays byte for byte, the mutants it finds, the command's
JSON lines and exit codes. Each simulated run takes about a second on a loaded machine."""

from __future__ import annotations

import asyncio
import json
import random
import shlex
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from wd_chaos.checks.core import operations, paired_once
from wd_chaos.cli import main
from wd_chaos.scenario import find
from wd_chaos.sim.command import simulate
from wd_chaos.sim.loop import PROCESS, SimLoop
from wd_chaos.sim.wire import Rates, World, _jsonable

SCENARIO = find("lease-stall")

FOUND_AT = {
    "memory-leases-on-wall-clock": 8,
    "memory-skips-codec": 0,
    "memory-supply-takes-reserved-keys": 0,
    "memory-won-by-decoded-value": 0,
    "memory-batch-sends-cancelled": 0,
    "memory-renew-swallows-cancel": 0,
}
"""A seed at which sim finds each mutant (found by ``wd-chaos sim --mutant NAME``)."""


def _interleaving(seed: int) -> list[int]:
    order: list[int] = []

    async def one(i: int) -> None:
        for _ in range(4):
            await asyncio.sleep(0)
            order.append(i)

    async def all_of_them() -> None:
        await asyncio.gather(*(one(i) for i in range(4)))

    SimLoop(random.Random(seed)).run_until_complete(all_of_them())  # type: ignore[abstract]
    return order


def test_the_loop_picks_the_next_ready_task_by_seed_and_repeats_it() -> None:
    assert _interleaving(7) == _interleaving(7)
    orders = {tuple(_interleaving(s)) for s in range(6)}
    assert len(orders) > 1, "every seed interleaved the tasks the same way"
    fifo = [i for _ in range(4) for i in range(4)]
    assert any(list(o) != fifo for o in orders), "the loop ran ready callbacks first in first out"


def test_virtual_time_jumps_and_a_crashed_process_never_runs_again() -> None:
    loop = SimLoop(random.Random(1))  # type: ignore[abstract]
    seen: list[str] = []

    async def victim() -> None:
        try:
            await asyncio.sleep(10)
            seen.append("victim woke")
        finally:
            seen.append("victim finally")

    async def run() -> float:
        import contextvars

        context = contextvars.copy_context()
        context.run(PROCESS.set, "p")
        loop.create_task(victim(), context=context)
        await asyncio.sleep(1)
        loop.crash("p")
        await asyncio.sleep(3600)  # an hour passes at once
        return loop.time()

    end = loop.run_until_complete(run())
    assert end >= 1000 + 3601 and seen == [], seen


def test_a_seed_replays_byte_for_byte_and_seeds_differ() -> None:
    one = simulate(SCENARIO, 5, None, store="memory")
    again = simulate(SCENARIO, 5, None, store="memory")
    other = simulate(SCENARIO, 6, None, store="memory")
    assert one.history_bytes() == again.history_bytes(), "one seed gave two histories"
    assert one.history_bytes() != other.history_bytes(), "two seeds gave one history"
    assert one.valid is True, [v.as_dict() for v in one.verdicts if v.valid is not True]


def test_the_real_memory_store_passes_the_seeds_that_find_the_mutants() -> None:
    """The mutants' killer: a store the gate swaps for one of them fails here."""
    for seed in sorted(set(FOUND_AT.values())):
        result = simulate(SCENARIO, seed, None, store="memory")
        assert result.valid is True, (seed, [v.as_dict() for v in result.verdicts if v.valid is False])


@pytest.mark.parametrize("mutant", sorted(FOUND_AT))
def test_sim_finds_each_mutant(mutant: str) -> None:
    result = simulate(SCENARIO, FOUND_AT[mutant], mutant, store="memory")
    assert result.valid is False, f"{mutant} survived seed {FOUND_AT[mutant]}"


CARELESS = find("careless-clients")


def _killed(lines: list[dict[str, Any]]) -> tuple[set[int], set[int]]:
    """The pids the nemesis killed, and those a restart line says have ended."""
    faults = [line for line in lines if line["type"] == "fault" and line.get("fault") == "kill"]
    started = {int(line["target_pid"]) for line in faults if line["phase"] == "start"}
    ended = {int(line["target_pid"]) for line in faults if line.get("restarted_pid") is not None}
    return started, ended


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_worker_the_nemesis_killed_is_a_process_that_ended(store: str) -> None:
    """Each kill is followed by the supervisor's restart line (as the process harness writes it),
    so no-hung-pass counts the killed process as ended, not hung: the real store is valid."""
    killed = 0
    for seed in (1, 3, 5):  # kills on both stores; seed 5 reboots too (memory)
        result = simulate(CARELESS, seed, None, store=store)
        started, ended = _killed(result.lines)
        killed += len(started)
        assert started == ended, f"seed {seed}: killed {sorted(started)}, restart lines for {sorted(ended)}"
        assert result.valid is True, (seed, [v.as_dict() for v in result.verdicts if v.valid is not True])
    assert killed, "no seed killed a worker: the test proves nothing"


def test_without_the_restart_line_a_killed_worker_is_hung() -> None:
    """The line is what tells no-hung-pass the process ended: drop it and the checker says no."""
    from wd_chaos.checks import checkers, run_checker
    from wd_chaos.rundir import FinalState

    result = simulate(CARELESS, 1, None, store="memory")
    lines = [line for line in result.lines if line.get("restarted_pid") is None]
    verdict = run_checker(
        "no-hung-pass", checkers()["no-hung-pass"], lines, FinalState.from_json(result.final)
    )
    assert verdict.valid is False and "never finished" in json.dumps(verdict.evidence), verdict.as_dict()


def test_the_heal_ends_a_stall_still_holding_a_worker() -> None:
    """As the process harness's heal SIGCONTs a stopped worker: seed 15 stalls one past the stop,
    and without the heal it never exits when asked (no-hung-pass said no)."""
    result = simulate(CARELESS, 15, None, store="memory")
    heal = next(i for i, line in enumerate(result.lines) if line.get("fault") == "heal")
    ended = [line for line in result.lines[heal:] if line.get("fault") == "stall" and line["phase"] == "stop"]
    assert ended, "no stall was ended by the heal: the seed no longer shows it"
    assert result.valid is True, [v.as_dict() for v in result.verdicts if v.valid is not True]


def test_all_runs_the_scenarios_whose_faults_sim_simulates() -> None:
    from wd_chaos.sim.command import not_simulable, simulable

    on_memory = {sc.name for sc in simulable("memory")}
    assert {"lease-stall", "careless-clients", "kill-between-effect-and-record"} <= on_memory
    assert not on_memory & {"partition", "slow-network", "take-storm", "reboot"}, on_memory
    assert "reboot" in {sc.name for sc in simulable("sqlite")}
    assert "no simulated form" in str(not_simulable(find("partition"), "memory"))
    done = CliRunner().invoke(main, ["sim", "lease-stall", "--all"])
    assert done.exit_code == 64 and "not both" in done.output, done.output


def _lines(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_json_lines_a_failing_seed_and_its_replay_exit_1(tmp_path: Path) -> None:
    runner = CliRunner()
    seed = FOUND_AT["memory-batch-sends-cancelled"]
    found = tmp_path / "failures.txt"
    args = ["sim", "--seeds", "1", "--seed", str(seed), "--mutant", "memory-batch-sends-cancelled", "--json"]
    args += ["--failures", str(found)]
    done = runner.invoke(main, args)
    assert done.exit_code == 1, done.output
    failing, summary = _lines(done.output)
    assert set(failing) >= {"seed", "verdict", "failing", "replay"} and failing["seed"] == seed
    assert failing["verdict"] == "invalid" and "cancelled-calls" in failing["failing"]
    assert set(summary) >= {"runs", "runs_per_minute", "failures"} and summary["failures"] == 1
    replay = shlex.split(failing["replay"])
    assert replay[:2] == ["wd-chaos", "sim"]
    again = runner.invoke(main, [*replay[1:], "--failures", str(found)])
    assert again.exit_code == 1, again.output
    assert found.read_text().splitlines() == [failing["replay"]], "a sweep's file keeps each failure once"


def test_a_replay_writes_the_same_history_bytes(tmp_path: Path) -> None:
    runner = CliRunner()
    for name in ("a.jsonl", "b.jsonl"):
        done = runner.invoke(main, ["sim", "--seed", "3", "--seeds", "1", "--history", str(tmp_path / name)])
        assert done.exit_code == 0, done.output
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_all_valid_exits_0_with_only_the_summary_line() -> None:
    done = CliRunner().invoke(main, ["sim", "--seeds", "1", "--seed", "2", "--json"])
    assert done.exit_code == 0, done.output
    (summary,) = _lines(done.output)
    assert summary["runs"] == 1 and summary["failures"] == 0 and summary["runs_per_minute"] > 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["sim", "no-such-scenario"], "no scenario"),
        (["sim", "take-storm"], "storm"),
        (["sim", "--mutant", "no-such-mutant"], "no mutant"),
        (["sim", "--mutant", "sqlite-claim-ignores-restart"], "breaks the sqlite store"),
    ],
)
def test_bad_input_is_a_usage_error(args: list[str], says: str) -> None:
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 64 and says in done.output, done.output


WALL_CLOCK_MUTANT = ("memory-leases-on-wall-clock", FOUND_AT["memory-leases-on-wall-clock"])


def test_a_failing_seed_prints_its_first_evidence_beside_its_replay() -> None:
    mutant, seed = WALL_CLOCK_MUTANT
    args = ["sim", "--seeds", "1", "--seed", str(seed), "--mutant", mutant, "--jobs", "1"]
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 1, text.output
    verdict, evidence, replay = text.output.splitlines()[:3]
    assert verdict.startswith("INVALID lease-stall") and replay.startswith("  replay: wd-chaos sim"), (
        text.output
    )
    assert evidence.startswith("  first evidence: fencing: claim workflow lease-stall-"), evidence
    as_json = CliRunner().invoke(main, [*args, "--json"])
    failing = _lines(as_json.output)[0]["evidence"]
    assert failing["checker"] == "fencing" and failing["f"] == "claim", failing
    assert failing["workflow"].startswith("lease-stall-") and failing["why"], failing


def test_the_summary_counts_the_faults_and_the_coverage_windows_reached() -> None:
    done = CliRunner().invoke(main, ["sim", "--seeds", "3", "--seed", "2", "--json", "--jobs", "1"])
    assert done.exit_code == 0, done.output
    (summary,) = _lines(done.output)
    assert summary["faults"].get("stall", 0) > 0 and summary["faults"].get("lost_reply", 0) > 0, summary
    windows = summary["coverage"]["lease-stall"]
    assert set(windows) == set(SCENARIO.coverage), windows
    assert all(0 <= n <= 3 for n in windows.values()) and any(windows.values()), windows


def test_the_retake_probe_says_how_it_ended_in_the_history_and_the_summary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The probe answers on the real store; a scheduler that fails its calls is said (a history
    line and the summary's count), not hidden behind a run that reads as probed."""
    answered = simulate(SCENARIO, 0, None, None, store="memory")
    assert answered.probes == {"retake": "answered"}, answered.probes
    lines = [o for o in answered.lines if o.get("what") == "retake-probe"]
    assert [o["ended"] for o in lines] == ["answered"], lines

    from without_durability.kits.memory import MemorySimulated

    class Refusing:
        async def schedule(self, *args: Any, **kwargs: Any) -> None:
            raise ConnectionError("the probe's queue is down")

        def __getattr__(self, name: str) -> Any:
            return self.schedule

    monkeypatch.setattr(MemorySimulated, "scheduler_in", lambda self, namespace: Refusing())
    failed = simulate(SCENARIO, 0, None, None, store="memory")
    assert failed.probes == {"retake": "error: ConnectionError"}, failed.probes
    assert [o["ended"] for o in failed.lines if o.get("what") == "retake-probe"] == ["error: ConnectionError"]
    done = CliRunner().invoke(main, ["sim", "--seeds", "2", "--json", "--jobs", "1", "--store", "memory"])
    (summary,) = _lines(done.output)
    assert summary["probes"] == {"retake": {"error": 2}}, summary


def test_progress_is_drawn_on_a_terminal_only(capsys: pytest.CaptureFixture[str]) -> None:
    import io

    from rich.console import Console

    from wd_chaos.sim.progress import Progress

    screen = io.StringIO()
    with Progress(3, Console(file=screen, force_terminal=True, width=100)) as bar:
        bar.advance(1, 0)
        bar.echo("INVALID a line")
    assert bar.shown and "sim" in screen.getvalue(), screen.getvalue()
    pipe = io.StringIO()
    with Progress(3, Console(file=pipe, force_terminal=False)) as quiet:
        quiet.advance(0, 0)
        quiet.echo("INVALID another")
    assert not quiet.shown and pipe.getvalue() == "", pipe.getvalue()
    assert capsys.readouterr().out.splitlines() == ["INVALID a line", "INVALID another"]


@pytest.mark.parametrize("mutant", [None, WALL_CLOCK_MUTANT[0]])
def test_analyze_judges_a_run_folder_sim_wrote_as_sim_did(tmp_path: Path, mutant: str | None) -> None:
    seed = WALL_CLOCK_MUTANT[1]
    folder = tmp_path / "run"
    args = ["sim", "--seeds", "1", "--seed", str(seed), "--history", str(folder), "--json"]
    done = CliRunner().invoke(main, [*args, *(["--mutant", mutant] if mutant else [])])
    assert done.exit_code == (1 if mutant else 0), done.output
    analyzed = CliRunner().invoke(main, ["analyze", str(folder)])
    assert analyzed.exit_code == done.exit_code, analyzed.output
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["valid"] is (mutant is None) and summary["sim"] is True, summary["valid"]
    assert "wd-chaos sim lease-stall" in (folder / "report.html").read_text(), (
        "the report's replay is not sim's"
    )


def _line(kind: str, op: str, mono: int, **more: object) -> dict[str, object]:
    return {"type": kind, "op": op, "f": "take", "mono": mono, "process": "p", "pid": 1, **more}


def test_one_pairing_per_judged_history_is_never_served_stale() -> None:
    """``paired_once`` shares one pairing among the checkers, for that list only and only while
    it is unchanged: another list, a line appended, or the block's end pairs anew."""
    ops = [_line("invoke", "a", 1), _line("complete", "a", 2, outcome="ok")]
    with paired_once(ops):
        first = operations(ops)
        assert [o.outcome for o in first] == ["ok"]
        first.clear()  # a caller may change the list it is given
        assert len(operations(ops)) == 1, "the shared pairing was changed through a caller's list"
        other = [_line("invoke", "b", 1)]
        assert [o.outcome for o in operations(other)] == ["unknown"], "another list got the memo"
        ops.append(_line("invoke", "c", 3))
        assert [o.invoke["op"] for o in operations(ops)] == ["a", "c"], "a changed list was served stale"
    ops[1] = _line("complete", "a", 2, outcome="fail")
    assert [o.outcome for o in operations(ops)] == ["fail", "unknown"], "the memo outlived its block"


@pytest.mark.parametrize(
    "value",
    [None, True, 3, -0.0, float("inf"), float("nan"), 2.5e300, "é\ud800", [1, (2, "x")], {"a": {"b": [None, 1.5]}},
     {1: "int key"}, {"t": (1, 2)}, {"set": {1}}, object(), [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
)  # fmt: skip
def test_a_history_value_is_what_its_json_round_trip_gives(value: object) -> None:
    """The direct copy of plain values gives exactly what ``json.loads(json.dumps(v))`` does (or
    the ``repr`` of what has no JSON), and a fresh copy, never the caller's object."""
    try:
        expected = json.loads(json.dumps(value))
    except (TypeError, ValueError):
        expected = repr(value)
    got = _jsonable(value)
    assert repr(got) == repr(expected)  # repr tells a tuple from a list, and -0.0 from 0.0
    if isinstance(value, (list, dict)):
        assert got is not value


def test_the_wall_stamp_is_the_wall_clocks_isoformat() -> None:
    loop = SimLoop(random.Random(1))  # type: ignore[abstract]
    world = World(loop, random.Random(2), Rates())
    stamps = [(1000.0, 0.0), (1000.5, 0.0), (1000.5000004, -3.0), (1001.0, -3.25), (5000.123, 30.0)]
    for now, offset in stamps:
        loop._now = now
        world.wall_offset = offset
        assert world.wall_text() == world.wall().isoformat(), (now, offset)


def test_jobs_default_to_the_machines_cores() -> None:
    from wd_chaos.sim.command import default_jobs, sim_command

    (jobs,) = [p for p in sim_command.params if p.name == "jobs"]
    assert callable(jobs.default) and jobs.default() == default_jobs() >= 1


SHRINKABLE = ("memory-batch-sends-cancelled", 0, "timeout-33,timeout-34,timeout-35,timeout-36")
"""A mutant, a seed that finds it, and four faults of the seed's plan (writers' calls cancelled by
their timeouts) with which the run still fails: one such cancel, landing while the batcher holds
the call, is all the mutant needs."""


def test_a_shrink_keeps_the_fault_the_failure_needs_and_its_replay_repeats(tmp_path: Path) -> None:
    """The shrink starts from a plan of four faults (``--faults``: the seed's own 71 take a
    minute to shrink on a loaded machine) and must end with one; its replay fails the same
    checker with the same history bytes twice, and the seed with no fault passes."""
    mutant, seed, start = SHRINKABLE
    args = ["sim", "--seed", str(seed), "--seeds", "1", "--mutant", mutant, "--faults", start]
    done = CliRunner().invoke(main, [*args, "--shrink", "--json"])
    assert done.exit_code == 1, done.output
    shrunk = next(line for line in _lines(done.output) if line.get("shrink"))
    assert shrunk["checker"] == "cancelled-calls" and shrunk["faults_before"] == 4, shrunk
    (needed,) = shrunk["plan"]
    assert needed in start.split(",") and shrunk["minimal"] is True, shrunk
    replay = shlex.split(shrunk["replay"])
    assert replay[replay.index("--faults") + 1] == needed
    for name in ("a.jsonl", "b.jsonl"):
        again = CliRunner().invoke(main, [*replay[1:], "--json", "--history", str(tmp_path / name)])
        assert again.exit_code == 1, again.output
        assert _lines(again.output)[0]["failing"] == ["cancelled-calls"]
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    # the fault is what fails it: the same seed with no fault at all passes
    none = CliRunner().invoke(main, [*args[:-1], "none", "--json"])
    assert none.exit_code == 0, none.output


def test_a_plan_is_checked() -> None:
    done = CliRunner().invoke(main, ["sim", "--seeds", "1", "--faults", "kill"])
    assert done.exit_code == 64 and "not a fault id" in done.output, done.output
    done = CliRunner().invoke(main, ["sim", "--seeds", "2", "--faults", "none"])
    assert done.exit_code == 64 and "--seeds 1" in done.output, done.output


def test_a_dask_cluster_gives_the_verdicts_local_processes_give() -> None:
    distributed = pytest.importorskip("distributed")
    args = ["sim", "--seeds", "2", "--seed", "7", "--mutant", "memory-leases-on-wall-clock", "--json"]
    local = CliRunner().invoke(main, [*args, "--jobs", "2"])
    with distributed.LocalCluster(
        n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None
    ) as cluster:
        remote = CliRunner().invoke(main, [*args, "--cluster", cluster.scheduler_address])
    assert remote.exit_code == local.exit_code, remote.output
    assert _lines(remote.output)[:-1] == _lines(local.output)[:-1]
    assert local.exit_code == 1, "no seed failed: the comparison saw only valid runs"
    summary = _lines(remote.output)[-1]
    assert summary["runs"] == 2 and summary["cluster"] == cluster.scheduler_address


def test_an_unreachable_cluster_is_a_harness_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("distributed")
    monkeypatch.setattr("wd_chaos.sim.cluster.CONNECT_TIMEOUT", 2.0)
    done = CliRunner().invoke(main, ["sim", "--seeds", "2", "--cluster", "tcp://127.0.0.1:9"])
    assert done.exit_code == 255 and "no Dask scheduler" in done.output, done.output


def test_a_third_party_kit_that_provides_simulated_is_simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator names no store: any kit that provides ``simulated`` is one it runs (here a
    kit of another name over the Memory store's simulated form), and one that does not is refused."""
    from without_durability.kits.memory import MemorySimulated
    from without_durability.testing import kit as kit_module
    from without_durability.testing.kit import StoreKit

    class Toy(StoreKit):
        name = "toy"
        provides = frozenset({"simulated"})

        def open_simulated(self, clock: Any, lease_clock: Any, wrap: Any = None) -> MemorySimulated:
            return MemorySimulated(clock, lease_clock, wrap)

    class Plain(StoreKit):
        name = "plain"

    monkeypatch.setattr(kit_module, "_KITS", {**kit_module.kits(), "toy": Toy(), "plain": Plain()})
    result = simulate(SCENARIO, 5, None, store="toy")
    assert result.valid is True and b'"store": "toy"' in result.history_bytes()
    done = CliRunner().invoke(main, ["sim", "--store", "plain", "--seeds", "1"])
    assert done.exit_code == 64 and "provides 'simulated'" in done.output and "toy" in done.output, done.output


def test_a_simulated_store_missing_a_method_cannot_be_made() -> None:
    """A kit's simulated form must give ``ledger_effect``, ``ledger_rows`` and ``peek``: one that
    leaves any out fails when the kit opens it, naming what is missing, not in the middle of a run."""
    from without_durability.testing.simulated import SimulatedStore

    class NoPeek(SimulatedStore):
        def ledger_effect(self, workflow: str, key: str, token: int) -> Any:
            return lambda state: {"row": 0, "token": token}

        def ledger_rows(self) -> list[dict[str, Any]]:
            return []

    with pytest.raises(TypeError, match="peek"):
        NoPeek()  # type: ignore[abstract]


def test_a_kind_with_a_simulated_form_joins_the_nemesis_with_no_edit_to_sim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The nemesis draws from the registry: a kind given a form is drawn by its share."""
    import dataclasses

    from wd_chaos.faults import base

    real = base.kinds()
    drawn: list[int] = []

    async def inject(sim: Any, n: int) -> None:
        drawn.append(n)
        sim.world.count("toy")

    form = base.SimulatedForm(order=9, share=1.0, inject=inject)
    toy = dataclasses.replace(real["kill"], name="toy", form=form)
    monkeypatch.setattr(base, "kinds", lambda: {**real, "toy": toy})
    assert [name for _, name, _ in base.simulated_forms()][-1] == "toy"
    result = simulate(SCENARIO, 5, None, store="memory")
    assert drawn and result.stats.get("toy") == len(drawn), result.stats


def test_the_bite_checks_of_the_faults_drawn_are_replayed_and_counted() -> None:
    done = CliRunner().invoke(main, ["sim", "--seeds", "3", "--jobs", "1", "--json"])
    (summary,) = _lines(done.output)
    assert summary["bites"]["stall-fenced"]["runs"] >= 1, summary["bites"]
    assert set(summary["bites"]) <= {"stall-fenced", "budget-fenced", "kill-between", "reboot-held"}
