"""The failover fault's pieces on hand-made histories and files: the ``durability`` checker, the
``failover-promoted`` bite, the fence across a change of primary, and the scenario entry."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from test_chaos_checkers import WF, H, final
from wd_chaos import checks, scenario
from wd_chaos.checks.durability import durability
from wd_chaos.checks.fencing import fencing
from wd_chaos.faults.failover import failover_promoted


def _writes(h: H) -> None:
    h.call("supply", "A", 1, workflow=WF, key="k", value="a", res={"value": "a", "won": True})
    h.call("append", "A", 1, workflow=WF, value="m", res={"key": "inbox/00000000000000000001"})
    h.call("record", "B", 2, workflow=WF, token=5, key="r", value=1, res={"value": 1, "won": True})
    h.call("transact", "B", 2, workflow=WF, token=5, key="t", res={"value": {"row": 1}, "won": True})
    # never acknowledged (the connection was cut mid-call): not judged either way
    h.call("record", "B", 2, "unknown", workflow=WF, token=5, key="u", value=9)


ALL = [("k", "a"), ("inbox/00000000000000000001", "m"), ("r", 1), ("t", {"row": 1})]
LEDGER = [{"row": 1, "workflow": WF, "key": "t", "token": 5}]


def test_durability_accepts_every_acknowledged_write_in_the_final_state() -> None:
    h = H()
    _writes(h)
    verdict = durability(h.lines, final(ALL, ledger=LEDGER))
    assert verdict.valid is True, verdict
    assert verdict.counts["acknowledged"] == 4 and verdict.counts["lost"] == 0, verdict.counts


@pytest.mark.parametrize(
    ("records", "ledger", "lost_key"),
    [
        ([r for r in ALL if r[0] != "k"], LEDGER, "k"),
        ([r for r in ALL if not r[0].startswith("inbox/")], LEDGER, "inbox/00000000000000000001"),
        ([("r", 2) if k == "r" else (k, v) for k, v in ALL], LEDGER, "r"),
        (ALL, [], "t"),
    ],
    ids=["supply-missing", "append-missing", "record-overwritten", "ledger-row-gone"],
)
def test_durability_counts_a_lost_acknowledged_write_and_names_it(
    records: list[tuple[str, Any]], ledger: list[dict[str, Any]], lost_key: str
) -> None:
    h = H()
    _writes(h)
    verdict = durability(h.lines, final(records, ledger=ledger))
    assert verdict.valid is False, verdict
    assert verdict.counts["acknowledged"] == 4 and verdict.counts["lost"] == 1, verdict.counts
    (lost,) = verdict.evidence
    assert lost_key in (lost.get("key"), lost.get("got_key")), lost


def test_durability_is_registered_and_runs_by_name() -> None:
    h = H()
    _writes(h)
    (verdict, _bite) = checks.check(h.lines, final([], ledger=[]), ["durability"], "none")
    assert verdict.name == "durability" and verdict.valid is False
    assert verdict.counts["lost"] == 4


def _failover(h: H, *, promoted: bool = True, new_pid: int = 200) -> None:
    h.event("fault", "controller", 9, fault="failover", phase="start", id="failover-0", target_pid=100)
    h.call("record", "A", 1, "unknown", workflow=WF, token=1, key="x", value=1)
    h.event("fault", "controller", 9, fault="failover", phase="kill", id="failover-0", target_pid=100)
    h.event(
        "fault", "controller", 9, fault="failover", phase="stop", id="failover-0", target_pid=100,
        killed=True, promoted=promoted, primary_pid=new_pid,
    )  # fmt: skip
    h.call("record", "A", 1, workflow=WF, token=2, key="y", value=2, res={"value": 2, "won": True})


def test_the_failover_bites_when_a_new_primary_answers_after_calls_failed_across_it() -> None:
    h = H()
    _failover(h)
    assert failover_promoted(h.lines, {}).valid is True


@pytest.mark.parametrize(
    ("promoted", "new_pid"), [(False, 200), (True, 100)], ids=["not-promoted", "same-primary"]
)
def test_the_failover_did_not_bite_without_a_different_primary(promoted: bool, new_pid: int) -> None:
    h = H()
    _failover(h, promoted=promoted, new_pid=new_pid)
    verdict = failover_promoted(h.lines, {})
    assert verdict.valid == "unknown" and "did not bite" in verdict.summary, verdict


def test_fencing_refuses_a_token_minted_again_after_a_failover() -> None:
    """An asynchronous standby that never received a claim mints its token again once promoted."""
    h = H()
    h.call("claim", "A", 1, workflow=WF, res={"token": 7})
    _failover(h)
    h.call("claim", "B", 2, workflow=WF, res={"token": 7})
    verdict = fencing(h.lines, final([]))
    assert verdict.valid is False, verdict


def test_the_failover_fault_plans_its_event_and_replays_it() -> None:
    text = """
name = "f"
stores = ["postgres"]
bite = "failover-promoted"
checks = ["durability"]
[[faults]]
kind = "failover"
at = 2.0
replication = "async"
lag = 0.25
"""
    parsed = scenario.parse(text, "f.toml")
    (event,) = scenario.plan(parsed, 1, 4, 10.0)
    assert event["fault"] == "failover" and event["target"] == "store"
    assert (event["replication"], event["lag"], event["wait_replicas"]) == ("async", 0.25, 0)
    assert scenario.parse_schedule([event], "replay") == [event]


def test_a_bad_failover_field_is_refused_by_name() -> None:
    text = 'name = "f"\n[[faults]]\nkind = "failover"\nat = 1.0\nreplication = "semi"\n'
    with pytest.raises(scenario.ScenarioError, match=r"faults\[0\]\.replication: expected one of"):
        scenario.parse(text, "f.toml")
    with pytest.raises(scenario.ScenarioError, match=r"faults\[0\]\.count"):
        scenario.parse(text.replace('"semi"', '"sync"\ncount = 2'), "f.toml")


def test_a_failover_run_without_redis_sentinel_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wd_chaos.control.services import check_available

    server = shutil.which("redis-server")
    assert server, "redis-server must be installed (scripts/install-servers)"
    (tmp_path / "redis-server").symlink_to(server)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("WD_REDIS_URL", raising=False)
    assert check_available("redis", False) is None
    reason = check_available("redis", False, True)
    assert reason and "redis-sentinel was not found" in reason and "install-servers" in reason, reason


def test_a_partition_failover_bites_when_writes_were_answered_while_the_primary_was_cut_off() -> None:
    h = H()
    h.event("fault", "controller", 9, fault="failover", phase="start", id="failover-0", target_pid=100)
    h.event(
        "fault", "controller", 9, fault="failover", phase="stop", id="failover-0", target_pid=100,
        isolated=True, promoted=True, primary_pid=200,
    )  # fmt: skip
    h.call("record", "A", 1, workflow=WF, token=2, key="y", value=2, res={"value": 2, "won": True})
    assert failover_promoted(h.lines, {}).valid == checks.UNKNOWN  # never rejoined: no window to judge
    h.event("fault", "controller", 9, fault="failover", phase="rejoin", id="failover-0", target_pid=100)
    assert failover_promoted(h.lines, {}).valid is True


def test_the_extra_failover_scenarios_validate() -> None:
    folder = Path(__file__).resolve().parents[1] / "src" / "wd_chaos" / "scenarios" / "extra"
    found = {p.stem: scenario.load_file(p) for p in folder.glob("failover-*.toml")}
    assert set(found) == {"failover-partition", "failover-partition-nowait"}, found
    assert found["failover-partition-nowait"].expect == "lost-writes"


class _Nemesis:
    """What ``failover.start`` uses of the nemesis: its server, its fault lines, its timers."""

    def __init__(self, server: Any) -> None:
        self.services = {"server": server}
        self.lines: list[dict[str, Any]] = []
        self.active: list[Any] = []

    def line(self, ev: dict[str, Any], phase: str, **more: Any) -> None:
        self.lines.append({"phase": phase, **more})


@pytest.mark.parametrize("offers", [True, False], ids=["offers-partition", "does-not"])
def test_a_partition_failover_asks_the_pair_not_the_store_name(offers: bool) -> None:
    """A new store's ``Replicated`` that offers a partition is isolated; one that does not is
    skipped with a line naming why (no store name decides either)."""
    from wd_chaos.faults import failover
    from without_durability.testing.replicated import Replicated
    from without_durability.testing.servers import Server

    isolated: list[bool] = []

    class Pair(Replicated):
        offers_partition = offers

        def isolate_primary(self) -> None:
            isolated.append(True)

    server = Server("mystore", "mystore://127.0.0.1:1", "127.0.0.1", 1, "local", pid=123)
    nemesis = _Nemesis(Pair("mystore", server.url, server, server, False))
    failover.start(nemesis, {"fault": "failover", "id": "failover-0", "how": "partition"})  # type: ignore[arg-type]
    if offers:
        assert isolated and nemesis.lines[0]["phase"] == "start", nemesis.lines
    else:
        assert not isolated and nemesis.lines[0]["phase"] == "skipped", nemesis.lines
        assert "not offered for mystore" in nemesis.lines[0]["why"], nemesis.lines
