"""Recovery under a second fault (#49 item 3): a restart timed from the history (``restart``'s
``after = "takeover"``), its coverage window ``restart-during-takeover``, the ``recovery-restart``
scenario, a store server kept down for a while (``Server.restart(down=...)``), and the runtime
mutant whose takeover gives a workflow up when the store is unavailable."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from wd_chaos.checks.core import operations
from wd_chaos.control.kits import stores_for
from wd_chaos.faults import Nemesis
from wd_chaos.faults.restart import TAKEOVER_WAIT, restart_during_takeover, start
from wd_chaos.history import HistoryWriter
from wd_chaos.scenario import find, plan
from without_durability import Run, SplitDurable, Worker
from without_durability.kits.runtime_mutants import MUTANTS
from without_durability.testing.kit import find_kit


class _Server:
    """Stands in for the run's private server when only the moment of the restart is judged."""

    pid = 4242

    def __init__(self) -> None:
        self.restarts: list[float] = []

    def restart(self, kill: bool, down: float = 0.0) -> None:
        assert kill
        self.restarts.append(down)


def _nemesis(tmp_path: Path, server: _Server) -> Nemesis:
    (tmp_path / "procs").mkdir()
    hist = HistoryWriter(tmp_path / "controller.jsonl", "controller")
    return Nemesis([], hist, tmp_path, pids=dict, busy=lambda _: set(), seed=1, services={"server": server})


def _write(path: Path, *lines: dict[str, Any]) -> None:
    with path.open("a") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


def test_a_restart_after_a_takeover_waits_for_a_kill_and_another_workers_call(tmp_path: Path) -> None:
    server = _Server()
    nemesis = _nemesis(tmp_path, server)
    ev = {"fault": "restart", "index": 0, "at": 2.0, "target": "store", "after": "takeover", "down": 1.0}
    procs, now = tmp_path / "procs", time.monotonic_ns()
    assert start(nemesis, {**ev, "id": "restart-0"}, 2.0) is False, "restarted with no kill"
    kill = {"type": "fault", "fault": "kill", "phase": "start", "workflow": "w1", "pid": 11, "mono": now}
    _write(procs / "worker-0.11.jsonl", kill)
    # the killed process's own last lines and a call on another workflow are no takeover
    _write(
        procs / "worker-1.12.jsonl",
        {"type": "invoke", "f": "claim", "workflow": "w2", "pid": 12, "mono": now + 5},
    )
    assert start(nemesis, {**ev, "id": "restart-0"}, 2.5) is False and not server.restarts
    _write(
        procs / "worker-1.12.jsonl",
        {"type": "invoke", "f": "claim", "workflow": "w1", "pid": 12, "mono": now + 9},
    )
    assert start(nemesis, {**ev, "id": "restart-0"}, 3.0) is True and server.restarts == [1.0]
    # one takeover times one restart: the next waits for another kill, then goes anyway
    _write(
        procs / "worker-2.13.jsonl",
        {"type": "invoke", "f": "load", "workflow": "w1", "pid": 13, "mono": now + 20},
    )
    assert start(nemesis, {**ev, "id": "restart-1"}, 3.5) is False and len(server.restarts) == 1
    assert start(nemesis, {**ev, "id": "restart-1"}, 2.0 + TAKEOVER_WAIT + 0.1) is True
    lines = [json.loads(x) for x in (tmp_path / "controller.jsonl").read_text().splitlines()]
    starts = [x for x in lines if x.get("fault") == "restart" and x.get("phase") == "start"]
    assert starts[0]["workflow"] == "w1" and starts[1]["why"] == "no takeover came", starts


def _op(n: int, f: str, wf: str, pid: int, start: int, end: int) -> list[dict[str, Any]]:
    base = {"op": f"op{n}", "f": f, "workflow": wf, "pid": pid, "process": f"worker-{pid}"}
    return [
        {**base, "type": "invoke", "mono": start},
        {**base, "type": "complete", "outcome": "ok", "mono": end},
    ]


def _restart(n: int, at: int) -> list[dict[str, Any]]:
    line = {"type": "fault", "fault": "restart", "id": f"restart-{n}", "target": "store"}
    return [{**line, "phase": "start", "mono": at}, {**line, "phase": "stop", "mono": at + 50}]


def test_the_window_counts_restarts_between_a_kill_and_the_takeovers_release() -> None:
    kill = {"type": "fault", "fault": "kill", "phase": "start", "workflow": "w1", "pid": 1, "mono": 100}
    lines = [
        *_op(1, "release", "w1", 1, 10, 20),  # the dead pass's own earlier release: before the kill
        kill,
        *_op(2, "claim", "w1", 2, 300, 310),
        *_op(3, "release", "w1", 2, 500, 510),  # the takeover let go here
        *_restart(0, 50),  # before the kill: no
        *_restart(1, 200),  # after it, before the takeover released: yes
        *_restart(2, 400),  # during the takeover's pass: yes
        *_restart(3, 600),  # after the takeover released: no
    ]
    lines.sort(key=lambda x: x["mono"])
    assert restart_during_takeover(operations(lines), lines) == 2


def test_recovery_restart_runs_on_every_server_store_with_restarts_timed_from_takeovers() -> None:
    scenario = find("recovery-restart")
    assert scenario.workload.client == "worker" and scenario.workload.writers == 0
    assert scenario.coverage == ["restart-during-takeover"] and "liveness" in scenario.checks
    assert {"postgres", "redis-set", "redis-stream"} <= set(stores_for(scenario))
    assert "sqlite" not in stores_for(scenario)
    events = plan(scenario, 1, scenario.workload.workers, scenario.time_limit)
    restarts = [e for e in events if e["fault"] == "restart"]
    assert restarts and all(e["after"] == "takeover" and e["down"] == 1.0 for e in restarts), restarts
    assert any(e["fault"] == "kill" for e in events)


def test_a_server_kept_down_refuses_connections_for_that_long_then_keeps_its_data() -> None:
    from redis import Redis
    from redis.exceptions import ConnectionError as RedisDown

    with find_kit("redis-set").server(restartable=True) as server:
        client = Redis.from_url(server.url)
        client.set("kept", "1")
        seen: list[str] = []

        def probe() -> None:
            time.sleep(0.4)
            try:
                Redis.from_url(server.url, socket_connect_timeout=0.2).ping()
                seen.append("up")
            except RedisDown:
                seen.append("down")

        t = threading.Thread(target=probe)
        t.start()
        began = time.monotonic()
        server.restart(kill=True, down=1.0)
        t.join()
        assert time.monotonic() - began >= 1.0 and seen == ["down"], seen
        assert Redis.from_url(server.url).get("kept") == b"1"


def _slip() -> Any:
    return next(m for m in MUTANTS if m.name == "runtime-worker-gives-up-a-takeover-when-unavailable")


def test_the_takeover_slip_is_a_runtime_mutant_killed_by_recovery_restart() -> None:
    m = _slip()
    assert m.killers == ("chaos:recovery-restart:liveness",) and m.store == "redis-set"
    assert m.store in stores_for(find("recovery-restart"))


async def _pass_meets_an_outage(server: Any, slipped: bool) -> tuple[bool, bool]:
    """One Worker pass of a real Redis store whose server goes down (for a second) inside the
    body: (whether the workflow's delivery is still in the queue, whether it was answered)."""
    from redis.asyncio import Redis

    from without_durability_redis import RedisCheckpointer, RedisSetScheduler

    client = Redis.from_url(server.url)
    await client.flushdb()
    durable = SplitDurable(RedisCheckpointer(client), RedisSetScheduler(client))
    await durable.arrive("w", "go", 1)

    down = threading.Thread(target=lambda: server.restart(kill=True, down=1.0))

    async def body(run: Run[Any]) -> object:
        async def outage() -> object:
            down.start()
            await asyncio.sleep(0.3)
            return 1

        await run.step("a", outage, lambda v: v)  # its record meets the server down
        return "done"

    worker: Worker[Any] = Worker(
        durable,
        body,
        alive=timedelta(seconds=1),
        budget=timedelta(seconds=4),
        visibility=timedelta(seconds=0.5),
        poll_interval=timedelta(seconds=0.05),
    )
    if slipped:
        _slip().wrap(durable)
    try:
        await worker._step()
        answered = worker._answer is not None
        await asyncio.to_thread(down.join)
        await worker._send_answer()
        await asyncio.sleep(0.7)  # past the delivery's visibility
        taken = await durable.scheduler.take(timedelta(seconds=5))
        return taken is not None, answered
    finally:
        if slipped:
            Worker._drive = _slip().wrap.original
        await client.aclose()


def test_a_pass_the_store_failed_comes_back_and_the_slip_strands_it() -> None:
    with find_kit("redis-set").server(restartable=True) as server:
        again, answered = asyncio.run(_pass_meets_an_outage(server, slipped=False))
        assert again and not answered, "the real Worker must leave the delivery to reappear"
        again, answered = asyncio.run(_pass_meets_an_outage(server, slipped=True))
        assert answered and not again, "the slip should have answered the delivery with nothing"
