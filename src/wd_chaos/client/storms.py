"""The storm locustfile: locust users that flood a store with takes or appends (no HTTP).

Run by ``wd-chaos run take-storm|append-storm`` as ``locust -f <this file> --headless ...`` with
``WD_CHAOS_CONFIG`` naming the run's config.json; scale it out with locust's own distributed mode
(``--master`` / ``--worker`` on more machines, each given the same config and run folder) and
analyse the folder with ``wd-chaos analyze`` afterwards.

Locust runs users as gevent greenlets; the stores are asyncio. So locust's monkey-patching is
switched off (``LOCUST_SKIP_MONKEY_PATCH=1``, which the harness sets) and each user owns one real
OS thread (a gevent ``ThreadPool`` of one) holding its own event loop, store connection and
history file: the greenlet waits on its thread cooperatively, and users run truly concurrently.
Every store call is also reported to locust as a request, so its own statistics describe the storm.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import gevent
from gevent.threadpool import ThreadPool
from locust import User, constant, task

from wd_chaos.client.probes import Probe, probe_namespace
from wd_chaos.client.recorder import Recorder
from wd_chaos.config import RunConfig
from wd_chaos.config import load as load_config
from wd_chaos.history import HistoryWriter
from wd_chaos.mutation.catalogue import mutant_wrap
from wd_chaos.stores import Opened, open_store
from without_durability import Contended, Fenced

T = TypeVar("T")
_COUNTER = itertools.count()


def _config() -> RunConfig:
    path = os.environ.get("WD_CHAOS_CONFIG")
    if not path:
        raise RuntimeError("WD_CHAOS_CONFIG must name a wd-chaos run's config.json")
    return load_config(Path(path))


def _readers() -> int:
    """The storm's ``readers`` when locust loads this file for a run (0 anywhere else)."""
    if not os.environ.get("WD_CHAOS_CONFIG"):
        return 0
    storm = _config().storm
    return 0 if storm is None else storm.readers


class _StoreUser(User):
    """A locust user with its own thread, event loop, store and history file."""

    abstract = True
    wait_time = constant(0)

    def on_start(self) -> None:
        self.cfg = _config()
        if self.cfg.storm is None:
            raise RuntimeError(f"{os.environ.get('WD_CHAOS_CONFIG')}: storm: a storm run's config needs one")
        self.storm = self.cfg.storm
        self.n = next(_COUNTER)
        self.name = f"locust-{os.getpid()}-u{self.n}"
        self.rng = random.Random(f"{self.cfg.seed}:{self.name}")
        self.thread = ThreadPool(1)
        self.loop = asyncio.new_event_loop()
        hist = HistoryWriter(self.cfg.run_dir / "procs" / f"{self.name}.jsonl", self.name)
        self.hist = hist
        spec = dict(self.cfg.store)
        self.opened: Opened = self._run(open_store(spec, mutant_wrap(spec)))
        self.rec = Recorder(self.opened.durable, hist)
        lease = self.cfg.lease
        self.alive = timedelta(seconds=lease.alive)
        self.budget = timedelta(seconds=lease.budget)
        self.visibility = timedelta(seconds=lease.visibility)
        self.poll = lease.poll_interval
        self.probe: Probe | None = None
        self.probe_opened: Opened | None = None

    def on_stop(self) -> None:
        if self.probe_opened is not None:
            self._run(self.probe_opened.close())
        self._run(self.opened.close())
        self.loop.close()
        self.thread.kill()

    def _run(self, coro: Awaitable[T]) -> T:
        async def wrapped() -> T:
            return await coro

        return self.thread.apply(self.loop.run_until_complete, (wrapped(),))  # type: ignore[no-any-return]

    def _timed(self, name: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run a store call and report it to locust's statistics."""
        started = time.perf_counter()
        error: BaseException | None = None
        try:
            return self._run(call())
        except BaseException as exc:
            error = exc
            raise
        finally:
            self.environment.events.request.fire(
                request_type="store",
                name=name,
                response_time=(time.perf_counter() - started) * 1e3,
                response_length=0,
                exception=error,
                context={},
            )


class AppendUser(_StoreUser):
    """Delivers numbered messages to a few workflows (every user to every one of them), as fast as
    the store takes them; every ``check_own_every``-th delivery it loads the workflow, which must
    show that message (read-your-writes)."""

    @task
    def deliver(self) -> None:
        wf = self.rng.choice(self.cfg.workflows)
        self.sent = getattr(self, "sent", 0) + 1
        try:
            self._timed("deliver", lambda: self.rec.deliver(wf, {"user": self.name, "n": self.sent}))
        except Exception:
            gevent.sleep(0.05)
            return
        every = self.storm.check_own_every
        if every and self.sent % every == 0:
            with contextlib.suppress(Exception):
                self._timed("load", lambda: self.rec.read(wf, via="writer"))


class ReadUser(_StoreUser):
    """Loops ``load`` and ``history`` over the workflows being appended to (the monotonic-loads
    checker judges what it saw, and replays it as a consumer walking each inbox with a cursor).
    Locust runs exactly the scenario's ``readers`` of them, besides the appenders."""

    fixed_count = _readers()

    @task
    def read(self) -> None:
        self.reads = getattr(self, "reads", 0) + 1
        wf = self.cfg.workflows[self.reads % len(self.cfg.workflows)]
        how = "history" if self.reads % 2 else "load"
        try:
            self._timed(how, lambda: self.rec.read(wf, how))
        except Exception:
            gevent.sleep(0.05)
        gevent.sleep(self.storm.read_pause)


DRAIN = os.environ.get("WD_STORM_DRAIN") == "1"
"""This locust is the drain after a take storm (``cluster.drain_storm``): its users finish the
workflows plainly, with no lapsing leases and no probes."""


class TakeUser(_StoreUser):
    """Takes deliveries and answers them: claim, load, record a visit, make the workflow visible
    again at once (or finish it after ``visits`` visits), release."""

    def on_start(self) -> None:
        super().on_start()
        if self.n == 0 and not DRAIN:  # one user per locust process also runs the probes (probes.py)
            probe_spec = probe_namespace(dict(self.cfg.store), self.name)
            self.probe_opened = self._run(open_store(probe_spec, mutant_wrap(probe_spec)))
            opened = self.probe_opened
            self.probe = Probe(Recorder(opened.durable, self.hist), self.name, opened.holds)
            self.probe_next = time.monotonic() + 0.5

    @task
    def take(self) -> None:
        if self.probe is not None and time.monotonic() >= self.probe_next:
            probe = self.probe
            self._timed("probe", probe.round)
            self.probe_next = time.monotonic() + 0.5
            return
        alive, budget = self.alive, self.budget
        lapsing = not DRAIN and self.rng.random() < self.storm.lapsing
        if lapsing:  # a pass whose lease lapses under its writes
            alive = timedelta(seconds=self.storm.lapse_seconds)
            budget = 2 * alive
        try:
            d = self._timed("take", lambda: self.rec.take(self.visibility))
        except Exception:
            gevent.sleep(self.poll)
            return
        if d is None:
            gevent.sleep(self.poll)
            return
        try:
            p = self._timed("claim", lambda: self.rec.claim(d.workflow, alive, budget))
        except Contended:
            # still held by a pass that is finishing: look again shortly, not after the visibility
            with contextlib.suppress(Exception):
                soon = self._run(self.rec.now()) + timedelta(seconds=self.poll)
                self._timed("wake_at", lambda: self.rec.wake_at(d, soon))
            return
        except Exception:
            return
        try:
            if lapsing:  # hand it back at once: the next taker's claim races this pass's writes
                now = self._run(self.rec.now())
                self._timed("wake_at", lambda: self.rec.wake_at(d, now))
            recs = self._timed("load", lambda: self.rec.load(p))
            visits = sum(1 for k in recs if k.startswith("visit-"))
            if lapsing:  # record when the next taker's claim may be committing
                gevent.sleep(self.rng.uniform(0, 2 * self.poll))
            self._timed(
                "record",
                lambda: self.rec.record(p, f"visit-{p.token}", {"by": self.name, "token": p.token}),
            )
            done = visits + 1 >= self.storm.visits
            if done:
                self._timed("record", lambda: self.rec.record(p, "done", {"token": p.token}))
            # release first, so whoever takes it next can claim it at once
            self._timed("release", lambda: self.rec.release(p))
            now = self._run(self.rec.now())
            self._timed("wake_at", lambda: self.rec.wake_at(d, None if done else now))
        except (Fenced, Exception):
            return
