"""The ``deploy`` fault: a rolling deploy. Each event restarts one more worker (SIGTERM: the
harness's worker ends its pass and exits, the library Worker's process ends at once; the run
restarts it) onto new settings: its variant (``wd_chaos.fleet``) with ``to`` and ``lease`` laid
over it, store settings such as Postgres's ``fast_failover`` and lease settings such as ``alive``
or ``poll_interval``. The workers are taken in order, each once per ``[[faults]]`` entry, so a
second entry can roll the fleet back. It bit when some workflow's passes ran on workers of two
settings (the ``fleet-mixed`` bite, in ``checks.fleet``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ..fleet import DEPLOYED, FleetValue, check_variant, current, deploy, laid_over
from .base import TARGET_WAIT, EventSpec, FaultKind, FaultSpec, Marker
from .nemesis import Nemesis


class DeployFault(FaultSpec):
    """Restart the workers one at a time (one per event) onto ``to`` and ``lease``."""

    kind: Literal["deploy"]
    to: dict[str, FleetValue] = Field(default_factory=dict)
    """Store settings of the release (keys of the kit's worker spec; others are dropped)."""
    lease: dict[str, float] = Field(default_factory=dict)
    """Lease settings of the release (``alive``, ``budget``, ``visibility``, ``poll_interval``)."""

    @field_validator("lease")
    @classmethod
    def _lease(cls, lease: dict[str, float]) -> dict[str, float]:
        check_variant({"lease": lease})
        return lease

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


def plan(fault: DeployFault, scenario: Any) -> dict[str, object]:
    """The release the event restarts a worker onto."""
    return {"to": dict(fault.to), "lease": dict(fault.lease)}


@dataclass
class Rolled:
    """Which workers each ``[[faults]]`` entry (by index) has restarted so far."""

    done: dict[int, set[str]] = field(default_factory=dict)


def setup(nemesis: Nemesis) -> Rolled:
    return Rolled()


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    """Restart the first worker, by number, that this entry has not restarted yet and no fault
    holds stopped: its new variant is left where its next start reads it, then SIGTERM. As a
    deploy waits for each new instance before it stops the next, an event waits while the last
    restarted worker is not running again, and (up to ``TARGET_WAIT``) for a worker inside a step,
    so the release lands on a fleet at work rather than on workers still starting."""
    if any((nemesis.run_dir / DEPLOYED).glob("*.restart")):
        return False
    if not nemesis.busy("step") and elapsed < float(ev["at"]) + TARGET_WAIT:
        return False
    rolled = nemesis.state("deploy", setup)
    done = rolled.done.setdefault(int(ev.get("index", 0)), set())
    pids = nemesis.pids()
    workers = sorted((n for n in pids if n.startswith("worker-")), key=lambda n: int(n.rsplit("-", 1)[1]))
    left = [n for n in workers if n not in done and n not in nemesis.stopped]
    if not left:
        nemesis.line(ev, "skipped", why="every worker runs this release already (or is stopped)")
        return True
    name = left[0]
    configured = json.loads((nemesis.run_dir / "config.json").read_text()).get("worker_specs", {})
    variant = laid_over(current(nemesis.run_dir, name, configured.get(name, {})), {"lease": ev.get("lease") or {}})
    variant = laid_over(variant, dict(ev.get("to") or {}))
    deploy(nemesis.run_dir, name, variant)
    (nemesis.run_dir / DEPLOYED / f"{name}.restart").write_text("deploy")  # the restart's line says so
    done.add(name)
    nemesis.line({**ev, "target": name}, "start", target_pid=pids[name], variant=variant)
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
