"""The misuse and written-at checkers on hand-made histories (each must say no to the history a
broken store leaves and yes to the real store's), and the careless effect on real SQLite."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from test_chaos_checkers import WF, H, final
from wd_chaos import checks
from wd_chaos.checks.fencing import fencing
from wd_chaos.checks.misuse import misuse
from wd_chaos.checks.order import order
from wd_chaos.checks.written_at import written_at
from wd_chaos.client.careless import FORGED_KEY, CarelessFailure, careless_effect
from wd_chaos.history import CARELESS_LEDGER_KEY
from wd_chaos.scenario import ScenarioError, parse


def _careless(h: H, outcome: str = "unknown", **res: Any) -> None:
    err = {"error": "StoreError: the effect ended the transaction"} if outcome != "ok" else {}
    h.call(
        "transact",
        outcome=outcome,
        res={**err, **res},
        workflow=WF,
        key="ledger",
        token=3,
        careless="commits",
    )


def _row(key: str, token: int = 3) -> dict[str, Any]:
    return {"row": 1, "workflow": WF, "key": key, "token": token}


def test_misuse_accepts_a_refused_careless_effect_and_a_refused_forged_key() -> None:
    h = H()
    _careless(h)
    h.call(
        "supply",
        outcome="failed",
        res={"error": "InvalidKey: reserved"},
        workflow=WF,
        key=FORGED_KEY,
        forged=True,
    )
    v = checks.checkers()["misuse"](h.lines, final([("ledger", {"row": 2})], ledger=[_row("ledger")]))
    assert v.valid is True, v
    assert v.counts["forged_refused"] == 1


def test_misuse_refuses_a_careless_effects_row_that_survived() -> None:
    h = H()
    _careless(h)
    v = misuse(h.lines, final([("ledger", {"row": 2})], ledger=[_row(CARELESS_LEDGER_KEY), _row("ledger")]))
    assert v.valid is False, v
    assert "careless effect's ledger row survived" in v.evidence[0]["why"]


def test_misuse_refuses_a_careless_transact_that_won() -> None:
    h = H()
    _careless(h, "ok", value={"row": 1}, won=True)
    assert misuse(h.lines, final([])).valid is False


def test_misuse_refuses_an_accepted_forged_key() -> None:
    h = H()
    h.call(
        "supply",
        res={"value": {"by": 0}, "won": True},
        workflow=WF,
        key=FORGED_KEY,
        value={"by": 0},
        forged=True,
    )
    assert misuse(h.lines, final([])).valid is False


def test_misuse_refuses_a_forged_key_in_the_final_state_or_a_load() -> None:
    h = H()
    h.call("supply", outcome="unknown", res={"error": "OSError"}, workflow=WF, key=FORGED_KEY, forged=True)
    assert misuse(h.lines, final([(FORGED_KEY, 1)])).valid is False
    h.call("load", res={"keys": [FORGED_KEY], "digests": ["x"]}, workflow=WF)
    assert misuse(h.lines, final([])).valid is False


def test_misuse_refuses_a_refusal_that_is_not_invalid_key() -> None:
    h = H()
    h.call(
        "supply",
        outcome="failed",
        res={"error": "InvalidInput: other"},
        workflow=WF,
        key=FORGED_KEY,
        forged=True,
    )
    assert misuse(h.lines, final([])).valid is False


def test_misuse_with_nothing_tried_is_unknown() -> None:
    assert misuse([], final([])).valid == checks.UNKNOWN


def test_written_at_refuses_a_reversal_between_concurrent_writes() -> None:
    # the history order checker lets pass: a transact stamped when it began, before an append
    # that landed while its effect ran
    h = H()
    t = h.begin("transact", workflow=WF, key="ledger", token=1)
    a = h.begin("append", "B", 2, workflow=WF, value=1)
    h.end(a, "append", key="inbox/1")
    h.end(t, "transact", value={"row": 1}, won=True)
    f = final([("inbox/1", 1), ("ledger", {"row": 1})])
    f["workflows"][WF]["history"][1][2] = "2029-01-01T00:00:00+00:00"
    assert order(h.lines, f).valid is True
    v = written_at(h.lines, f)
    assert v.valid is False, v
    assert v.evidence[0]["keys"] == ["inbox/1", "ledger"]


def test_written_at_accepts_stamps_in_history_order_and_equal_stamps() -> None:
    f = final([("a", 1), ("b", 2), ("c", 3)])
    f["workflows"][WF]["history"][2][2] = f["workflows"][WF]["history"][1][2]
    assert written_at([], f).valid is True


def test_written_at_is_unknown_when_the_stores_wall_clock_stepped() -> None:
    f = final([("a", 1), ("b", 2)])
    f["workflows"][WF]["history"][1][2] = "2029-01-01T00:00:00+00:00"
    f["store_clock"] = "local"
    f["wall_clock_steps"] = [{"seconds": -3.0, "wall": "2030-01-01T00:00:00+00:00", "mono": 1}]
    assert written_at([], f).valid == checks.UNKNOWN


# -- the careless effect on a real SQLite connection -----------------------------------------------


def _ledger(key: str) -> Any:
    def effect(cur: sqlite3.Cursor) -> object:
        cur.execute("INSERT INTO ledger (key) VALUES (?)", (key,))
        return {"row": cur.lastrowid}

    return effect


@pytest.mark.parametrize("how", ["commits", "fails"])
def test_a_careless_effect_writes_then_fails_and_commits_when_told(tmp_path: Any, how: str) -> None:
    db = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    db.execute("CREATE TABLE ledger (key TEXT)")
    cur = db.cursor()
    cur.execute("BEGIN")
    with pytest.raises(CarelessFailure):
        careless_effect(_ledger("k"), how)(cur)
    db.rollback()
    kept = db.execute("SELECT count(*) FROM ledger").fetchone()[0]
    assert kept == (1 if how == "commits" else 0)


def test_a_careless_effect_is_none_for_a_script() -> None:
    assert careless_effect(object(), "commits") is None
    with pytest.raises(ValueError, match="how must be one of"):
        careless_effect(_ledger("k"), "sometimes")


def _slow_transact(stamp: str) -> tuple[list[Any], dict[str, Any]]:
    h = H()
    t = h.begin("transact", workflow=WF, key="ledger", token=1)
    e = h.begin("effect", workflow=WF, key="ledger", token=1)
    h.end(e, "effect", wall="2030-01-01T00:00:05+00:00")
    h.end(t, "transact", value={"row": 1}, won=True)
    f = final([("ledger", {"row": 1})])
    f["workflows"][WF]["history"][0][2] = stamp
    f["store_clock"] = "local"
    return h.lines, f


def test_written_at_refuses_a_transact_stamped_before_its_effect_ended() -> None:
    lines, f = _slow_transact("2030-01-01T00:00:04.500000+00:00")
    v = written_at(lines, f)
    assert v.valid is False, v
    assert "before its effect ended" in v.evidence[0]["why"]


def test_written_at_accepts_a_transact_stamped_after_its_effect() -> None:
    lines, f = _slow_transact("2030-01-01T00:00:05.010000+00:00")
    assert written_at(lines, f).valid is True
    f["store_clock"] = "remote"  # another machine's clock: not comparable, not judged
    lines, f2 = _slow_transact("2030-01-01T00:00:04.500000+00:00")
    f2["store_clock"] = "remote"
    assert written_at(lines, f2).valid is True


# -- stale-landing ---------------------------------------------------------------------------------


def _race(*, shown: bool) -> list[Any]:
    """Pass 1 records while pass 2's claim completes and pass 2 loads; the load shows the record
    or not."""
    h = H()
    r = h.begin("record", "A", 1, workflow=WF, key="visit-1", token=1, value={"token": 1})
    h.call("claim", "B", 2, workflow=WF, res={"token": 2})
    h.call("load", "B", 2, workflow=WF, token=2, res={"keys": ["visit-1"] if shown else [], "digests": []})
    h.end(r, "record", value={"token": 1}, won=True)
    return h.lines


def test_stale_landing_refuses_a_write_that_landed_after_a_newer_claim() -> None:
    v = checks.checkers()["stale-landing"](_race(shown=False), final([("visit-1", {"token": 1})]))
    assert v.valid is False, v
    assert v.evidence[0]["key"] == "visit-1"
    # fencing cannot see it: the write was invoked before the newer claim completed
    assert fencing(_race(shown=False), final([("visit-1", {"token": 1})])).valid is True


def test_stale_landing_accepts_a_write_that_landed_before_the_newer_claim() -> None:
    v = checks.checkers()["stale-landing"](_race(shown=True), final([("visit-1", {"token": 1})]))
    assert v.valid is True, v
    assert v.counts["writes with a newer claim"] == 1


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('name = "x"\n[workload]\ncareless_effects = 1.5', "workload.careless_effects"),
        ('name = "x"\n[workload]\nforged_keys = "yes please"', "workload.forged_keys"),
        ('name = "x"\n[storm]\nkind = "take"\nlapsing = -0.1', "storm.lapsing"),
    ],
)
def test_the_careless_knobs_refuse_bad_values_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse(text, "scenarios/x.toml")
    assert f"scenarios/x.toml: {field}: expected " in str(caught.value), caught.value
