"""The failover fault, as one module: its schedule entry, what it needs from the run's servers,
the nemesis's action, and the check that it bit.

The store runs replicated: its kit (one that provides ``failover``) starts a
``without_durability.testing.replicated.Replicated`` (today Postgres with a streaming standby,
synchronous or asynchronous, and Redis with replicas under Sentinel), and every process reaches it
through a client that follows the primary. The fault, once per run:

1. ``start``: the standby (every Redis replica) is stopped (SIGSTOP) for ``lag`` seconds, the lag
   a slow network or disk gives it. A synchronous commit cannot return meanwhile; an asynchronous
   one (and a Redis write that does not ``WAIT``) returns all the same.
2. ``kill``: the primary and its children are SIGKILLed, as a crashed machine; the standby resumes.
3. ``stop``: the standby is promoted (Postgres: ``pg_ctl promote`` ``promote_after`` seconds
   later, as a failover manager would; Redis: the Sentinels elect a replica) and answers as the
   primary. Whatever the primary acknowledged and the standby had not received is gone: the
   ``durability`` checker counts it.
"""

from __future__ import annotations

import contextlib
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from without_durability.testing.kit import Capability
from without_durability.testing.replicated import Replicated

from ..checks.bitten import bit, injections
from ..checks.core import WRITES, Verdict, bite_check, operations
from ..history import Op
from ..rundir import FinalState
from .base import TARGET_WAIT, EventSpec, FaultKind, Marker
from .nemesis import Active, Nemesis

PROMOTE_TIMEOUT = 30.0
"""Seconds the nemesis waits for a promoted standby to answer as the primary."""


class FailoverFault(BaseModel):
    """Kill the replicated store's primary and promote its standby, once per run (there is one
    standby to promote)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["failover"]
    at: Annotated[float, Field(ge=0, description="seconds after the start")]
    jitter: Annotated[float, Field(ge=0)] = 0.0
    every: None = None
    count: Literal[1] = 1
    how: Literal["kill", "partition"] = "kill"
    """``kill``: SIGKILL the primary (see the module docstring). ``partition`` (Redis): cut the
    primary from the Sentinels and replicas while its clients still reach it; the Sentinels elect
    a replica, clients holding connections to the old primary keep writing there for
    ``isolated_for`` seconds, then it rejoins and is turned into a replica (Jepsen's 2013 run)."""
    isolated_for: Annotated[float, Field(ge=0, le=60)] = 4.0
    """``partition``: seconds the old primary stays cut off after the promotion."""
    replication: Literal["sync", "async"] = "sync"
    """Postgres: whether a commit waits for the standby (``synchronous_standby_names``)."""
    lag: Annotated[float, Field(ge=0, le=30)] = 0.5
    """Seconds the standby is stopped just before the primary is killed."""
    promote_after: Annotated[float, Field(ge=0, le=60)] = 1.0
    """Postgres: seconds between the kill and ``pg_ctl promote`` (a failover manager's detection
    time). Redis: unused, the Sentinels decide (``down-after-milliseconds`` 1000)."""
    wait_replicas: Annotated[int, Field(ge=0, le=2)] = 0
    """Redis: the checkpointer waits for this many replicas to acknowledge each write (``WAIT``);
    0 is Redis's default, asynchronous replication."""

    def event_fields(self) -> dict[str, object]:
        """What ``scenario.plan`` puts in this fault's event besides ``at``."""
        return {
            "target": "store",
            "how": self.how,
            "isolated_for": self.isolated_for,
            "replication": self.replication,
            "lag": self.lag,
            "promote_after": self.promote_after,
            "wait_replicas": self.wait_replicas,
        }


def needs(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's failover event, if its schedule has one: the store must then be started
    replicated, as that event says."""
    return next((e for e in events if e.get("fault") == "failover"), None)


def start(nemesis: Nemesis, ev: dict[str, Any]) -> None:
    """Begin the fault (see the module docstring): stall the standby now; the nemesis's tick runs
    the kill after ``lag`` and the promotion after ``promote_after``, and its final heal runs
    whatever is still due, so a run that ends mid-failover still ends with a primary."""
    from without_durability.testing.replicated import Replicated

    pair = nemesis.services.get("server")
    if not isinstance(pair, Replicated):
        nemesis.line(ev, "skipped", why="the store was not started replicated")
        return
    if ev.get("how") == "partition":
        _partition(nemesis, pair, ev)
        return
    nemesis.line(ev, "start", target_pid=pair.pid, standby_port=pair.standby.port)
    pair.stall_standby()
    lag = float(ev.get("lag", 0.0))

    def kill() -> None:
        # the line goes first: killing waits for the processes to be reaped, which takes a while
        nemesis.line(ev, "kill", target_pid=pair.pid, ends_sessions=True)
        old = pair.kill_primary()
        pair.resume_standby()
        killed = not _alive(old)

        def promote() -> None:
            try:
                new = pair.promote(PROMOTE_TIMEOUT)
            except Exception as exc:  # the run goes on; the bite check says the fault failed
                nemesis.line(ev, "stop", target_pid=old, killed=killed, promoted=False, why=str(exc)[:300])
                return
            nemesis.line(
                ev, "stop", target_pid=old, killed=killed, promoted=True, primary_pid=new.pid,
                primary_port=new.port,
            )  # fmt: skip

        # a store that elects its own primary needs no failover manager's detection time
        wait = 0.0 if pair.elects_itself else float(ev.get("promote_after", 0.0))
        nemesis.active.append(Active(time.monotonic() + wait, ev, promote))

    nemesis.active.append(Active(time.monotonic() + lag, ev, kill))


def _partition(nemesis: Nemesis, pair: Replicated, ev: dict[str, Any]) -> None:
    """``how = "partition"`` (where the pair ``offers_partition``): isolate the primary, wait for the Sentinels' choice, let the old
    primary serve its clients for ``isolated_for`` s, then let it rejoin."""
    if not pair.offers_partition:
        why = f"a partition failover is not offered for {pair.kind} (use how = 'kill')"
        nemesis.line(ev, "skipped", why=why)
        return
    old = pair.pid
    nemesis.line(ev, "start", target_pid=old, ends_sessions=True)
    pair.isolate_primary()

    def promote() -> None:
        try:
            new = pair.promote(PROMOTE_TIMEOUT)
        except Exception as exc:
            nemesis.line(ev, "stop", target_pid=old, isolated=True, promoted=False, why=str(exc)[:300])
        else:
            nemesis.line(
                ev, "stop", target_pid=old, isolated=True, promoted=True, primary_pid=new.pid,
                primary_port=new.port,
            )  # fmt: skip

        def rejoin() -> None:
            pair.rejoin_primary()
            nemesis.line(ev, "rejoin", target_pid=old)

        nemesis.active.append(Active(time.monotonic() + float(ev.get("isolated_for", 0.0)), ev, rejoin))

    nemesis.active.append(Active(time.monotonic(), ev, promote))


def _alive(pid: int) -> bool:
    import psutil

    with contextlib.suppress(psutil.Error):
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    return False


@bite_check("failover-promoted")
def failover_promoted(ops: list[Op], final: FinalState) -> Verdict:
    """The failover bit: the old primary's process died, a different server answered as the
    primary, at least one client operation failed across the failover, and writes were
    acknowledged after it (by the new primary)."""
    all_ops = operations(ops)
    windows = injections(ops, "failover")
    kills = {
        str(line.get("id")): line
        for line in ops
        if line["type"] == "fault" and line.get("fault") == "failover" and line.get("phase") == "kill"
    }
    rejoins = {
        str(line.get("id")): line
        for line in ops
        if line["type"] == "fault" and line.get("fault") == "failover" and line.get("phase") == "rejoin"
    }
    hits = []
    for start, stop in windows:
        if stop is None or not stop.get("promoted") or not (stop.get("killed") or stop.get("isolated")):
            continue
        if stop.get("primary_pid") in (None, stop.get("target_pid")):
            continue
        killed = kills.get(str(start.get("id")), start)
        if stop.get("isolated"):
            # a cut-off primary keeps answering its clients (redis-py retries a dropped connection
            # on its own, so none may fail): it bit if writes were answered while it was cut off
            rejoin = rejoins.get(str(start.get("id")))
            broken = [
                o
                for o in all_ops
                if o.f in (*WRITES, "append") and o.complete is not None and rejoin is not None
                and start["mono"] <= o.start <= rejoin["mono"]
            ]  # fmt: skip
        else:
            broken = [
                o
                for o in all_ops
                if o.outcome in ("failed", "unknown") and o.start <= stop["mono"] and o.end >= start["mono"]
            ]
        after = [o for o in all_ops if o.ok and o.f in WRITES and o.start > stop["mono"]]
        if broken and after:
            hits.append(
                {
                    **broken[0].brief(
                        f"failed across the failover (primary pid {killed['target_pid']} killed, "
                        f"pid {stop['primary_pid']} promoted); {len(after)} writes acknowledged after it"
                    ),
                    "failed_across": len(broken),
                }
            )
    return bit("failover-promoted", hits, len(windows), "failover(s) promoted a new primary under load")


class FailoverEvent(EventSpec):
    """A scheduled failover: the fields of its ``[[faults]]`` entry (see ``FailoverFault``)."""

    NEEDS = ("replication",)
    fault: Literal["failover"]
    replication: Literal["sync", "async"] | None = None
    how: Literal["kill", "partition"] | None = None
    isolated_for: Annotated[float | None, Field(ge=0, le=60)] = None
    lag: Annotated[float | None, Field(ge=0, le=30)] = None
    promote_after: Annotated[float | None, Field(ge=0, le=60)] = None
    wait_replicas: Annotated[int | None, Field(ge=0, le=2)] = None


def _plan(fault: FailoverFault, scenario: Any) -> dict[str, object]:
    return fault.event_fields()


def _start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    # under load: a failover that lands while the workers are still starting (seconds of imports on
    # a loaded machine) fails no call and so tests nothing; it waits for a worker inside a step,
    # up to TARGET_WAIT past its time, as a stall or a cut does
    if not nemesis.busy("step") and elapsed < float(ev["at"]) + TARGET_WAIT:
        return False
    start(nemesis, ev)
    return True


def requires(fault: FailoverFault) -> frozenset[Capability]:
    """A kit that can start a replicated deployment."""
    return frozenset({"failover"})


def services(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The store started replicated, as the run's failover event says."""
    return {"failover": needs(events)}


FAILOVER = FaultKind(
    "failover",
    FailoverFault,
    FailoverEvent,
    _plan,
    _start,
    requires=requires,
    services=services,
    color="#0077b6",
    window=True,
    markers=(Marker("kill", width=1.2),),
    detail=("replication", "lag", "wait_replicas", "killed", "promoted", "primary_pid", "primary_port"),
)
