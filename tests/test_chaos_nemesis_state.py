"""Each fault kind keeps its own per-run state (``Nemesis.state``), and kinds coordinate only
through what every state may say (``KindState``): the nemesis itself holds nothing of a kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wd_chaos.faults import Nemesis
from wd_chaos.faults.nemesis import KindState
from wd_chaos.faults.stall import Stalled
from wd_chaos.faults.toxics import proxies
from wd_chaos.history import HistoryWriter, read_lines


def _nemesis(
    tmp_path: Path, events: list[dict[str, Any]] | None = None, services: dict[str, Any] | None = None
) -> Nemesis:
    hist = HistoryWriter(tmp_path / "controller.jsonl", "controller")
    busy = {"worker-0"}
    return Nemesis(events or [], hist, tmp_path, pids=dict, busy=lambda _: busy, seed=1, services=services)


def test_a_state_is_made_once_per_run_and_owner(tmp_path: Path) -> None:
    made: list[Nemesis] = []

    def setup(n: Nemesis) -> list[int]:
        made.append(n)
        return []

    one, two = _nemesis(tmp_path / "a"), _nemesis(tmp_path / "b")
    one.state("toy", setup).append(1)
    assert one.state("toy", setup) == [1] and two.state("toy", setup) == []
    assert made == [one, two], "a second ask made the state again, or two runs shared one"


def test_a_stall_leaves_alone_a_worker_another_kind_holds_stopped(tmp_path: Path) -> None:
    """A stall (``stopped`` of any kind's state) finds no candidate and waits; without it, stops."""
    events = [{"fault": "stall", "at": 0.0, "target": "worker-0", "duration": 1.0}]

    class Held(KindState):
        def stopped(self) -> set[str]:
            return {"worker-0"}

    held = _nemesis(tmp_path / "held", events)
    held.state("toy", lambda n: Held())
    held.tick(0.1)  # pids() is empty: stopping anyone would raise
    assert held.pending == events and held.stopped == {"worker-0"}
    stalled = held.state("stall", lambda n: Stalled())
    assert stalled.workers == set(), "the stall stopped a worker another kind holds"


def test_the_proxies_state_comes_from_the_services_and_heals_without_toxiproxy(tmp_path: Path) -> None:
    healed: list[bool] = []

    class Toxi:
        def heal_all(self) -> None:
            healed.append(True)

    with_toxi = _nemesis(tmp_path / "t", services={"toxi": Toxi(), "proxies": {"worker-0": "p0"}})
    assert proxies(with_toxi).proxies == {"worker-0": "p0"} and proxies(with_toxi) is proxies(with_toxi)
    with_toxi.heal()
    assert healed == [True], "the final heal left toxiproxy's cuts in place"
    bare = _nemesis(tmp_path / "b")
    bare.heal()  # no toxiproxy in this run: nothing to heal, and no error
    lines = list(read_lines(tmp_path / "b" / "controller.jsonl"))
    assert [(x["fault"], x["phase"]) for x in lines if x["type"] == "fault"] == [("heal", "start")]


def test_clock_steps_move_the_server_clock_or_the_shared_wall_offset_and_heal_puts_it_right(
    tmp_path: Path,
) -> None:
    """With a server, a step moves its clock file; without one, the same wall offset a wall-step
    moves (the two add up); the final heal steps the clock back to 0 in either case."""
    from wd_chaos.faults.clock_step import CLOCK_FILE
    from wd_chaos.faults.wall_step import wall_offset
    from wd_chaos.stores import WALL_OFFSET

    events = [
        {"fault": "clock-step", "at": 0.0, "target": "store", "seconds": 8.0},
        {"fault": "clock-step", "at": 0.5, "target": "store", "seconds": -3.0},
    ]
    server = _nemesis(tmp_path / "s", events, services={"server": object()})
    server.tick(1.0)
    assert (tmp_path / "s" / CLOCK_FILE).read_text() == "+5.000\n"
    server.heal()
    assert (tmp_path / "s" / CLOCK_FILE).read_text() == "+0.000\n"
    assert not (tmp_path / "s" / WALL_OFFSET).exists()

    wall = _nemesis(tmp_path / "w", events)
    wall_offset(wall).move(2.0)  # as a wall-step would
    wall.tick(1.0)
    assert float((tmp_path / "w" / WALL_OFFSET).read_text()) == 7.0
    wall.heal()
    assert float((tmp_path / "w" / WALL_OFFSET).read_text()) == 0.0
    healing = [x for x in read_lines(tmp_path / "w" / "controller.jsonl") if x.get("healing")]
    assert [x["seconds"] for x in healing] == [-7.0]
