"""The workload's processes as the controller sees them while a run executes: ``Cluster`` starts,
restarts and stops them, ``Watch`` tails their histories (who is inside an effect, running
counts), and ``run_workload`` / ``run_storm`` / ``wait_for_heal`` drive the workload, the storm
and the wait after the final heal. ``runner.run`` uses them in its execute step.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..faults import Nemesis, launching
from ..fleet import DEPLOYED, REPLACE_MARKER
from ..history import HistoryWriter, Tail
from ..mutation.catalogue import mutant_wrap
from ..stores import Spec, open_store
from .lifeline import die_with_parent


class Cluster:
    """The workload's processes: start, restart after a kill, stop."""

    def __init__(self, config: Path, run_dir: Path, hist: HistoryWriter) -> None:
        self.config = config
        self.run_dir = run_dir
        self.hist = hist
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping = False
        self.restarts = 0
        self.log = (run_dir / "processes.log").open("ab")

    def start(
        self,
        role: str,
        name: str,
        command: list[str] | None = None,
        *,
        patched: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        """Start a process; ``patched``: let locust monkey-patch it (a distributed storm's master,
        whose messaging to its workers needs that, and which runs no user); ``env``: variables of
        its own besides the run's."""
        command = command or [sys.executable, "-m", "wd_chaos.client.workload", role, str(self.config), name]
        # a fault may have changed how processes start from now on (a reboot: a restarted clock)
        prefix, extra = launching(self.run_dir)
        command = [*prefix, *command]
        env = {
            **os.environ,
            **(env or {}),
            "WD_CHAOS_CONFIG": str(self.config),
            "LOCUST_SKIP_MONKEY_PATCH": "1",
            **extra,
        }
        if patched:
            del env["LOCUST_SKIP_MONKEY_PATCH"]
        # A new session: Ctrl-C in the terminal reaches the runner only, which stops them itself;
        # the kernel kills them if the runner dies without doing so (lifeline.die_with_parent)
        me = os.getpid()
        self.procs[name] = subprocess.Popen(
            command,
            env=env,
            stdout=self.log,
            stderr=self.log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=lambda: die_with_parent(me),  # prctl must run in the child, before exec
        )

    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self.procs.items()}

    def supervise(self) -> None:
        """Restart a worker that died (a failpoint kill); writers that finished stay finished. A
        worker a ``replace-stuck`` fault stopped gets its replacement under its name, beside it."""
        for marker in sorted((self.run_dir / DEPLOYED).glob(f"*{REPLACE_MARKER}")):
            name = marker.name.removesuffix(REPLACE_MARKER)
            fault = marker.read_text().strip()  # the kind that asked, for its line
            marker.unlink()
            if self.stopping or name not in self.procs:
                continue
            stalled = self.procs.pop(name)
            # the stopped predecessor stays in the table (stopped with the rest at the end) under
            # a name no fault targets and nothing restarts
            self.procs[f"stalled-{name}-{stalled.pid}"] = stalled
            self.start("worker", name)
            self.hist.event(
                "fault",
                fault=fault,
                phase="replaced",
                target=name,
                target_pid=stalled.pid,
                restarted_pid=self.procs[name].pid,
            )
        for name, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None or self.stopping or not name.startswith("worker"):
                continue
            old = proc.pid
            # a fault that stopped it on purpose left a marker naming itself; else a failpoint kill
            marker = self.run_dir / DEPLOYED / f"{name}.restart"
            fault = marker.read_text().strip() if marker.exists() else "kill"
            marker.unlink(missing_ok=True)
            self.start("worker", name)
            self.restarts += 1
            self.hist.event(
                "fault",
                fault=fault or "kill",
                phase="stop",
                target=name,
                target_pid=old,
                returncode=code,
                restarted_pid=self.procs[name].pid,
            )

    def writers_done(self) -> bool:
        return all(p.poll() is not None for n, p in self.procs.items() if n.startswith("writer"))

    def alive(self, name: str) -> bool:
        return name in self.procs and self.procs[name].poll() is None

    def stop(self, grace: float = 5.0) -> None:
        """SIGCONT (a stalled process cannot exit), SIGTERM, then SIGKILL what is left."""
        self.stopping = True
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.log.close()


READY_WAIT = 10.0
"""The most a run's fault phase is stretched for workers slow to make their first calls."""


class Watch:
    """Tails every process's history file: who is inside an effect, and running counts."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tails: dict[Path, Tail] = {}
        self.in_effect: dict[str, str | None] = {}
        self.counts: Counter[str] = Counter()
        self.terminal: set[str] = set()
        """Workflows with an acknowledged ``wd/finished`` or ``wd/failed/`` record (lifecycle)."""
        self._terminal_ops: dict[str, str] = {}
        self.effect_workflow: dict[str, str | None] = {}
        self.effect_began: dict[str, int] = {}
        self._writes: dict[str, tuple[str, int]] = {}
        self.last_write: dict[str, tuple[int, int]] = {}
        """Per workflow, its latest write that took (won, or an append): (invoke, complete) mono ns."""
        self.began: set[str] = set()
        """Processes that have invoked their first store call."""

    def poll(self) -> None:
        for path in self.folder.glob("*.jsonl"):
            tail = self.tails.setdefault(path, Tail(path))
            for line in tail.read():
                name = str(line.get("process"))
                if line["type"] == "invoke":
                    self.began.add(name)
                if line["type"] == "invoke" and line["f"] == "record":
                    key = str(line.get("key"))
                    if key == "wd/finished" or key.startswith("wd/failed/"):
                        self._terminal_ops[str(line["op"])] = str(line.get("workflow"))
                if (
                    line["type"] == "complete"
                    and line["outcome"] == "ok"
                    and line["op"] in self._terminal_ops
                ):
                    self.terminal.add(self._terminal_ops[line["op"]])
                if line["type"] == "invoke" and line["f"] in ("record", "transact", "supply", "append"):
                    self._writes[str(line["op"])] = (str(line.get("workflow")), int(line["mono"]))
                elif line["type"] == "complete" and str(line["op"]) in self._writes:
                    wf, invoked = self._writes.pop(str(line["op"]))
                    if line["outcome"] == "ok" and line.get("won", True):
                        self.last_write[wf] = max(
                            self.last_write.get(wf, (0, 0)), (invoked, int(line["mono"]))
                        )
                if line["type"] == "invoke" and line["f"] == "effect":
                    self.in_effect[name] = str(line.get("key"))
                    self.effect_workflow[name] = str(line.get("workflow"))
                    self.effect_began[name] = int(line["mono"])
                elif line["type"] == "complete":
                    if line["f"] == "effect":
                        self.in_effect[name] = None
                    self.counts["ops"] += 1
                    self.counts[line["outcome"]] += 1
                elif line["type"] == "info" and line.get("what") == "start":
                    self.in_effect[name] = None
                elif line["type"] == "fault" and line.get("phase") == "start":
                    self.counts["faults"] += 1

    def busy(self, inside: str = "step") -> set[str]:
        """Workers inside a step's effect (``step``) or a transact's (``transact``)."""
        transact = inside == "transact"
        return {
            n for n, k in self.in_effect.items()
            if k is not None and (k == "ledger") == transact and n.startswith("worker")
        }  # fmt: skip

    def busy_after_write(self, since_ns: int, within: float) -> dict[str, str]:
        """Workers inside a step's effect (with its workflow), begun less than ``within`` seconds
        ago, whose workflow took a write invoked after ``since_ns`` (monotonic) and acknowledged
        less than ``within`` seconds ago: the record ending the step is that workflow's next write,
        so a clock moved now lands between the two. (An older effect may have been stalled, its
        pass superseded: its record would be refused.)"""
        now = time.monotonic_ns()
        fresh = {}
        for name in self.busy("step"):
            wf = str(self.effect_workflow.get(name))
            invoked, acked = self.last_write.get(wf, (0, 0))
            began = self.effect_began.get(name, 0)
            if invoked > since_ns and now - acked < within * 1e9 and now - began < within * 1e9:
                fresh[name] = wf
        return fresh

    def written_since(self, workflow: str, since_ns: int) -> bool:
        """Whether ``workflow`` took a write invoked after ``since_ns`` (monotonic), acknowledged."""
        return self.last_write.get(workflow, (0, 0))[0] > since_ns


async def _workflows_done(spec: Spec, workflows: list[str]) -> int:
    opened = await open_store(spec, mutant_wrap(spec))
    try:
        done = 0
        for wf in workflows:
            if "done" in await opened.durable.checkpointer.load(wf):
                done += 1
        return done
    finally:
        await opened.close()


def run_storm(
    storm: Any,
    seconds: float,
    cluster: Cluster,
    watch: Watch,
    report: Callable[..., None],
    locust_workers: int = 0,
) -> None:
    """Run the locust storm headless, in one process or (``locust_workers``) as locust's own
    master and worker processes, and wait for it (with a hard deadline)."""
    # the locustfile by path, never imported here: importing locust monkey-patches this process
    spec = importlib.util.find_spec("wd_chaos.client.storms")
    locustfile = str(spec.origin) if spec is not None else ""
    readers = storm.readers if storm.kind == "append" else 0
    # ReadUser has a fixed count (the config's readers); locust gives the other users the rest
    users = {"take": ["TakeUser"], "append": ["AppendUser"] + (["ReadUser"] if readers else [])}[storm.kind]
    command = [
        sys.executable, "-m", "locust", "-f", locustfile, "--headless",
        "-u", str(storm.users + readers), "-r", str(storm.spawn_rate + readers), "-t", f"{seconds:.0f}s",
        "--stop-timeout", "5", "--only-summary", "--loglevel", "WARNING",
        "--exit-code-on-error", "0", *users,
    ]  # fmt: skip
    if locust_workers:
        from without_durability.testing.servers import free_port

        port = free_port()
        command += ["--master", "--expect-workers", str(locust_workers), "--master-bind-port", str(port)]
        for i in range(locust_workers):
            cluster.start("locust", f"locust-worker-{i}", [
                sys.executable, "-m", "locust", "-f", locustfile, "--worker", "--master-host", "127.0.0.1",
                "--master-port", str(port), "--loglevel", "WARNING",
            ])  # fmt: skip
    cluster.start("locust", "locust", command, patched=bool(locust_workers))
    deadline = time.monotonic() + seconds + 60
    started = time.monotonic()
    while cluster.alive("locust"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the locust storm did not stop within {seconds + 60:.0f}s")
        watch.poll()
        report(
            ops=watch.counts["ops"],
            fenced=watch.counts["fenced"],
            limit=seconds,
            elapsed_storm=time.monotonic() - started,
        )
        time.sleep(0.2)
    code = cluster.procs["locust"].returncode
    if code != 0:
        raise RuntimeError(f"the locust storm exited {code}: see {cluster.run_dir}/processes.log")


def drain_storm(
    seconds: float,
    spec: Spec,
    workflows: list[str],
    cluster: Cluster,
    watch: Watch,
    report: Callable[..., None],
) -> int:
    """After a take storm: four plain users (no lapsing leases, no probes: ``WD_STORM_DRAIN``) take
    the workflows the storm left unfinished on to their visit count, for at most ``seconds``, and
    are stopped once every workflow is done. ``liveness`` then judges whether the store let the work
    finish once the storm was over, not how many visits the storm's seconds held (a loaded machine
    makes fewer). Returns how many workflows were done."""
    done = asyncio.run(_workflows_done(spec, workflows))
    if done == len(workflows):
        return done
    spec_ = importlib.util.find_spec("wd_chaos.client.storms")
    locustfile = str(spec_.origin) if spec_ is not None else ""
    command = [
        sys.executable, "-m", "locust", "-f", locustfile, "--headless", "-u", "4", "-r", "4",
        "-t", f"{seconds:.0f}s", "--stop-timeout", "5", "--only-summary", "--loglevel", "WARNING",
        "--exit-code-on-error", "0", "TakeUser",
    ]  # fmt: skip
    cluster.hist.event("info", what="drain", phase="start", unfinished=len(workflows) - done)
    cluster.start("locust", "locust-drain", command, env={"WD_STORM_DRAIN": "1"})
    proc = cluster.procs["locust-drain"]
    deadline = time.monotonic() + seconds + 30
    last_check = time.monotonic()
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the storm's drain did not stop within {seconds + 30:.0f}s")
        watch.poll()
        if time.monotonic() - last_check > 0.5:
            last_check = time.monotonic()
            done = asyncio.run(_workflows_done(spec, workflows))
            if done == len(workflows):
                proc.send_signal(signal.SIGTERM)  # locust stops its users and closes their stores
                proc.wait(timeout=30)
                break
        report(ops=watch.counts["ops"], fenced=watch.counts["fenced"], done=done, total=len(workflows))
        time.sleep(0.1)
    done = asyncio.run(_workflows_done(spec, workflows))
    cluster.hist.event("info", what="drain", phase="stop", finished=done)
    return done


def run_workload(
    names: list[str],
    writers: int,
    readers: int,
    limit: float,
    cluster: Cluster,
    watch: Watch,
    nemesis: Nemesis,
    report: Callable[..., None],
    careless: int = 0,
) -> None:
    """Start the workers, the outside writers, the readers and the careless clients, and run the
    fault schedule for ``limit`` s."""
    for name in names:
        cluster.start("worker", name)
    for i in range(writers):
        cluster.start("writer", f"writer-{i}")
    for i in range(readers):
        cluster.start("reader", f"reader-{i}")
    for i in range(careless):
        cluster.start("careless", f"careless-{i}")
    mono0 = time.monotonic()
    late: float | None = None
    at_limit: set[int] | None = None
    while True:
        elapsed = time.monotonic() - mono0
        watch.poll()
        if late is None and set(names) <= watch.began:
            late = elapsed
        if elapsed >= limit:
            # on a loaded machine workers can spend seconds importing before their first call:
            # faults still waiting for a worker, or begun only past the limit, get that long
            # again past it to start and run their course, no longer
            grace = min(late if late is not None else elapsed, READY_WAIT)
            if at_limit is None:
                at_limit = {id(a) for a in nemesis.active}
            begun_late = any(id(a) not in at_limit for a in nemesis.active)
            if not ((nemesis.waiting(elapsed) or begun_late) and elapsed < limit + grace):
                break
        nemesis.tick(elapsed)
        cluster.supervise()
        report(
            ops=watch.counts["ops"],
            fenced=watch.counts["fenced"],
            faults=nemesis.count,
            restarts=cluster.restarts,
            limit=limit,
            stalled=len(nemesis.stopped),
        )
        time.sleep(0.05)


def wait_for_heal(
    seconds: float,
    spec: Spec,
    workflows: list[str],
    cluster: Cluster,
    watch: Watch,
    report: Callable[..., None],
    lifecycle: bool = False,
) -> int:
    """After the final heal: wait (at most ``seconds``) for every workflow to finish; returns how
    many did."""
    deadline = time.monotonic() + seconds
    last_check = 0.0
    done = 0
    while time.monotonic() < deadline:
        watch.poll()
        cluster.supervise()
        if time.monotonic() - last_check > 0.5 and cluster.writers_done():
            last_check = time.monotonic()
            # With retention set small a terminal workflow may be gone from the store already:
            # count what the history says reached a terminal record instead.
            if lifecycle:
                done = len(watch.terminal & set(workflows))
            else:
                done = asyncio.run(_workflows_done(spec, workflows))
            if done == len(workflows):
                break
        report(
            ops=watch.counts["ops"],
            fenced=watch.counts["fenced"],
            done=done,
            total=len(workflows),
            restarts=cluster.restarts,
        )
        time.sleep(0.1)
    return done
