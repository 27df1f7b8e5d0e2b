"""The server stores (Postgres, Redis) on a server clock that steps, as the chaos ``clock-step``
fault steps it: private servers started with the fault's preload (libfaketime, or the small shim
for a server libfaketime hangs), whose control file the tests rewrite the way the nemesis does. Leases are measured on the server's clock, so a forward step lapses a live pass early; what
must hold anyway is the fence (the lapsed pass cannot write) and the order of history (no record
stamped before the one loaded ahead of it)."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from wd_chaos.faults import clock_step as clockstep
from wd_chaos.stores import open_store, prepare
from without_durability import Fenced
from without_durability.testing.kit import find_kit

pytestmark = [pytest.mark.asyncio, pytest.mark.parametrize("kind", ["postgres", "redis"])]
LONG = timedelta(minutes=5)


def _step(control: Path, offset: float) -> None:
    aside = control.with_name(control.name + ".new")
    aside.write_text(f"{offset:+.3f}\n")
    aside.replace(control)


def _readable_dir(stack: contextlib.ExitStack) -> Path:
    """A folder every user can read: a server started by root runs as postgres, and reads the
    control file (pytest's own temporary folders are private to their owner)."""
    folder = Path(tempfile.mkdtemp(prefix="wd-clock-test-"))
    folder.chmod(0o755)
    stack.callback(shutil.rmtree, folder, True)
    return folder


def _start(stack: contextlib.ExitStack, kind: str, folder: Path) -> tuple[str, Path]:
    """A private ``kind`` server on a clock stepped through ``folder``'s control file: its URL and
    the control file."""
    kit = find_kit(kind)
    assert kit.server_binary is not None
    reason = clockstep.why_unavailable(kit.server_binary, kit.recipe)
    if reason:
        pytest.fail(f"needs a {kind} server on a stepped clock (bash scripts/install-servers): {reason}")
    control = folder / clockstep.CLOCK_FILE
    env = clockstep.server_env(kit.server_binary, control, kit.recipe)
    server = stack.enter_context(kit.server(env=env))
    return server.url, control.resolve()


class _Shared:
    """One server of each kind on a stepped clock for the whole module, started on first use (a
    server start is most of each test's time); every test gets its own schema or key prefix."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.stack = stack
        self.started: dict[str, tuple[str, Path]] = {}

    def get(self, kind: str) -> tuple[str, Path]:
        if kind not in self.started:
            folder = _readable_dir(self.stack) / kind
            folder.mkdir(mode=0o755)
            self.started[kind] = _start(self.stack, kind, folder)
        return self.started[kind]


@pytest.fixture(scope="module")
def shared() -> Iterator[_Shared]:
    with contextlib.ExitStack() as stack:
        yield _Shared(stack)


@asynccontextmanager
async def stepped_store(kind: str, url: str, control: Path) -> AsyncIterator[tuple[Any, Path]]:
    """The store (chaos spec form) in a fresh namespace on a server stepped through ``control``;
    the clock is put right afterwards."""
    tag = f"t_{secrets.token_hex(3)}"
    spec = {"kind": kind, "url": url, "schema": tag, "prefix": f"{tag}:"}
    await prepare(spec)
    opened = await open_store(spec)
    try:
        yield opened.durable, control
    finally:
        _step(control, 0)
        await opened.close()


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
async def test_the_step_reaches_the_servers_clock(
    kind: str, shared: _Shared, relative: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    with contextlib.ExitStack() as stack:
        if relative:  # as a run's default --report-dir gives it; a server changes its own directory
            monkeypatch.chdir(_readable_dir(stack))
            url, control = _start(stack, kind, Path("."))
        else:
            url, control = shared.get(kind)
        async with stepped_store(kind, url, control) as (durable, control):
            before = await durable.scheduler.now()
            _step(control, 3600)
            ahead = await durable.scheduler.now()
            _step(control, 0)
            after = await durable.scheduler.now()
    assert timedelta(minutes=59) < ahead - before < timedelta(minutes=61), (before, ahead)
    assert timedelta(0) <= after - before < timedelta(minutes=1), (before, after)


async def test_a_forward_step_lapses_a_live_claim_and_the_fence_holds(kind: str, shared: _Shared) -> None:
    cp_step = timedelta(minutes=10)
    async with stepped_store(kind, *shared.get(kind)) as (durable, control):
        cp = durable.checkpointer
        first = await cp.claim("w", alive=timedelta(seconds=30), budget=LONG)
        await cp.record(first, "a", 1)
        _step(control, cp_step.total_seconds())
        second = await cp.claim("w", alive=timedelta(seconds=30), budget=LONG)
        assert second.token > first.token, (first, second)
        with pytest.raises(Fenced):
            await cp.record(first, "b", "stale")
        got = await cp.record(second, "b", "fresh")
    assert got.value == "fresh" and got.won, got


async def test_a_clock_stepped_back_keeps_history_in_order(kind: str, shared: _Shared) -> None:
    async with stepped_store(kind, *shared.get(kind)) as (durable, control):
        cp = durable.checkpointer
        await cp.supply("w", "before", 1)
        _step(control, -600)
        await cp.supply("w", "after", 2)
        key = await cp.append("w", 3)
        history = await cp.history("w")
    keys = [e.key for e in history]
    stamps = [e.written_at for e in history]
    assert keys == ["before", "after", key], keys
    assert stamps == sorted(stamps), (
        f"written_at went backward along the history: {list(zip(keys, stamps, strict=True))}"
    )


async def test_an_arrival_during_a_pass_its_visibility_outlived_is_not_lost(
    kind: str, shared: _Shared
) -> None:
    """A forward step (or a pass slower than its visibility) puts the take's receipt in the past:
    an arrival then must still leave the workflow queued after the pass answers."""
    async with stepped_store(kind, *shared.get(kind)) as (durable, control):
        sch = durable.scheduler
        await sch.schedule("w")
        delivery = await sch.take(timedelta(seconds=30))
        assert delivery is not None and delivery.workflow == "w", delivery
        _step(control, 120)  # the receipt is now 90 s in the server's past
        await sch.schedule("w")  # an arrival while the pass still runs
        await sch.wake_at(delivery, None)  # the pass answers as it saw the workflow: nothing to do
        again = await sch.take(timedelta(seconds=30))
    assert again is not None and again.workflow == "w", "the arrival's wakeup was lost with the answer"
