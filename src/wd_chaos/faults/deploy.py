"""The ``deploy`` fault: a rolling deploy. Each event restarts one more worker (SIGTERM: the
harness's worker ends its pass and exits, the library Worker's process ends at once; the run
restarts it) onto new settings: its variant (``wd_chaos.fleet``) with ``to`` and ``lease`` laid
over it, store settings such as Postgres's ``fast_failover`` and lease settings such as ``alive``
or ``poll_interval``. The workers (or the entry's ``targets``) are taken in order, each once per
``[[faults]]`` entry before any twice, so a second entry can roll the fleet back and an entry with
more events than targets restarts them again. It bit when some workflow's passes ran on workers of two
settings (the ``fleet-mixed`` bite, in ``checks.fleet``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from ..fleet import DEPLOYED, FleetValue, check_variant, current, deploy, laid_over
from .base import TARGET_WAIT, EventSpec, FaultKind, FaultSpec, Marker
from .nemesis import Nemesis


class DeployFault(FaultSpec):
    """Restart the workers one at a time (one per event) onto ``to`` and ``lease``."""

    kind: Literal["deploy"]
    to: dict[str, FleetValue] = Field(default_factory=dict)
    """Store settings of the release (keys of the kit's worker spec; others are dropped), and
    ``workflow_version`` (1 or 2: the release runs that version of the test workflow)."""
    lease: dict[str, float] = Field(default_factory=dict)
    """Lease settings of the release (``alive``, ``budget``, ``visibility``, ``poll_interval``)."""
    targets: list[Annotated[str, Field(pattern=r"^worker-[0-9]+$")]] = Field(default_factory=list)
    """The workers it restarts (default: all of them); with more events than targets it goes round
    them again, as a restart loop of the same workers would."""

    @field_validator("lease")
    @classmethod
    def _lease(cls, lease: dict[str, float]) -> dict[str, float]:
        check_variant({"lease": lease})
        return lease

    @field_validator("to")
    @classmethod
    def _to(cls, to: dict[str, FleetValue]) -> dict[str, FleetValue]:
        check_variant(dict(to))
        return to

    @model_validator(mode="after")
    def _changes_something(self) -> DeployFault:
        if not self.to and not self.lease:
            raise ValueError("a deploy needs what the release changes: 'to' (store settings) or 'lease'")
        return self


class DeployEvent(EventSpec):
    """A scheduled restart of the next worker onto the release."""

    fault: Literal["deploy"]
    to: dict[str, FleetValue] | None = None
    lease: dict[str, float] | None = None
    targets: list[str] | None = None


def plan(fault: DeployFault, scenario: Any) -> dict[str, object]:
    """The release the event restarts a worker onto, and the workers it may restart."""
    return {"to": dict(fault.to), "lease": dict(fault.lease), "targets": list(fault.targets)}


@dataclass
class Rolled:
    """How often each ``[[faults]]`` entry (by index) has restarted each worker so far."""

    done: dict[int, Counter[str]] = field(default_factory=dict)
    last: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Each entry's last restart: (its event's ``at``, the elapsed seconds it happened at)."""
    stopping: tuple[dict[str, Any], str, int, float, int] | None = None
    """The restart under way: (its event, the worker, its pid, when SIGTERM was sent (monotonic
    s), how many times the stop was pressed since: 0, then 1 after a second SIGTERM, 2 after
    SIGKILL)."""


RESEND = 2.0
"""Seconds after which a worker still running is sent SIGTERM again (a signal that met it
starting may have gone unheard; a deploy tool repeats its stop)."""
GRACE = 8.0
"""Seconds after the first SIGTERM after which a worker still running is SIGKILLed, as an
orchestrator's grace period ends (past a pass's whole budget, so a pass that ends as asked does)."""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that still runs (not gone, not a zombie waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _pressed(nemesis: Nemesis, rolled: Rolled) -> None:
    """While the last restarted worker has not exited: SIGTERM it again after ``RESEND`` s, and
    SIGKILL it after ``GRACE`` s, each once and in a line of its own (phase ``escalated``)."""
    if rolled.stopping is None:
        return
    ev, name, pid, sent, pressed = rolled.stopping
    waited = time.monotonic() - sent
    step = 2 if waited > GRACE else 1 if waited > RESEND else 0
    if step <= pressed:
        return
    if not _running(pid):
        return  # it exited; the run has not restarted it yet
    sig = signal.SIGKILL if step == 2 else signal.SIGTERM
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    rolled.stopping = (ev, name, pid, sent, step)
    why = f"still running {waited:.1f} s after SIGTERM"
    nemesis.line({**ev, "target": name}, "escalated", target_pid=pid, signal=sig.name, why=why)


def setup(nemesis: Nemesis) -> Rolled:
    return Rolled()


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    """Restart the first worker, by number, that this entry has not restarted yet and no fault
    holds stopped: its new variant is left where its next start reads it, then SIGTERM. As a
    deploy waits for each new instance before it stops the next, an event waits while the last
    restarted worker is not running again, and (up to ``TARGET_WAIT``) for a worker inside a step,
    so the release lands on a fleet at work rather than on workers still starting."""
    rolled = nemesis.state("deploy", setup)
    if any((nemesis.run_dir / DEPLOYED).glob("*.restart")):
        _pressed(nemesis, rolled)
        return False
    rolled.stopping = None
    if not nemesis.busy("step") and elapsed < float(ev["at"]) + TARGET_WAIT:
        return False
    entry = int(ev.get("index", 0))
    # an event delayed by the waits above keeps its schedule's spacing from the one before it, so
    # a delay never bunches restarts together (each new instance gets its time to work)
    if entry in rolled.last and elapsed < rolled.last[entry][1] + float(ev["at"]) - rolled.last[entry][0]:
        return False
    done = rolled.done.setdefault(entry, Counter())
    pids = nemesis.pids()
    targets = ev.get("targets") or [n for n in pids if n.startswith("worker-")]
    left = [n for n in targets if n in pids and n not in nemesis.stopped]
    if not left:
        nemesis.line(ev, "skipped", why=f"none of {', '.join(sorted(targets))} is running and not stopped")
        return True
    # the worker this entry restarted least often, the lowest number first: each once, then again
    name = min(left, key=lambda n: (done[n], int(n.rsplit("-", 1)[1])))
    configured = json.loads((nemesis.run_dir / "config.json").read_text()).get("worker_specs", {})
    variant = laid_over(current(nemesis.run_dir, name, configured.get(name, {})), {"lease": ev.get("lease") or {}})
    variant = laid_over(variant, dict(ev.get("to") or {}))
    deploy(nemesis.run_dir, name, variant)
    (nemesis.run_dir / DEPLOYED / f"{name}.restart").write_text("deploy")  # the restart's line says so
    done[name] += 1
    rolled.last[entry] = (float(ev["at"]), elapsed)
    nemesis.line({**ev, "target": name}, "start", target_pid=pids[name], variant=variant)
    rolled.stopping = (ev, name, pids[name], time.monotonic(), 0)
    with contextlib.suppress(ProcessLookupError):  # it died a moment ago: it restarts anyway
        os.kill(pids[name], signal.SIGTERM)
    return True


DEPLOY = FaultKind(
    "deploy",
    DeployFault,
    DeployEvent,
    plan,
    start,
    color="#2a7f62",
    markers=(Marker("start"), Marker("stop", style="--")),
    detail=("target", "variant"),
)
