"""Mixed fleets (issue #45): a scenario's ``[fleet]`` gives workers different store settings, each
worker's history names its variant, and the ``fleet-mixed`` bite says whether one workflow's passes
really went between variants. The store-level sequence is in tests/test_postgres_failover.py; the
whole run is the chaos gate's ``mixed-fleet`` case."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from wd_chaos.checks.fleet import fleet_mixed
from wd_chaos.config import validate
from wd_chaos.fleet import fleet_specs
from wd_chaos.history import Op
from wd_chaos.scenario import ScenarioError, find, parse

FF, PLAIN = {"fast_failover": True}, {"fast_failover": False}


def test_a_fleet_needs_two_different_variants() -> None:
    with pytest.raises(ScenarioError, match="variants"):
        parse('name = "x"\n[fleet]\nvariants = [{ fast_failover = true }]\n', "x.toml")
    with pytest.raises(ScenarioError, match="two different variants"):
        parse('name = "x"\n[fleet]\nvariants = [{ a = 1 }, { a = 1 }]\n', "x.toml")


def test_workers_take_the_variants_in_turn_and_the_config_carries_them() -> None:
    scenario = parse(
        'name = "x"\n[fleet]\nvariants = [{ fast_failover = true }, { fast_failover = false }]\n', "x"
    )
    specs = fleet_specs(scenario.fleet, 3)
    assert specs == {"worker-0": FF, "worker-1": PLAIN, "worker-2": FF}
    assert fleet_specs(parse('name = "x"\n', "x").fleet, 3) == {}
    cfg = validate(
        {
            "run_dir": "/tmp/x",
            "store": {"store": "postgres"},
            "lease": {},
            "workload": {},
            "seed": 1,
            "workflows": [],
            "starts": [],
            "t0": 0.0,
            "retry_seconds": 1.0,
            "worker_specs": specs,
        },
        "config.json",
    )
    assert cfg.worker_specs["worker-1"] == PLAIN


def test_the_stock_mixed_fleet_mixes_fast_failover_and_judges_fencing() -> None:
    scenario = find("mixed-fleet")
    assert scenario.fleet is not None and {v.get("fast_failover") for v in scenario.fleet.variants} == {
        True,
        False,
    }
    assert "fencing" in scenario.checks and scenario.bite == "fleet-mixed"
    assert any(f.kind == "kill" for f in scenario.faults), (
        "a fast-failover worker's presence must end mid-run"
    )


def _history(variants: dict[int, dict[str, Any]], claims: list[tuple[int, str]]) -> list[Op]:
    lines: list[Op] = []
    t = 0
    for pid, variant in variants.items():
        t += 1
        lines.append(
            {
                "type": "info",
                "what": "start",
                "role": "worker",
                "process": f"w{pid}",
                "pid": pid,
                "mono": t,
                "variant": variant,
            }
        )
    for n, (pid, wf) in enumerate(claims):
        op = f"w{pid}:{pid}:{n}"
        t += 1
        lines.append(
            {
                "type": "invoke",
                "op": op,
                "f": "claim",
                "process": f"w{pid}",
                "pid": pid,
                "mono": t,
                "workflow": wf,
            }
        )
        t += 1
        lines.append(
            {
                "type": "complete",
                "op": op,
                "f": "claim",
                "outcome": "ok",
                "process": f"w{pid}",
                "pid": pid,
                "mono": t,
                "token": n + 1,
            }
        )
    return lines  # fmt: skip


def test_the_fleet_bites_only_when_a_workflow_passes_between_variants() -> None:
    mixed = fleet_mixed(_history({1: FF, 2: PLAIN}, [(1, "a"), (2, "a")]), {})
    assert mixed.valid is True and mixed.counts["bit"] == 1, mixed
    assert "fast_failover" in mixed.evidence[0]["why"]
    # each workflow stayed with one variant: the fleet was mixed, the store never saw it
    apart = fleet_mixed(_history({1: FF, 2: PLAIN}, [(1, "a"), (1, "a"), (2, "b")]), {})
    assert apart.valid not in (True, False), apart
    alike = fleet_mixed(_history({}, [(1, "a"), (2, "a")]), {})
    assert alike.valid not in (True, False), alike


# -- rolling deploys (the deploy fault) ---------------------------------------------------------


def test_a_deploy_must_change_something_and_names_a_bad_lease_setting() -> None:
    base = 'name = "x"\n[[faults]]\nkind = "deploy"\nat = 1.0\n'
    with pytest.raises(ScenarioError, match="what the release changes"):
        parse(base, "x.toml")
    with pytest.raises(ScenarioError, match=r"lease\.alve: no such lease setting"):
        parse(base + "lease = { alve = 2.0 }\n", "x.toml")
    with pytest.raises(ScenarioError, match=r"lease\.alive: expected a number of seconds > 0"):
        parse(base + "lease = { alive = 0 }\n", "x.toml")
    parse(base + "to = { fast_failover = true }\n", "x.toml")
    with pytest.raises(ScenarioError, match=r"workflow_version: expected one of \(1, 2\), got 3"):
        parse(base + "to = { workflow_version = 3 }\n", "x.toml")
    parse(base + "to = { workflow_version = 2 }\n", "x.toml")


def test_a_deployed_worker_restarts_with_its_release_laid_over_what_it_ran(tmp_path: Path) -> None:
    """A deploy leaves the worker's new variant where its next start reads it; only keys the
    store's spec has take effect (one scenario runs on every store), the lease merges key by key."""
    from wd_chaos import fleet

    configured = {"fast_failover": False, "lease": {"alive": 1.0, "budget": 4.0}}
    assert fleet.current(tmp_path, "worker-1", configured) == configured  # nothing deployed yet
    release = fleet.laid_over(configured, {"fast_failover": True, "lease": {"alive": 1.5}})
    assert release == {"fast_failover": True, "lease": {"alive": 1.5, "budget": 4.0}}
    fleet.deploy(tmp_path, "worker-1", release)
    assert fleet.current(tmp_path, "worker-1", configured) == release
    assert fleet.current(tmp_path, "worker-2", configured) == configured
    postgres = {"store": "postgres", "url": "x", "fast_failover": False}
    assert fleet.effective(release, postgres) == ({"fast_failover": True}, {"alive": 1.5, "budget": 4.0})
    sqlite = {"store": "sqlite", "path": "x"}
    assert fleet.effective(release, sqlite) == ({}, {"alive": 1.5, "budget": 4.0})


def test_the_stock_rolling_deploy_rolls_out_and_half_back() -> None:
    scenario = find("rolling-deploy")
    deploys = [f for f in scenario.faults if f.kind == "deploy"]
    assert len(deploys) == 2 and scenario.bite == "fleet-mixed"
    out, back = deploys
    assert out.count == scenario.workload.workers and 0 < back.count < scenario.workload.workers
    assert out.to.get("fast_failover") is True and back.to.get("fast_failover") is False
    assert out.lease and back.lease, "the release changes the lease, so every store sees two settings"
    assert out.to.get("workflow_version") == 2 and back.to.get("workflow_version") == 1


class _Steps:
    """The test workflow's steps, written down in order (``Steps``)."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    async def step(self, key: str, **extra: Any) -> None:
        self.ran.append(key)

    async def ledger(self) -> None:
        self.ran.append("ledger")

    async def codec(self) -> None:
        self.ran.append("codec")

    async def approvals(self) -> None:
        self.ran.append("approvals")

    async def nap(self) -> None:
        self.ran.append("nap")

    def inbox(self) -> list[str]:
        return []

    async def done(self) -> None:
        self.ran.append("done")

    def fail_on_purpose(self) -> None:
        raise AssertionError("not a failing workflow")


@pytest.mark.parametrize("version", [1, 2])
async def test_a_release_runs_its_version_of_the_workflow(version: int) -> None:
    """Version 2 adds one step, ``audit``, after ``seen`` and before ``done`` (a compatible change:
    a workflow either version started, the other finishes); a worker's variant names the version
    it runs, and its start line says so."""
    from wd_chaos import fleet
    from wd_chaos.client.testflow import test_workflow

    steps = _Steps()
    await test_workflow(steps, False, version)
    audit = ["audit"] if version == 2 else []
    assert steps.ran == ["charge", "ledger", "codec", "approvals", "nap", "seen", *audit, "done"]
    assert fleet.workflow_version({"workflow_version": version}) == version
    assert fleet.workflow_version({}) == 1
    assert fleet.effective({"workflow_version": 2}, {"store": "sqlite"}) == ({}, {}), "not a store setting"


class _Nemesis:
    """What the deploy fault uses of the nemesis: a run folder, pids, stopped workers, lines."""

    def __init__(self, run_dir: Path, workers: int) -> None:
        self.run_dir = run_dir
        (run_dir / "config.json").write_text('{"worker_specs": {}}')
        self.procs = {f"worker-{i}": 100 + i for i in range(workers)}
        self.stopped: set[str] = set()
        self.lines: list[tuple[str, dict[str, Any]]] = []
        self.states: dict[str, Any] = {}

    def pids(self) -> dict[str, int]:
        return dict(self.procs)

    def busy(self, kind: str) -> set[str]:
        return {"worker-1"}

    def state(self, owner: str, setup: Any) -> Any:
        return self.states.setdefault(owner, setup(self))

    def line(self, ev: dict[str, Any], phase: str, **more: Any) -> None:
        self.lines.append((phase, {**ev, **more}))

    def restarted(self) -> None:
        for marker in (self.run_dir / "deployed").glob("*.restart"):
            marker.unlink()  # as the cluster's supervisor does once it started the worker again


def test_a_deploy_goes_round_its_targets_and_waits_for_each_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wd_chaos.faults import deploy

    monkeypatch.setattr(deploy.os, "kill", lambda pid, sig: None)
    nem = _Nemesis(tmp_path, 3)
    ev = {"fault": "deploy", "index": 0, "id": "deploy-0", "to": {"fast_failover": True}, "lease": {}}
    order = []
    for at in (1.0, 2.0, 3.0, 4.0):
        event = {**ev, "at": at, "targets": ["worker-0", "worker-2"]}
        assert deploy.start(nem, event, at) is True
        order.append(nem.lines[-1][1]["target"])
        assert deploy.start(nem, {**event, "at": at + 0.5}, at + 0.5) is False, "restarted before the last was back"
        nem.restarted()
    assert order == ["worker-0", "worker-2", "worker-0", "worker-2"]
    # an event delayed (here: due at 5 s, asked at 9 s) keeps its spacing from the one before it
    late = {**ev, "at": 5.0, "targets": ["worker-0", "worker-2"]}
    assert deploy.start(nem, late, 9.0) is True
    nem.restarted()
    assert deploy.start(nem, {**late, "at": 6.0}, 9.5) is False and deploy.start(nem, {**late, "at": 6.0}, 10.0)
    # a roll over every worker restarts each once, lowest number first, and skips a stopped one
    (tmp_path / "b").mkdir()
    other = _Nemesis(tmp_path / "b", 3)
    other.stopped = {"worker-0"}
    assert deploy.start(other, {**ev, "at": 1.0, "targets": []}, 1.0) is True
    assert other.lines[-1][1]["target"] == "worker-1"
    assert fleet_current(tmp_path / "b", "worker-1") == {"fast_failover": True}


def fleet_current(run_dir: Path, name: str) -> Any:
    from wd_chaos import fleet

    return fleet.current(run_dir, name, {})


def test_a_deploy_presses_a_worker_that_does_not_stop_then_kills_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that does not exit after the deploy's SIGTERM (a signal met mid-start, a hung
    shutdown) would hold the roll up for the rest of the run: it is sent SIGTERM again after
    ``RESEND`` s and SIGKILLed after ``GRACE`` s, each in a line of its own; one that exited is
    left alone while the run restarts it."""
    import subprocess
    import sys
    import time

    from wd_chaos.faults import deploy

    monkeypatch.setattr(deploy, "RESEND", 0.2)
    monkeypatch.setattr(deploy, "GRACE", 0.6)
    deaf = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert deaf.stdout is not None and deaf.stdout.readline()  # its handler is set
        nem = _Nemesis(tmp_path, 1)
        nem.procs["worker-0"] = deaf.pid
        ev = {"fault": "deploy", "index": 0, "id": "deploy-0", "to": {"fast_failover": True}, "lease": {}, "targets": []}
        assert deploy.start(nem, {**ev, "at": 1.0}, 1.0) is True
        phases = lambda: [(p, line.get("signal")) for p, line in nem.lines]  # noqa: E731
        deadline = time.monotonic() + 5
        while deaf.poll() is None and time.monotonic() < deadline:
            assert deploy.start(nem, {**ev, "at": 2.0}, 2.0) is False  # waits on the restart
            time.sleep(0.05)
        assert deaf.poll() == -9, "the deaf worker was never killed"
        assert phases() == [("start", None), ("escalated", "SIGTERM"), ("escalated", "SIGKILL")]
        deploy.start(nem, {**ev, "at": 2.0}, 2.0)  # exited, not yet restarted: nothing more
        assert len(nem.lines) == 3
    finally:
        deaf.kill()
        deaf.wait()
