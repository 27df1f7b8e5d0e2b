"""The ``reboot`` fault: the machine the run's processes live on reboots. Every process of the run
(each holds the store: a SQLite file) is SIGKILLed, and the workers start again on a machine whose
monotonic clock restarted near zero: each in a fresh Linux time namespace (``unshare -T``, from
util-linux) whose ``CLOCK_MONOTONIC`` and ``CLOCK_BOOTTIME`` read ``uptime`` seconds at the reboot.
Each reboot makes a new namespace, so the clock restarts again at the next one.

Only a reboot restarts the monotonic clock, so only this fault can show a store that measures
leases on it (SQLite's claims, ``without_durability.clock``) mistaking a claim row written before
the restart for a live one: that row's ``alive_until`` lies far beyond the new clock, and a store
that does not see the restart keeps its workflow blocked for the machine's old uptime.

The harness's own clock does not restart: a restarted process's history lines carry the machine's
monotonic time (``history.MONO_SHIFT_ENV``, set from the namespace's offset, which is exact), so
the checkers still order every process's lines on one clock. The store's clock is the one that
restarted; the checkers never read it. The fault means something only on a store whose leases run
on this machine's monotonic clock (``lease_clock`` ``"monotonic"``): on any other its bite check
says the run tested nothing (unknown).

It bit when a reboot ended a live pass (``reboot-held``): a claim live before the reboot, in a
process the reboot killed, whose lease (``alive_until`` on the old clock) therefore lies beyond
the new clock. A reboot while nothing was held proves nothing.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from ..checks.bitten import bit
from ..checks.core import RENEWING, Operation, Verdict, bite_check, operations
from ..checks.fault_reads import REBOOT as KIND
from ..checks.fault_reads import reboot_lines
from ..history import MONO_SHIFT_ENV
from ..rundir import FinalState
from .base import EventSpec, FaultKind, FaultSpec, Marker, SimulatedForm
from .kill import KILL
from .power_loss import OTHERS_WAIT, alive, wait_dead

if TYPE_CHECKING:
    from ..history import Op
    from .nemesis import Nemesis

CONTROL = "reboot-clock"
"""The file in a run's folder holding the clock of the machine as the last reboot left it (JSON:
the namespace offsets in whole seconds, absent until the first reboot): every process the run
starts from then on is launched in a time namespace with those offsets (``launch``)."""

INSTALL_HINT = "install util-linux (Debian: apt-get install util-linux)"

PROBE_TIMEOUT = 30.0
"""Seconds the check that a time namespace can be made here may take (a Python start)."""

PROBE_SLACK = 60.0
"""How far past ``uptime`` a probe's clock may read and still count as restarted (a slow start)."""


class RebootFault(FaultSpec):
    """Reboot the machine: SIGKILL every process of the run and start the workers again on a
    monotonic clock restarted at ``uptime`` seconds."""

    kind: Literal["reboot"]
    uptime: Annotated[int, Field(ge=1, le=3600)] = 2
    """Seconds the restarted clocks read at the reboot (whole seconds: the kernel's offsets are)."""


class RebootEvent(EventSpec):
    """A scheduled reboot of the machine."""

    NEEDS = ("uptime",)
    fault: Literal["reboot"]
    uptime: int | None = None


def plan(fault: RebootFault, scenario: Any) -> dict[str, object]:
    """The machine is the target (``store``: every process that holds it); the uptime goes with it."""
    return {"target": "store", "uptime": fault.uptime}


# -- the time namespace ---------------------------------------------------------------------------


def find_unshare() -> str:
    """The path of util-linux's ``unshare``, or ``ServerUnavailable`` saying how to get it."""
    from without_durability.testing.servers import ServerUnavailable

    found = shutil.which("unshare")
    if found is None:
        raise ServerUnavailable(
            f"a reboot fault needs the unshare program (not found on PATH): {INSTALL_HINT}"
        )
    return found


def offsets(uptime: int) -> dict[str, int]:
    """The namespace offsets (whole seconds) that make ``CLOCK_MONOTONIC`` and ``CLOCK_BOOTTIME``
    read ``uptime`` (plus under a second) now: a machine that has just booted."""
    return {
        "monotonic": uptime - int(time.monotonic()),
        "boottime": uptime - int(time.clock_gettime(time.CLOCK_BOOTTIME)),
    }


def command(clock: dict[str, int]) -> tuple[list[str], dict[str, str]]:
    """The prefix that runs a command in a new time namespace with ``clock``'s offsets, and the
    environment that keeps its history on the machine's clock. The command is exec'd in the
    namespace (no fork: the process the harness starts is the worker, so its pid is what a kill
    reaches); a user who is not root maps itself to root in a user namespace (``-r``) to be allowed
    to make it. ``ServerUnavailable`` when there is no unshare."""
    prefix = [find_unshare()]
    if os.geteuid() != 0:
        prefix.append("--map-root-user")
    prefix += ["--time", f"--monotonic={clock['monotonic']}", f"--boottime={clock['boottime']}", "--"]
    return prefix, {MONO_SHIFT_ENV: str(-clock["monotonic"] * 1_000_000_000)}


def probe(uptime: int) -> None:
    """Check that a process launched as ``command`` makes it reads a restarted clock; otherwise
    ``ServerUnavailable`` naming why (no unshare, a namespace the kernel or the sandbox refuses,
    a kernel that does not move an exec'd process into it)."""
    from without_durability.testing.servers import ServerUnavailable

    prefix, _ = command(offsets(uptime))
    try:
        done = subprocess.run(
            [*prefix, sys.executable, "-c", "import time; print(time.monotonic())"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerUnavailable(f"a reboot fault could not start {prefix[0]}: {exc}") from exc
    if done.returncode != 0:
        raise ServerUnavailable(
            f"a reboot fault needs a time namespace, and {' '.join(prefix[:-1])} failed "
            f"({done.returncode}): {done.stderr.strip() or done.stdout.strip()} (Linux 5.6 or later, "
            "with CAP_SYS_ADMIN or unprivileged user namespaces)"
        )
    reading = float(done.stdout.strip() or "nan")
    if not reading < uptime + PROBE_SLACK:
        raise ServerUnavailable(
            f"a reboot fault's time namespace did not restart the clock: a process in it read "
            f"{reading:.1f} s, not about {uptime} s (an exec into a new time namespace needs Linux 5.18 "
            "or later)"
        )


def launch(run_dir: Path) -> tuple[list[str], dict[str, str]]:
    """After a reboot (``CONTROL`` written): start the process on the rebooted machine's clock."""
    try:
        clock = json.loads((run_dir / CONTROL).read_text())
    except FileNotFoundError:
        return [], {}
    return command(clock)


# -- the nemesis ----------------------------------------------------------------------------------

@dataclass
class Reboots:
    """What the reboot kind keeps for one run (its ``nemesis.state``)."""

    probed: bool = False
    """Whether the time namespace was checked (``probe``), at the run's first reboot."""
    last_ns: int = 0
    """When the last reboot was (monotonic ns; 0: none yet)."""


def setup(nemesis: Nemesis) -> Reboots:
    """A run's reboot state, made at its first reboot."""
    return Reboots()


def _held(nemesis: Nemesis) -> list[str]:
    """Workers inside a step now, whose step began after the last reboot: a worker the reboot
    killed still looks busy until its successor writes its first line, and a reboot then would end
    nothing. (Without the run's watch, which says when each step began: every busy worker.)"""
    busy = nemesis.busy("step") - nemesis.stopped
    began: dict[str, int] | None = getattr(nemesis.writes, "effect_began", None)
    if began is None:
        return sorted(busy)
    since = nemesis.state(KIND, setup).last_ns
    return sorted(n for n in busy if began.get(n, 0) > since)


def _kill(pid: int) -> None:
    # each process of the run leads its own session and group: the group goes with it
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    """Reboot: once a worker is inside a step begun since the last reboot (a pass held), and no
    process the run would not restart (a writer, a reader) is still running, SIGKILL every process
    of the run and set the clock the workers are restarted on (the run's supervisor restarts them).
    It waits for a held pass as long as the run lets a due fault wait (workers can take seconds
    to start on a loaded machine), and one still waiting at the final heal is logged as skipped:
    a reboot of idle workers would prove nothing. ``ServerUnavailable`` (a harness error) when no
    time namespace can be made."""
    at, uptime = float(ev["at"]), int(ev.get("uptime") or 2)
    if not _held(nemesis):
        return False
    others = [n for n, pid in nemesis.pids().items() if not n.startswith("worker") and alive(pid)]
    if others and elapsed < at + OTHERS_WAIT:
        return False
    if others:
        nemesis.line(
            ev, "skipped", why=f"{', '.join(sorted(others))} still running {OTHERS_WAIT:g} s past the reboot"
        )
        return True
    state = nemesis.state(KIND, setup)
    if not state.probed:
        probe(uptime)  # before anything is killed: a run that cannot reboot is a harness error
        state.probed = True
    victims = sorted(pid for pid in nemesis.pids().values() if alive(pid))
    held = _held(nemesis)
    clock = offsets(uptime)
    # the new clock first: a worker the supervisor starts after the kill boots on it
    aside = nemesis.run_dir / f"{CONTROL}.new"
    aside.write_text(json.dumps(clock))
    aside.replace(nemesis.run_dir / CONTROL)
    nemesis.line(ev, "start", target_pids=victims, busy=held, offsets=clock)
    for pid in victims:
        _kill(pid)
    left = wait_dead(victims)
    if left:
        raise RuntimeError(f"reboot: processes {left} outlived SIGKILL")
    state.last_ns = time.monotonic_ns()
    nemesis.line(ev, "stop", target_pids=victims, offsets=clock)
    return True


# -- what it did ----------------------------------------------------------------------------------


def held_at(ops: list[Op], reboot: Op) -> list[Operation]:
    """The passes a reboot ended while they held their workflow: for each, its last write that
    kept it alive (a claim, renewal or record by a process the reboot killed) whose liveness
    window (``alive`` of its claim) was still open at the reboot, with no release before it."""
    at, killed = int(reboot["mono"]), {int(p) for p in reboot.get("target_pids") or []}
    passes: dict[tuple[str, int], list[Operation]] = defaultdict(list)
    for o in operations(ops):
        if o.workflow is not None and o.token is not None:
            passes[(o.workflow, o.token)].append(o)
    found = []
    for mine in passes.values():
        claim = next((o for o in mine if o.f == "claim" and o.ok and o.invoke.get("alive") is not None), None)
        if claim is None or int(claim.invoke["pid"]) not in killed or claim.end > at:
            continue
        if any(o.f == "release" and o.start < at for o in mine):
            continue
        alive_ns = float(claim.invoke["alive"]) * 1e9
        kept = [x for x in mine if x.landed and x.f in RENEWING and x.end <= at and x.start + alive_ns > at]
        if kept:
            found.append(max(kept, key=lambda x: x.end))
    return found


@bite_check("reboot-held")
def reboot_held(ops: list[Op], final: FinalState) -> Verdict:
    """A reboot ended a live pass: its claim, live on the old clock, lies beyond the restarted one.
    On a store whose leases are not on this machine's monotonic clock nothing restarted for it:
    the run tested nothing (unknown)."""
    reboots = reboot_lines(ops)
    if final.get("lease_clock") != "monotonic":
        return bit(
            "reboot-held", [], len(reboots), "reboot(s) restarted the clock the store's leases run on"
        )
    hits = [
        {
            **o.brief(f"live at {r['id']}: its lease on the old clock lies beyond the restarted one"),
            "workflow": o.workflow,
        }
        for r in reboots
        for o in held_at(ops, r)
    ]
    return bit("reboot-held", hits, len(reboots), "live pass(es) ended by a reboot")


def describe(ops: list[Op]) -> str:
    """How many reboots the run made, and how many processes each ended."""
    made = reboot_lines(ops)
    if not made:
        return ""
    each = ", ".join(str(len(r.get("target_pids") or [])) for r in made)
    return html.escape(
        f"{len(made)} reboot(s) restarted the monotonic clock of the run's processes, ending {each} process(es)."
    )


async def simulate(sim: Any, n: int) -> None:
    """In ``wd-chaos sim``: crash every worker (each a kill), keep the machine down past a budget,
    restart the lease clock small and reopen the store."""
    if sim.world.permits(f"{REBOOT.name}-{n}"):
        await sim.reboot(REBOOT.name, n, KILL.name)


REBOOT = FaultKind(
    KIND,
    RebootFault,
    RebootEvent,
    plan,
    start,
    color="#6a4c93",
    window=True,
    markers=(Marker("stop", width=1.2, style="-"),),
    describe=describe,
    detail=("uptime", "target_pids", "busy"),
    launch=launch,
    simulated="the nemesis crashes every worker and restarts the store's lease clock small",
    form=SimulatedForm(order=0, share=0.05, inject=simulate, applies=lambda sim: not sim.world.rebooted),
)
