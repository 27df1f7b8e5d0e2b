"""The ``clock-step`` fault: the store's own clock jumps forward or back mid-run, as NTP stepping, an
operator or a virtual machine resumed from a snapshot would move it.

Everything about the fault is here: its scenario entry (``ClockStepFault``), what it needs from
the environment (libfaketime, ``server_env``), the nemesis action (``start``) and its final heal
(``heal``) and the check that it bit (``CLOCK_BITES``). The steps it made as the checkers read
them off the history, and which repeated effects they caused, are read in
``wd_chaos.checks.fault_reads``, below both the checkers and this module.

Which clock moves: a server store's (Postgres, Redis) runs under libfaketime, preloaded with
``FAKETIME_TIMESTAMP_FILE`` naming a control file the nemesis rewrites (``+6.000``: six seconds
ahead), re-read on every call (``FAKETIME_NO_CACHE``) so a step lands at once; a server libfaketime
hangs (Debian's Redis, linked with jemalloc) runs under ``clockshim.c`` instead, which reads the
same file the same way. Only the wall clock
(``CLOCK_REALTIME``) is faked: an NTP step leaves ``CLOCK_MONOTONIC`` alone, and the servers time
their own waits on it (Redis's event loop, Postgres's latches), so faking it would stall them
rather than model a step. A process-clock store (SQLite) has its wall clock moved the way the
``wall-step`` fault moves it (``stores.WALL_OFFSET``), in every worker at once.

The harness's own clocks never move: the history is stamped by them, so the checkers judge the
store by real time, and each step's line records the monotonic moments just before and after the
control file changed (``between``), the window in which the store's clock jumped.
"""

from __future__ import annotations

import glob
import shutil
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from ..checks.bitten import bit
from ..checks.core import FENCED_WRITES, Verdict, bite_check, operations
from ..checks.fault_reads import CLOCK_STEP as KIND
from ..checks.fault_reads import clock_steps, lapsed, live_at, passes_of
from ..history import Op
from ..rundir import FinalState
from .base import TARGET_WAIT, EventSpec, FaultKind, FaultSpec
from .nemesis import Nemesis
from .wall_step import wall_offset

if TYPE_CHECKING:
    from without_durability.testing.servers import ServerRecipe

CLOCK_FILE = "server-clock"
"""The control file in a run's directory that libfaketime reads in the server: a signed offset in
seconds (``+0`` until the first step)."""

LIBFAKETIME_GLOBS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/*/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
    "/usr/lib64/faketime/libfaketime.so.1",
)
INSTALL_HINT = "install it with scripts/install-servers (Debian: apt-get install faketime)"


class ClockStepFault(FaultSpec):
    """Step the store's clock by ``seconds`` (negative: back): a server store's clock through
    libfaketime, a process-clock store's (SQLite) wall clock in every worker. Steps add up; the
    final heal puts the clock right again."""

    kind: Literal["clock-step"]
    seconds: Annotated[float, Field(ge=-3600, le=3600, allow_inf_nan=False)]


class ClockStepEvent(EventSpec):
    """A scheduled step of the store's clock: by how many seconds."""

    NEEDS = ("seconds",)
    fault: Literal["clock-step"]
    seconds: Annotated[float | None, Field(allow_inf_nan=False)] = None


def plan_fields(fault: ClockStepFault, scenario: Any = None) -> dict[str, object]:
    """The fields ``scenario.plan`` puts on one scheduled clock-step event."""
    return {"seconds": fault.seconds, "target": "store"}


# -- what it needs --------------------------------------------------------------------------------


def find_libfaketime() -> str:
    """The path of libfaketime.so.1 (the usual places, then what dpkg says the package holds), or
    ``ServerUnavailable`` saying how to install it."""
    from without_durability.testing.servers import ServerUnavailable

    for pattern in LIBFAKETIME_GLOBS:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    if shutil.which("dpkg"):
        listed = subprocess.run(["dpkg", "-L", "libfaketime"], capture_output=True, text=True, check=False)
        for line in listed.stdout.splitlines():
            if line.endswith("/libfaketime.so.1") and Path(line).exists():
                return line
    raise ServerUnavailable(
        f"a clock-step run needs libfaketime (libfaketime.so.1 was not found): {INSTALL_HINT}"
    )


def _linked_with_jemalloc(binary: str) -> bool:
    listed = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False)
    return "libjemalloc" in listed.stdout


def build_shim(folder: Path) -> str:
    """Compile ``clockshim.c`` (shipped beside this module) into ``folder``; returns the library's
    path, or ``ServerUnavailable`` saying how to get a C compiler."""
    from without_durability.testing.servers import ServerUnavailable

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise ServerUnavailable(
            "a clock-step run on Redis builds a small preload library and needs a C compiler: "
            "install one with scripts/install-servers (Debian: apt-get install gcc libc6-dev)"
        )
    out = folder / "clockshim.so"
    source = Path(__file__).with_name("clockshim.c")
    made = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(out), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        raise ServerUnavailable(f"compiling {source} failed ({made.returncode}): {made.stderr.strip()}")
    return str(out)


def _find_server(binary_name: str, recipe: ServerRecipe | None) -> str:
    """The path of the server program, on PATH or where the kit's recipe says to look."""
    from without_durability.testing.servers import find_binary

    pattern = recipe.binary_glob(binary_name) if recipe is not None else ""
    return find_binary(binary_name, *([pattern] if pattern else []))


def why_unavailable(binary_name: str, recipe: ServerRecipe | None = None) -> str | None:
    """Why the server program ``binary_name`` (a kit's ``server_binary``: postgres, redis-server;
    looked for where the kit's ``recipe`` says, besides PATH) cannot run on a stepped clock here
    (what to install), or None."""
    from without_durability.testing.servers import ServerUnavailable

    try:
        binary = _find_server(binary_name, recipe)
        if not _linked_with_jemalloc(binary):
            find_libfaketime()
        elif not (shutil.which("cc") or shutil.which("gcc")):
            return (
                f"a clock-step run on {binary_name} (linked with jemalloc) needs a C compiler: "
                "apt-get install gcc libc6-dev (scripts/install-servers)"
            )
    except ServerUnavailable as exc:
        return str(exc)
    return None


def _readable_by_the_server(recipe: ServerRecipe | None, control: Path) -> None:
    """A server started by root runs as its recipe's ``run_as`` user (``servers.as_user``): a
    control file it cannot read would leave its clock unmoved and the run proving nothing, so
    refuse it."""
    import os

    from without_durability.testing.servers import ServerUnavailable, as_user

    if recipe is None or not recipe.run_as or os.geteuid() != 0:
        return
    probe = subprocess.run([*as_user(recipe.run_as), "test", "-r", str(control)], check=False)
    if probe.returncode != 0:
        raise ServerUnavailable(
            f"the {recipe.kind} server runs as user {recipe.run_as} and cannot read the clock control "
            f"file {control}: give a --report-dir every user can read (for example under /tmp)"
        )


def server_env(binary_name: str, control: Path, recipe: ServerRecipe | None = None) -> dict[str, str]:
    """The environment that runs the server program ``binary_name`` (a kit's ``server_binary``,
    found where its ``recipe`` says besides PATH) on a clock ``control`` steps (creating it at
    ``+0``): libfaketime, or, for a server linked with jemalloc (Debian's Redis), which hangs
    under libfaketime at start (libfaketime issue #130), the small ``clockshim.c`` reading the
    same control file. With the recipe, a server that runs as another user (``run_as``) must be
    able to read ``control``, or ``ServerUnavailable``."""
    # absolute: a server changes its working directory (Redis to --dir, Postgres to its data)
    control = control.resolve()
    if not control.exists():
        control.write_text("+0\n")
    _readable_by_the_server(recipe, control)
    binary = _find_server(binary_name, recipe)
    if _linked_with_jemalloc(binary):
        return {"LD_PRELOAD": build_shim(control.parent), "WD_CLOCK_FILE": str(control)}
    return {
        "LD_PRELOAD": find_libfaketime(),
        "FAKETIME_TIMESTAMP_FILE": str(control),
        "FAKETIME_NO_CACHE": "1",  # every clock read sees the file as it is: a step lands at once
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # a real step moves the wall clock only
    }


# -- the nemesis ------------------------------------------------------------------------------------


def _write(path: Path, text: str) -> None:
    # written aside and renamed, so no reader ever sees a half-written offset
    aside = path.with_name(path.name + ".new")
    aside.write_text(text)
    aside.replace(path)


class ClockSteps:
    """A run's clock steps: which clock they move (the server's, or with no server the workers'
    wall clock a file store reads), how far the server's is off now, and how many steps were made."""

    def __init__(self, run_dir: Path, server: bool) -> None:
        self.run_dir = run_dir
        self.server = server
        self.offset = 0.0
        """The server clock's offset (a file store's is the shared ``wall_step.WallOffset``)."""
        self.steps = 0


def setup(nemesis: Nemesis) -> ClockSteps:
    """The run's clock-step state: no step yet, on the server's clock if the run has a server."""
    return ClockSteps(nemesis.run_dir, nemesis.services.get("server") is not None)


def _move(nemesis: Nemesis, seconds: float) -> tuple[float, int]:
    """Move the store's clock by ``seconds``; returns the new offset and the monotonic time (ns)
    just before the move."""
    state = nemesis.state(KIND, setup)
    before = time.monotonic_ns()
    if state.server:
        state.offset += seconds
        _write(state.run_dir / CLOCK_FILE, f"{state.offset:+.3f}\n")
        return state.offset, before
    # the same offset a wall-step moves: the two add up
    return wall_offset(nemesis).move(seconds), before


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float, wait: float = TARGET_WAIT) -> bool:
    """Make one scheduled step; False to be asked again (no pass is mid-step yet, for at most
    ``wait`` seconds past its time): a step proves most when it lands on a live pass."""
    state = nemesis.state(KIND, setup)
    if not nemesis.busy("step") - nemesis.stopped and elapsed - float(ev["at"]) <= wait:
        return False
    offset, before = _move(nemesis, float(ev["seconds"]))
    state.steps += 1
    clock = "server" if state.server else "worker wall"
    # store_clock_step: the queue's clock moved too (wd_chaos.checks.queue_calls.queue_steps)
    nemesis.line(ev, "start", offset=offset, before_mono=before, clock=clock, store_clock_step=True)
    return True


def heal(nemesis: Nemesis) -> None:
    """Put the store's clock right (offset 0), logged as one more step, so the final reads and the
    liveness wait run on true time."""
    state = nemesis.state(KIND, setup)
    moved = state.offset if state.server else wall_offset(nemesis).seconds
    if not state.steps or moved == 0:
        return
    offset, before = _move(nemesis, -moved)
    nemesis.hist.event(
        "fault",
        fault=KIND,
        phase="start",
        id=f"{KIND}-heal",
        seconds=-moved,
        offset=offset,
        before_mono=before,
        target="store",
        healing=True,
        store_clock_step=True,
    )


# -- what it bit (the readers the checkers share are in ``checks.fault_reads``) --------------------


def _stamps_moved(ops: list[Op], final: FinalState, step: dict[str, Any]) -> dict[str, Any] | None:
    """A record landed after ``step`` whose stored ``written_at`` is ahead of the harness's own
    wall clock at its invoke by at least half the step: the step reached the store's clock."""
    from datetime import datetime

    stamps = {
        (wf, row[0]): datetime.fromisoformat(str(row[2])).timestamp()
        for wf, state in final.get("workflows", {}).items()
        for row in state.get("history", [])
    }
    for o in operations(ops):
        if o.f != "record" or not o.ok or not o.got("won") or o.start < step["between"][1]:
            continue
        stamp = stamps.get((str(o.workflow), str(o.invoke.get("key"))))
        wall = datetime.fromisoformat(str(o.invoke["wall"])).timestamp()
        if stamp is not None and stamp - wall >= 0.5 * float(step["seconds"]):
            return o.brief(f"stamped {stamp - wall:+.1f}s from real time: the store's clock had moved")
    return None


def _held_across(ops: list[Op], final: FinalState) -> list[dict[str, Any]]:
    """On a store whose leases are on the monotonic clock: for each forward step that reached the
    store's clock, a pass live at the step whose next write after it was accepted, its lease kept."""

    all_ops = operations(ops)
    passes = passes_of(all_ops)
    hits = []
    for step in [s for s in clock_steps(ops) if s["seconds"] > 0]:
        lo, hi = step["between"]
        moved = _stamps_moved(ops, final, step)
        if moved is None:
            continue
        for (_wf, _token), mine in passes.items():
            held = live_at(mine, lo)
            nxt = sorted((o for o in mine if o.f in FENCED_WRITES and o.start > hi), key=lambda o: o.start)
            if held is not None and nxt and nxt[0].landed:
                hits += [nxt[0].brief(f"live across a {step['seconds']:+g}s step, its write accepted"), moved]
                break
    return hits


@bite_check(KIND)
def clock_step_bite(ops: list[Op], final: FinalState) -> Verdict:
    """The step touched a live lease. Where the store's leases run on the stepped clock (a server's):
    a forward step lapsed a live pass: a newer claim completed while the old pass's window was
    still open in real time, and the old pass's next write was refused as Fenced. Where they run
    on the monotonic clock (SQLite): a forward step reached the store's clock (a record stamped
    ahead of real time) while a pass was live, and that pass's next write was accepted."""

    tried = sum(1 for s in clock_steps(ops) if s["seconds"] > 0)
    if final.get("lease_clock") != "wall":
        hits = _held_across(ops, final)
        return bit(KIND, hits, tried, "forward step(s) held by a live pass (leases on the monotonic clock)")
    hits = []
    for held, taken, refused in lapsed(ops, final):
        hits += [
            held.brief(f"token {held.token} kept alive ({held.invoke.get('alive')}s window)"),
            taken.brief(f"claimed after a forward server clock step while token {held.token} was alive"),
            refused.brief(f"token {held.token}'s next write, refused as Fenced"),
        ]
    verdict = bit(KIND, hits, tried, "part(s) of evidence: a forward step lapsed a live lease")
    if hits:
        verdict.summary = (
            f"{len(hits) // 3} live pass(es) lapsed by a forward step, each refused on its next write"
        )
        verdict.counts["bit"] = len(hits) // 3
    return verdict


CLOCK_STEP_COLOR = "#1b998b"


def describe(ops: list[Op]) -> str:
    """The report's line about the steps this run made, if any."""
    made = clock_steps(ops)
    if not made:
        return ""
    return (
        f"<p>the store's clock was stepped {len(made)} time(s) by the nemesis (dashed on the "
        "timeline): " + ", ".join(f"{s['seconds']:+g} s" for s in made) + "</p>"
    )


def services(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The kit's server on a clock the nemesis steps."""
    return {"clock_step": True}


CLOCK_STEP = FaultKind(
    KIND,
    ClockStepFault,
    ClockStepEvent,
    plan_fields,
    start,
    services=services,
    heal=heal,
    color=CLOCK_STEP_COLOR,
    describe=describe,
    detail=("seconds", "offset", "clock"),
    simulated="the nemesis steps the store's virtual wall clock forward or back",
)
