"""The workload's processes: ``python -m wd_chaos.client.workload ROLE CONFIG NAME`` runs one worker,
outside writer, reader, sweeper or careless client, each its own OS process so SIGSTOP and
SIGKILL are real.

A worker runs the test workflow (``wd_chaos.client.testflow``: written once, run by the harness's explicit
loop or by the library's ``Worker``) through the store's Durable wrapped in ``Recorder``
(``wd_chaos.client.recorder``), which writes an invoke line before and a complete line after every call.
The outside writers make the arrivals and messages the workflow waits for (each writer's
``approval-<w>`` after delivering its share of the ``messages``, then the same approval again with
other content, which must lose and move nothing); the readers load and list histories beside it;
the sweeper applies a lifecycle run's retention. Failpoints (``after-effect-before-record``,
``inside-transact``, ``after-claim``) are armed by the nemesis through files in the run's
``armed/`` folder; the first worker to reach an armed point takes the file and SIGKILLs itself
there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from without_durability import Contended, Fenced, InvalidInput

from .. import fleet
from ..config import ConfigError, RunConfig
from ..config import load as load_config
from ..history import HistoryWriter
from ..mutation.catalogue import mutant_wrap
from ..scenario import Workload
from ..stores import Opened, open_store
from . import careless
from .clients import careless_spec, run_careless

# the recording proxy lives in wd_chaos.client.recorder; these names stay importable here
from .recorder import READS as READS
from .recorder import Recorder as Recorder
from .recorder import RecordingDurable as RecordingDurable
from .recorder import classify as classify
from .recorder import error_fields as error_fields
from .recorder import recording_durable as recording_durable
from .testflow import Failpoints as Failpoints
from .testflow import LibraryClient, Worker

# -- failpoints -----------------------------------------------------------------------------------


async def sweep_in_background(cfg: RunConfig, opened: Opened, hist: HistoryWriter) -> None:
    """The scenario's sweeper: the store's ``Opened.sweep`` (a store whose retention is a process,
    such as Postgres's) every ``sweep_every`` s with ``older_than = sweep_age``, each run an ``info``
    line; a store without one (a TTL, or nothing to sweep) needs no process."""
    lifecycle = cfg.lifecycle
    sweep = opened.sweep
    if lifecycle is None or sweep is None:
        return
    age = timedelta(seconds=lifecycle.sweep_age)
    while True:
        try:
            swept = await sweep(age)
            hist.event("info", what="sweep", swept=swept)
        except Exception as exc:  # the store restarting: sweep again next time
            hist.event("info", what="sweep failed", error=f"{type(exc).__name__}: {exc}"[:300])
        await asyncio.sleep(lifecycle.sweep_every)


# -- the outside writers --------------------------------------------------------------------------


def plan_writes(
    work: Workload, workflows: Sequence[str], starts: Sequence[float], index: int, rng: random.Random
) -> list[tuple[float, str, str, int]]:
    """Writer ``index``'s share of the outside writes, as (seconds from the start, workflow, what,
    number), in time order: its messages, each workflow's approval after them, the same approval
    again later with other content, and a forged lifecycle key where the workload asks. The
    process harness's writers and the simulator's write the same plan."""
    writers = work.writers
    plan: list[tuple[float, str, str, int]] = []
    for wf, base in zip(workflows, starts, strict=True):
        for m in range(work.messages):
            if m % writers == index:
                plan.append((base + rng.uniform(0, 1.0), wf, "message", m))
        # each writer approves after its own messages, so all approvals in means every message in
        after = work.approve_after
        plan.append((base + after + rng.uniform(0, 0.5), wf, "approval", index))
        # the same approval submitted again later with other content, as a retrying client does:
        # it must lose (first writer wins) and move nothing (not the order, not written_at)
        plan.append((base + after + 1.5 + rng.uniform(0, 1.5), wf, "approval-again", index))
        if work.forged_keys:  # a careless client writing a lifecycle key: it must be refused
            plan.append((base + rng.uniform(0, 1.0), wf, "forge", index))
    plan.sort()
    return plan


async def write_outside(cfg: RunConfig, index: int, rec: Recorder) -> None:
    """Deliver this writer's share of each workflow's messages and arrive its approvals, at
    times the seed fixes, spread from the start of the run."""
    rng = random.Random(f"{cfg.seed}:writer:{index}")
    plan = plan_writes(cfg.workload, cfg.workflows, cfg.starts, index, rng)
    t0 = cfg.t0
    for at, wf, what, m in plan:
        delay = t0 + at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        for _attempt in range(100):
            try:
                if what == "message":
                    await rec.deliver(wf, {"from": index, "n": m})
                elif what == "forge":
                    with contextlib.suppress(InvalidInput):  # refused: what misuse wants to see
                        await rec.supply(wf, careless.FORGED_KEY, {"by": index}, forged=True)
                elif what == "approval":
                    await rec.arrive(wf, f"approval-{index}", {"by": index})
                else:  # straight to the checkpointer: the value is there, no wakeup is needed
                    await rec.supply(wf, f"approval-{index}", {"by": index, "again": True})
                    if cfg.lifecycle is None:  # a retention run would start a swept id afresh
                        # ... and the client nudges the queue anyway, often while a worker holds
                        # the workflow: that wakeup must stand (wakeup-stands, schedule-while-held)
                        await rec.schedule(wf)
                with contextlib.suppress(Exception):  # read your writes: the checker wants it shown
                    await rec.read(wf, via="writer")
                break
            except (Exception, Contended, Fenced):  # a refusal is the checkers' to judge
                await asyncio.sleep(0.3)  # a store error: ask again (arrive is first-writer-wins)


# -- the readers ----------------------------------------------------------------------------------


async def read_outside(cfg: RunConfig, index: int, rec: Recorder, stop: asyncio.Event) -> None:
    """Loop ``load`` and ``history`` over the workflows being written (those whose start has come),
    every ``read_pause`` seconds, until ``stop`` is set. What it saw is in its read lines (``via:
    reader``): the monotonic-loads checker judges them, and replays them as a consumer walking each
    inbox with a cursor to count what such a consumer would have skipped."""
    rng = random.Random(f"{cfg.seed}:reader:{index}")
    pause = cfg.workload.read_pause
    t0 = cfg.t0
    n = 0
    while not stop.is_set():
        due = [wf for wf, s in zip(cfg.workflows, cfg.starts, strict=True) if t0 + s <= time.time() + 0.5]
        if due:
            n += 1
            with contextlib.suppress(Exception):  # a failed read is in the history; read on
                await rec.read(rng.choice(due), "history" if n % 2 else "load")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), pause)


# -- process entry --------------------------------------------------------------------------------


async def _main(role: str, cfg: RunConfig, name: str) -> None:
    run_dir = cfg.run_dir
    hist = HistoryWriter(run_dir / "procs" / f"{name}.{os.getpid()}.jsonl", name)
    spec = dict(cfg.store)
    version = 1  # the test workflow's version (a worker's variant may name another)
    if role == "worker":
        # a mixed fleet's settings, or those a deploy restarted this worker with; named in the
        # start line, as they took effect, so checkers can tell whose pass ran on which
        variant = fleet.current(run_dir, name, cfg.worker_specs.get(name, {}))
        changes, lease = fleet.effective(variant, spec)
        version = fleet.workflow_version(variant)
        spec.update(changes)
        if lease:
            cfg = cfg.model_copy(update={"lease": cfg.lease.model_copy(update=lease)})
        took = {**changes, **({"lease": lease} if lease else {}), **({"workflow_version": version} if version != 1 else {})}
        hist.event("info", what="start", role=role, variant=took)
    else:
        hist.event("info", what="start", role=role)
    if role == "worker" and cfg.workload.identity == "name" and "consumer" in spec:
        spec["consumer"] = name  # a replacement or a restart takes its predecessor's identity
    if role == "worker" and cfg.worker_urls:
        spec["url"] = cfg.worker_urls[name]  # through this worker's own toxiproxy proxy
    if role == "worker" and name in cfg.wakeup_urls:
        spec["wakeup_url"] = cfg.wakeup_urls[name]  # its wakeup through a proxy of its own
    if role == "careless":
        spec = careless_spec(cfg)
    # A worker or reader asked to stop (the run ending, a deploy) while it still opens the store
    # exits as asked, with its exit line, instead of dying mid-start. The handler set here stays
    # the harness worker's: it also stops the worker once there is one, so a SIGTERM is heard
    # whenever it comes (a second handler set later could miss one met in between).
    asked_to_stop = asyncio.Event()
    worker: Worker | None = None

    def on_term() -> None:
        asked_to_stop.set()
        if worker is not None:
            worker.stopping = True

    if role in ("worker", "reader"):
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_term)
    opened = await open_store(spec, mutant_wrap(spec))
    try:
        if asked_to_stop.is_set():
            return
        if role == "sweeper":
            await sweep_in_background(cfg, opened, hist)
        elif role == "worker":
            worker = Worker(cfg, name, opened, hist)
            worker.version = version
            if cfg.workload.client == "worker":
                await LibraryClient(worker).run()  # the library Worker's own stop on SIGTERM
            else:
                await worker.run()
        elif role == "careless":
            await run_careless(cfg, name, opened, hist)
        elif role == "reader":
            stop = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
            await read_outside(cfg, int(name.rsplit("-", 1)[1]), Recorder(opened.durable, hist), stop)
        else:
            await write_outside(cfg, int(name.rsplit("-", 1)[1]), Recorder(opened.durable, hist))
    finally:
        hist.event("info", what="exit", role=role)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(opened.close(), 5)


def main(argv: list[str] | None = None) -> None:
    """``python -m wd_chaos.client.workload worker|writer|reader|sweeper|careless CONFIG NAME``."""
    parser = argparse.ArgumentParser(prog="wd_chaos.client.workload")
    parser.add_argument("role", choices=["worker", "writer", "reader", "sweeper", "careless"])
    parser.add_argument("config")
    parser.add_argument("name")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(Path(args.config))
    except ConfigError as exc:
        parser.error(str(exc))  # exits 2 with the file, field and what was wrong
    asyncio.run(_main(args.role, cfg, args.name))


if __name__ == "__main__":
    main()
