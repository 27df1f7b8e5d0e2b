"""The Worker in real processes sharing a store: real SIGSTOP, real SIGTERM.

Each test starts ``procs/step_worker.py`` (one Worker whose body runs one slow step) and follows
it through what it prints, so every wait is on an event with a deadline. The tests follow the
``--wd-store`` selection among the stores several processes can share: SQLite (a file of the test's
own, on the process clock, since the suite's SQLite factory runs on a manual one), Postgres (a
fresh schema on the session's server) and Redis (a fresh key prefix).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from without_durability import Contended, Durable, Pass
from without_durability.sqlite import SqliteDurable
from without_durability.testing.harness import StoreFactory

WORKER = Path(__file__).parent / "procs" / "step_worker.py"
LONG = timedelta(hours=1)
DEADLINE = 30.0
SHARED_STORES = ["sqlite", "postgres", "redis-set", "redis-stream"]
"""The stores a worker process here can reach (a Memory store lives in one process)."""


class Proc:
    """A worker process and the lines it has printed."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []

    async def expect(self, prefix: str, seconds: float = DEADLINE) -> str:
        """The next printed line, which must start with ``prefix``."""
        assert self.proc.stdout is not None
        line = (await asyncio.wait_for(self.proc.stdout.readline(), seconds)).decode().strip()
        self.lines.append(line)
        assert line.startswith(prefix), f"expected a line starting {prefix!r}, got {self.lines}"
        return line

    async def stderr(self) -> str:
        assert self.proc.stderr is not None
        return (await self.proc.stderr.read()).decode()


@dataclass
class Shared:
    """A store as this test sees it, and how a worker process reaches the same store."""

    durable: Durable[Any]
    spec: str


@pytest.fixture
async def shared(wd_factory: tuple[StoreFactory, Any], tmp_path: Path) -> AsyncIterator[Shared]:
    factory, server = wd_factory
    kind = factory.store_kind  # a mutant of a store (the mutant gate) has that store's kind
    if kind == "sqlite":
        path = tmp_path / "wd.db"
        sqlite = await SqliteDurable.open(path)
        try:
            yield Shared(sqlite, f"sqlite|{path}")
        finally:
            await sqlite.close()
    elif kind == "postgres":
        async with factory.open(server) as store:
            yield Shared(store.durable, f"postgres|{store.extra['schema']}|{server.url}")
    elif kind in ("redis-set", "redis-stream"):
        async with factory.open(server) as store:
            yield Shared(store.durable, f"{kind}|{store.extra['prefix']}|{server.url}")
    else:  # SHARED_STORES names only the stores handled above
        pytest.fail(f"the process tests do not reach the {factory.name} store from a process")


@contextlib.asynccontextmanager
async def worker_process(store: Shared, *, alive: float, step: float) -> AsyncIterator[Proc]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(WORKER),
        store.spec,
        str(alive),
        str(step),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        running = Proc(proc)
        await running.expect("ready")
        yield running
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            await proc.wait()


async def claim_when_free(store: Durable[Any], workflow: str, seconds: float) -> Pass:
    """Claim ``workflow`` as soon as its current pass lapses, with a deadline."""
    async with asyncio.timeout(seconds):
        while True:
            with contextlib.suppress(Contended):
                return await store.checkpointer.claim(workflow, alive=LONG, budget=LONG)
            await asyncio.sleep(0.05)


@pytest.mark.wd_store(SHARED_STORES)
async def test_a_stopped_worker_is_fenced_after_its_window(shared: Shared) -> None:
    durable = shared.durable
    alive = 1.0
    async with worker_process(shared, alive=alive, step=0.3) as worker:
        await durable.scheduler.schedule("stall")
        started = await worker.expect("started stall")
        os.kill(worker.proc.pid, signal.SIGSTOP)
        t0 = asyncio.get_running_loop().time()
        # While it is stopped nobody renews: the claim lapses after its window, not before.
        ours = await claim_when_free(durable, "stall", 10 * alive)
        waited = asyncio.get_running_loop().time() - t0
        assert waited >= alive * 0.5, f"the stopped worker's claim lapsed after only {waited:.2f}s"
        assert ours.token > int(started.split()[-1])
        os.kill(worker.proc.pid, signal.SIGCONT)
        # On waking, its renewal tick or its step's record meets the newer token: it is refused.
        os.kill(worker.proc.pid, signal.SIGTERM)
        assert await asyncio.wait_for(worker.proc.wait(), DEADLINE) == 0
        log = await worker.stderr()
        assert "is fenced" in log, f"the woken worker was not fenced; its log:\n{log}"
        assert not any(line.startswith("finished") for line in worker.lines), worker.lines
        records = await durable.checkpointer.load("stall")
        assert records == {}, f"the fenced pass recorded after being superseded: {records}"
        await durable.checkpointer.record(ours, "slow", "test")  # the newer pass still may
        assert (await durable.checkpointer.load("stall")) == {"slow": "test"}


@pytest.mark.wd_store(SHARED_STORES)
async def test_a_running_worker_is_not_fenced_by_a_step_longer_than_alive(shared: Shared) -> None:
    durable = shared.durable
    async with worker_process(shared, alive=0.6, step=2.0) as worker:
        await durable.scheduler.schedule("long")
        await worker.expect("started long")
        with pytest.raises(Contended):  # halfway through the step, well past one window
            await asyncio.sleep(1.2)
            await durable.checkpointer.claim("long", alive=LONG, budget=LONG)
        await worker.expect("effect-done long")
        await worker.expect("finished long")
    assert str((await durable.checkpointer.load("long"))["slow"]).startswith("worker token")


@pytest.mark.wd_store(SHARED_STORES)
async def test_sigterm_finishes_the_current_pass_then_exits(shared: Shared) -> None:
    durable = shared.durable
    async with worker_process(shared, alive=5.0, step=1.0) as worker:
        await durable.scheduler.schedule("term")
        token = int((await worker.expect("started term")).split()[-1])
        os.kill(worker.proc.pid, signal.SIGTERM)
        await worker.expect("effect-done term")
        await worker.expect("finished term")
        await worker.expect("exited")
        assert await asyncio.wait_for(worker.proc.wait(), DEADLINE) == 0
    want = {"slow": f"worker token {token}", "wd/finished": None}
    assert await durable.checkpointer.load("term") == want
    assert await durable.scheduler.take(LONG) is None, "the pass ended but was not answered"
    again = await durable.checkpointer.claim("term", alive=LONG, budget=LONG)  # released
    assert again.token > token
