"""The process-clock stores (Memory, SQLite) measure leases on a clock the wall clock cannot step.

A wall clock moves under a running program: NTP steps it, an operator sets it, a virtual machine
resumed from a snapshot jumps it. A lease measured on it lapses early when it steps forward (a
second pass claims while the first still runs) and holds a dead pass when it steps back. Each test
takes the suite's fresh store, points its two clocks at a wall clock and a lease clock it moves
apart, and checks that claims follow the lease clock and record times the wall clock, never going
backward along a workflow's history.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from without_durability import Contended, Fenced, MemoryCheckpointer, SqliteDurable
from without_durability.clock import lease_clock_for, monotonic_micros, system_clock
from without_durability.sqlite import SCHEMA_VERSION
from without_durability.testing import StoreUnderTest

pytestmark = pytest.mark.asyncio

PROCESS_CLOCK = pytest.mark.wd_store("memory", "sqlite")
ALIVE = timedelta(seconds=10)
BUDGET = timedelta(minutes=5)
MICRO = timedelta(microseconds=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass
class Clocks:
    """A wall clock that may step either way, and a lease clock (microseconds) apart from it."""

    wall: datetime = field(default_factory=lambda: datetime(2030, 1, 1, tzinfo=UTC))
    lease: int = 5_000_000_000

    def step_wall(self, by: timedelta) -> None:
        self.wall += by

    def pass_lease(self, by: timedelta) -> None:
        self.lease += by // MICRO


def _apart(wd_store: StoreUnderTest[Any]) -> tuple[Any, Clocks]:
    """The store's checkpointer (a real one or a mutant), its clocks re-pointed at a pair we move."""
    clocks = Clocks()
    cp: Any = wd_store.checkpointer
    cp.clock = lambda: clocks.wall
    cp.lease_clock = lambda: clocks.lease
    return cp, clocks


async def _held_for_its_window(cp: Any, clocks: Clocks, held: Any) -> None:
    """``held`` is still alive (a claim is refused), and once its whole window passes on the lease
    clock, a claim takes the workflow with the next token."""
    with pytest.raises(Contended):
        await cp.claim("w", alive=ALIVE, budget=BUDGET)
    clocks.pass_lease(ALIVE)
    taken = await cp.claim("w", alive=ALIVE, budget=BUDGET)
    assert taken.token == held.token + 1, f"expected token {held.token + 1}, got {taken.token}"


@PROCESS_CLOCK
async def test_a_wall_clock_step_forward_does_not_lapse_a_live_claim(wd_store: StoreUnderTest[Any]) -> None:
    cp, clocks = _apart(wd_store)
    held = await cp.claim("w", alive=ALIVE, budget=BUDGET)
    clocks.step_wall(timedelta(hours=1))
    recorded = await cp.record(held, "k", 1)
    assert recorded.won, "the holder's write was refused after a wall-clock step"
    await _held_for_its_window(cp, clocks, held)


@PROCESS_CLOCK
async def test_a_wall_clock_step_back_neither_frees_nor_keeps_a_pass(wd_store: StoreUnderTest[Any]) -> None:
    cp, clocks = _apart(wd_store)
    held = await cp.claim("w", alive=ALIVE, budget=BUDGET)
    clocks.step_wall(-timedelta(hours=1))
    await _held_for_its_window(cp, clocks, held)  # however far back the wall clock went
    with pytest.raises(Fenced):
        await cp.record(held, "k", "stale")


@PROCESS_CLOCK
async def test_renewals_and_the_budget_follow_the_lease_clock(wd_store: StoreUnderTest[Any]) -> None:
    cp, clocks = _apart(wd_store)
    held = await cp.claim("w", alive=ALIVE, budget=timedelta(seconds=25))
    for _ in range(2):  # renewed inside its window: alive, whatever the wall clock says
        clocks.pass_lease(ALIVE * 0.8)
        clocks.step_wall(timedelta(days=1))
        await cp.renew(held)
        with pytest.raises(Contended):
            await cp.claim("w", alive=ALIVE, budget=BUDGET)
    clocks.pass_lease(ALIVE * 0.8)  # 24 s in: a renewal cannot carry it past its 25 s budget
    await cp.renew(held)
    clocks.pass_lease(timedelta(seconds=1.5))
    taken = await cp.claim("w", alive=ALIVE, budget=BUDGET)
    assert taken.token == held.token + 1, f"expected token {held.token + 1}, got {taken.token}"


@PROCESS_CLOCK
async def test_a_wall_clock_stepped_back_keeps_history_in_order(wd_store: StoreUnderTest[Any]) -> None:
    cp, clocks = _apart(wd_store)
    held = await cp.claim("w", alive=ALIVE, budget=BUDGET)
    await cp.record(held, "first", 1)
    stamped = clocks.wall
    clocks.step_wall(-timedelta(minutes=10))
    await cp.supply("w", "second", 2)
    await cp.append("w", "third")
    clocks.step_wall(timedelta(hours=1))
    await cp.record(held, "fourth", 4)
    entries = await cp.history("w")
    keys = [e.key for e in entries]
    assert keys[:2] == ["first", "second"] and keys[3] == "fourth", f"history order: {keys}"
    times = [e.written_at for e in entries]
    assert times[:3] == [stamped] * 3, f"stamped before the latest record after a step back: {times}"
    assert times[3] == clocks.wall, f"written_at does not follow the wall clock: {times}"


@PROCESS_CLOCK
async def test_a_step_back_stamps_after_the_latest_record_not_the_first(wd_store: StoreUnderTest[Any]) -> None:
    # the floor is the newest record's stamp: a step back landing between the first record's and
    # the newest one's must still stamp at the newest
    cp, clocks = _apart(wd_store)
    held = await cp.claim("w", alive=ALIVE, budget=BUDGET)
    await cp.record(held, "first", 1)
    clocks.step_wall(timedelta(hours=1))
    await cp.record(held, "second", 2)
    newest = clocks.wall
    clocks.step_wall(-timedelta(minutes=30))
    await cp.supply("w", "third", 3)
    await cp.append("w", "fourth")
    await cp.record(held, "fifth", 5)
    times = [e.written_at for e in await cp.history("w")]
    assert times[1:] == [newest] * 4, f"stamped before the newest record after a step back: {times}"


@PROCESS_CLOCK
async def test_a_claim_from_before_the_lease_clock_restarted_is_free(wd_store: StoreUnderTest[Any]) -> None:
    cp, clocks = _apart(wd_store)
    before = await cp.claim("w", alive=ALIVE, budget=BUDGET)
    await cp.record(before, "k", "kept")
    clocks.lease = 1_000_000  # the machine rebooted: its monotonic clock starts again near zero
    after = await cp.claim("w", alive=ALIVE, budget=BUDGET)
    assert after.token == before.token + 1, f"the fence went back: {before} then {after}"
    assert await cp.load("w") == {"k": "kept"}
    with pytest.raises(Contended):  # and the new claim holds as any other does
        await cp.claim("w", alive=ALIVE, budget=BUDGET)


async def test_the_default_lease_clock_is_the_monotonic_one(tmp_path: Path) -> None:
    assert lease_clock_for(system_clock) is monotonic_micros
    assert MemoryCheckpointer().lease_clock is monotonic_micros
    async with await SqliteDurable.open(tmp_path / "store.db") as durable:
        assert durable.checkpointer.lease_clock is monotonic_micros
    wall = datetime(2030, 1, 1, tzinfo=UTC)
    assert lease_clock_for(lambda: wall)() == (wall - EPOCH) // MICRO, "an injected clock moves leases"


async def test_a_version_1_file_is_upgraded_keeping_records_and_the_fence(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    async with await SqliteDurable.open(path) as durable:
        held = await durable.checkpointer.claim("w", alive=ALIVE, budget=BUDGET)
        await durable.checkpointer.record(held, "k", "kept")
    raw = sqlite3.connect(path)
    # what version 1 wrote for a live claim: deadlines on the wall clock, microseconds since 1970
    wall = (datetime.now(UTC) - EPOCH) // MICRO
    raw.execute("UPDATE claim SET alive_until = ?, held_until = ?", (wall + 10**7, wall + 3 * 10**8))
    raw.execute("PRAGMA user_version = 1")
    raw.commit()
    raw.close()
    async with await SqliteDurable.open(path) as durable:
        cp = durable.checkpointer
        assert await cp.load("w") == {"k": "kept"}
        taken = await cp.claim("w", alive=ALIVE, budget=BUDGET)
        assert taken.token == held.token + 1, f"the fence went back: {held} then {taken}"
        with pytest.raises(Fenced):
            await cp.record(held, "k2", "stale")
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    raw.close()
