"""wd-chaos sim on the real SQLite store: its statements as steps of the seeded loop (no thread),
a replay byte for byte, a reboot that opens the same file again, and the mutant only a reboot
shows. Each simulated run takes about a second on a loaded machine."""

from __future__ import annotations

import asyncio
import contextvars
import random
import shlex
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from wd_chaos.cli import main
from wd_chaos.scenario import find
from wd_chaos.sim.command import simulate
from wd_chaos.sim.loop import PROCESS, SimLoop
from wd_chaos.sim.world import Sim
from without_durability.sqlite import SqliteDurable
from without_durability.sqlite.stepped import SteppedSqliteConnection
from without_durability.testing.kit import find_kit

SCENARIO = find("lease-stall")

FOUND_AT = {
    "sqlite-claim-ignores-restart": 1,
    "sqlite-leases-on-wall-clock": 1,
    "sqlite-supply-gated-on-claim": 1,
    "sqlite-written-at-moves": 1,
    "sqlite-stamps-before-the-latest": 3,
    "sqlite-wake-reinstates-cancelled": 1,
    "sqlite-load-hides-lifecycle": 1,
    "sqlite-record-without-fence": 21,
}
"""A seed at which sim finds each SQLite mutant (``wd-chaos sim --store sqlite --mutant NAME``);
the real store passes them (seed 1 below, the others in ``test_the_real_store_passes_...``)."""

REBOOTED = 1
"""A seed whose run reboots the simulated machine (the real store must pass it)."""


def _failing(result: Any) -> list[dict[str, Any]]:
    return [v.as_dict() for v in result.verdicts if v.valid is not True]


@dataclass
class Rebooted:
    """The real store's run of ``REBOOTED`` (run once for the module)."""

    sim: Sim
    first: SqliteDurable
    folder: Path
    result: Any


@pytest.fixture(scope="module")
def rebooted() -> Rebooted:
    sim = Sim(SCENARIO, REBOOTED, store="sqlite")
    first = sim.store
    assert isinstance(first, SqliteDurable) and isinstance(first.conn, SteppedSqliteConnection)
    return Rebooted(sim, first, first.conn.path.parent, sim.run())


def test_a_seed_replays_byte_for_byte_on_the_real_sqlite_store(rebooted: Rebooted) -> None:
    one = rebooted.result
    again = simulate(SCENARIO, REBOOTED, None, store="sqlite")
    other = simulate(SCENARIO, REBOOTED + 1, None, store="sqlite")
    assert one.history_bytes() == again.history_bytes(), "one seed gave two histories"
    assert one.history_bytes() != other.history_bytes(), "two seeds gave one history"
    assert b'"store": "sqlite"' in one.history_bytes(), "the run's history does not name its store"


def test_a_reboot_opens_the_same_file_again_and_the_real_store_passes(rebooted: Rebooted) -> None:
    sim, result = rebooted.sim, rebooted.result
    assert result.stats.get("reboot") == 1, f"seed {REBOOTED} no longer reboots: {result.stats}"
    conns = sim.sim_store.conns
    assert len(conns) == 2 and conns[1].path == conns[0].path, "the reboot did not reopen the file"
    assert sim.store is not rebooted.first and sim.store.conn is conns[1]
    assert result.valid is True, _failing(result)
    assert not rebooted.folder.exists(), "the run left its temporary folder behind"


def test_the_sqlite_mutant_only_a_reboot_shows_is_found_and_its_replay_exits_1() -> None:
    """The killer ``sim:lease-stall:liveness``: a store the gate swaps for the mutant fails here,
    and the real store passes the same seed (the test above)."""
    mutant = "sqlite-claim-ignores-restart"
    runner = CliRunner()
    args = ["sim", "--store", "sqlite", "--seed", str(FOUND_AT[mutant]), "--seeds", "1", "--json"]
    done = runner.invoke(main, [*args, "--mutant", mutant])
    assert done.exit_code == 1, done.output
    failing = [line for line in done.output.splitlines() if '"verdict"' in line]
    assert len(failing) == 1 and '"liveness"' in failing[0], done.output
    replay = shlex.split(failing[0].split('"replay": ')[1].strip('}"'))
    assert replay[:2] == ["wd-chaos", "sim"] and "sqlite" in replay and mutant in replay, replay
    again = runner.invoke(main, replay[1:])
    assert again.exit_code == 1, again.output


def test_the_real_store_passes_the_other_seeds_that_find_a_mutant() -> None:
    for seed in sorted(set(FOUND_AT.values()) - {REBOOTED}):
        result = simulate(SCENARIO, seed, None, store="sqlite")
        assert result.valid is True, (seed, _failing(result))


@pytest.mark.parametrize("mutant", sorted(set(FOUND_AT) - {"sqlite-claim-ignores-restart"}))
def test_sim_finds_each_sqlite_mutant(mutant: str) -> None:
    result = simulate(SCENARIO, FOUND_AT[mutant], mutant, store="sqlite")
    assert result.valid is False, f"{mutant} survived seed {FOUND_AT[mutant]}"


def test_the_sqlite_kit_offers_a_store_for_the_simulator() -> None:
    kit = find_kit("sqlite")
    assert "simulated" in kit.provides
    store = kit.open_simulated(lambda: None, lambda: 0)  # type: ignore[arg-type,return-value]
    durable = store.durable
    try:
        assert isinstance(durable.conn, SteppedSqliteConnection)
        assert durable.conn.path.exists()
        assert store.ledger_rows() == [] and store.peek("nobody", "done") == (0, False)
    finally:
        folder = durable.conn.path.parent
        store.close()
    assert not folder.exists()


def _in(process: str) -> contextvars.Context:
    context = contextvars.copy_context()
    context.run(PROCESS.set, process)
    return context


def test_a_batch_is_a_step_of_the_loop_and_a_cancel_or_crash_before_it_applies_nothing(
    tmp_path: Path,
) -> None:
    """The connection's thread made a step: no thread starts; a caller cancelled before its step
    ran, or whose process crashed, leaves nothing written; one cancelled after it ran finds it
    committed (as a job the thread had begun)."""
    before = set(threading.enumerate())  # threads of earlier tests may end meanwhile: only new ones count
    conn = SteppedSqliteConnection(tmp_path / "s.db")
    conn._write_now(lambda cur: cur.execute("CREATE TABLE t (v TEXT)"))

    def insert(value: str) -> Any:
        return conn.write(lambda cur: cur.execute("INSERT INTO t VALUES (?)", (value,)))

    async def cancels() -> list[bool]:  # on asyncio's own loop: first in first out, so certain
        early = asyncio.create_task(insert("cancelled before its step"))
        await asyncio.sleep(0)  # it issued its step and waits on it
        early.cancel()
        late = asyncio.create_task(insert("cancelled after its step"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # its step ran
        late.cancel()
        outcomes = await asyncio.gather(early, late, return_exceptions=True)
        return [isinstance(o, asyncio.CancelledError) for o in outcomes]

    assert asyncio.run(cancels()) == [True, True]
    loop = SimLoop(random.Random(3))  # type: ignore[abstract]

    async def crash() -> None:
        loop.create_task(insert("crashed"), context=_in("p"))
        loop.crash("p")
        await insert("kept")

    loop.run_until_complete(crash())
    loop.teardown()
    rows = conn._read_now(lambda cur: [r[0] for r in cur.execute("SELECT v FROM t ORDER BY rowid")])
    assert rows == ["cancelled after its step", "kept"], rows
    started = set(threading.enumerate()) - before
    assert not started, f"the stepped connection started a thread: {started}"
    conn.close_now()
