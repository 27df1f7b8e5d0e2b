"""The lifecycle checkers (``long-wait``) on hand-made histories: each says yes to a correct history
and no to one that breaks its guarantee, even once the store has forgotten a terminal workflow."""

from __future__ import annotations

from typing import Any

from wd_chaos import checks
from wd_chaos.history import Op

WF = "wf"


class H:
    """A history: ``call`` writes an invoke and a complete one tick apart."""

    def __init__(self) -> None:
        self.lines: list[Op] = []
        self.t = 0
        self.n = 0

    def _tick(self) -> int:
        self.t += 100_000_000  # a tenth of a second per line
        return self.t

    def call(self, f: str, proc: str = "w1", pid: int = 1, outcome: str = "ok", res: Any = None, **inv: Any) -> None:
        self.n += 1
        op = f"{proc}:{pid}:{self.n}"
        base = {"op": op, "f": f, "process": proc, "pid": pid}
        self.lines.append({"type": "invoke", "mono": self._tick(), **base, **inv})
        self.lines.append({"type": "complete", "outcome": outcome, "mono": self._tick(), **base, **(res or {})})

    def event(self, kind: str, proc: str = "w1", pid: int = 1, **fields: Any) -> None:
        self.lines.append({"type": kind, "process": proc, "pid": pid, "mono": self._tick(), **fields})

    def pass_(self, token: int, keys: list[str], pid: int = 1) -> None:
        self.call("claim", pid=pid, workflow=WF, res={"token": token})
        self.call("load", pid=pid, workflow=WF, token=token, res={"keys": keys})

    def record(self, token: int, key: str, pid: int = 1) -> None:
        self.call("record", pid=pid, workflow=WF, token=token, key=key, value=1, res={"value": 1, "won": True})


def final(records: list[str], ledger: int = 1, failing: bool = False) -> dict[str, Any]:
    return {
        "workflows": {WF: {"history": [[k, 1, "2030-01-01T00:00:00+00:00"] for k in records]}},
        "ledger": [{"row": i + 1, "workflow": WF, "key": "ledger", "token": 1} for i in range(ledger)],
        "expected_workflows": [WF],
        "failing": [WF] if failing else [],
        "lifecycle": {"ttl": 1.0, "sweep_age": 1.0, "claim_budget": 1.0, "max_attempts": 2},
    }


def run(name: str, h: H, fin: dict[str, Any]) -> checks.Verdict:
    return checks.run_checker(name, checks.checkers()[name], h.lines, fin)


def finished_then_swept() -> H:
    """A workflow that waited, got its approval, finished; the store then forgot it."""
    h = H()
    h.pass_(1, [])
    h.event("effect", workflow=WF, key="charge", token=1, nonce="n1")
    h.record(1, "charge")
    h.call("transact", workflow=WF, token=1, key="ledger", res={"value": {}, "won": True})
    h.call("supply", proc="writer", pid=9, workflow=WF, key="approval", via="arrive", res={"won": True})
    h.pass_(2, ["charge", "ledger", "approval"])
    h.record(2, "wd/finished")
    return h


def test_a_finished_workflow_the_store_forgot_passes_every_lifecycle_check() -> None:
    h = finished_then_swept()
    for name in ("ledger-once", "no-rerun", "nothing-lost", "arrivals", "lifecycle-liveness"):
        verdict = run(name, h, final([]))
        assert verdict.valid is True, f"{name}: {verdict.summary} {verdict.evidence}"


def test_a_waiting_workflow_restarted_from_scratch_is_caught() -> None:
    h = H()
    h.pass_(1, [])
    h.event("effect", workflow=WF, key="charge", token=1, nonce="n1")
    h.record(1, "charge")
    h.call("transact", workflow=WF, token=1, key="ledger", res={"value": {}, "won": True})
    # swept or expired while waiting: the arrival's pass finds nothing and runs it all again
    h.call("supply", proc="writer", pid=9, workflow=WF, key="approval", via="arrive", res={"won": True})
    h.pass_(2, ["approval"])
    h.event("effect", workflow=WF, key="charge", token=2, nonce="n2")
    h.record(2, "charge")
    h.record(2, "wd/finished")
    fin = final([], ledger=2)
    for name in ("ledger-once", "no-rerun", "nothing-lost"):
        verdict = run(name, h, fin)
        assert verdict.valid is False, f"{name} missed a restarted workflow: {verdict.summary}"


def test_an_arrival_no_pass_ever_loads_is_caught() -> None:
    h = H()
    h.pass_(1, [])
    h.record(1, "charge")
    h.call("supply", proc="writer", pid=9, workflow=WF, key="approval", via="arrive", res={"won": True})
    assert run("arrivals", h, final(["charge"])).valid is False, "an arrival nobody loaded passed"
    h.pass_(2, ["charge", "approval"])
    assert run("arrivals", h, final(["charge", "approval"])).valid is True


def test_attempt_limit_wants_exactly_the_limit_and_nothing_after() -> None:
    def failing(attempts: int, after: bool) -> H:
        h = H()
        for n in range(1, attempts + 1):
            h.pass_(n, [])
            h.event("info", what="attempt", workflow=WF, token=n)
            h.record(n, f"wd/error/0/{n:06d}")
        h.record(attempts, "wd/failed/0")
        if after:
            h.pass_(attempts + 1, [])
            h.event("info", what="attempt", workflow=WF, token=attempts + 1)
        return h

    assert run("attempt-limit", failing(2, False), final([], failing=True)).valid is True
    assert run("attempt-limit", failing(3, False), final([], failing=True)).valid is False, "3 of 2 passed"
    assert run("attempt-limit", failing(2, True), final([], failing=True)).valid is False, "ran after failing"
    never = H()
    never.pass_(1, [])
    assert run("attempt-limit", never, final([], failing=True)).valid is False, "never failed passed"
    assert run("lifecycle-liveness", never, final([], failing=True)).valid is False


def test_the_bite_wants_an_open_workflow_kept_past_its_retention() -> None:
    h = H()
    h.pass_(1, [])
    h.record(1, "charge")
    for _ in range(30):  # idle for three seconds: longer than TTL plus budget (2 s)
        h.event("info", what="tick")
    h.pass_(2, ["charge"])
    assert checks.bite("long-wait")(h.lines, final(["charge"])).valid is True
    quick = H()
    quick.pass_(1, [])
    quick.record(1, "charge")
    quick.pass_(2, ["charge"])
    assert checks.bite("long-wait")(quick.lines, final(["charge"])).valid == checks.UNKNOWN
