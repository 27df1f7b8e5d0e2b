"""The ``monotonic-loads`` checker on hand-made histories: it must pass reads that only grow and
refuse a read that shows a record before one an earlier read returned, a read that misses its own
process's write, and a cursor that skips a message; a discard between two reads exempts them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from test_chaos_checkers import H
from wd_chaos import checks
from wd_chaos.client.workload import Recorder
from wd_chaos.history import HistoryWriter, digest, observation, read_lines
from wd_chaos.scenario import ScenarioError, find, parse
from without_durability import MemoryCheckpointer, MemoryDurable, MemoryScheduler
from without_durability.testing.prefix import Read, non_prefix


def _read(h: H, keys: list[str], proc: str = "reader-0", pid: int = 9, f: str = "load", **more: Any) -> None:
    h.call(f, proc, pid, workflow="w", via="reader",
           res=observation((k, {"v": k}) for k in keys), **more)  # fmt: skip


def _verdict(h: H) -> checks.Verdict:
    return checks.check(h.lines, {}, ["monotonic-loads"], "none")[0]


def test_reads_that_only_grow_pass() -> None:
    h = H()
    _read(h, ["a"])
    _read(h, ["a", "inbox/01"], proc="reader-1", pid=10, f="history")
    _read(h, ["a", "inbox/01", "inbox/02"])
    v = _verdict(h)
    assert v.valid is True, v
    assert v.counts["reads"] == 3


def test_a_read_showing_a_record_before_an_earlier_reads_is_refused() -> None:
    h = H()
    _read(h, ["a", "inbox/01", "inbox/03"])
    _read(h, ["a", "inbox/01", "inbox/02", "inbox/03"], proc="reader-1", pid=10)
    v = _verdict(h)
    assert v.valid is False, v
    first = v.evidence[0]
    assert first["key"] == "inbox/02" and "before 'inbox/03'" in first["why"], first
    assert first["earlier"]["process"] == "reader-0" and first["later"]["process"] == "reader-1"
    # and the cursor of reader-0 would not have skipped it (it never read again), reader-1 started late
    assert v.counts["inbox messages a cursor skipped"] == 0


def test_a_cursor_that_moved_past_a_late_message_is_caught() -> None:
    h = H()
    _read(h, ["inbox/01", "inbox/03"])
    _read(h, ["inbox/01", "inbox/02", "inbox/03"])
    v = _verdict(h)
    assert v.valid is False
    assert v.counts["inbox messages a cursor skipped"] == 1
    assert any("skipped for good" in str(e["why"]) and e["key"] == "inbox/02" for e in v.evidence)


def test_another_value_under_a_key_is_refused() -> None:
    h = H()
    h.call("load", "reader-0", 9, workflow="w", res={"keys": ["a"], "digests": [digest(1)]})
    h.call("load", "reader-0", 9, workflow="w", res={"keys": ["a"], "digests": [digest(2)]})
    v = _verdict(h)
    assert v.valid is False and "another value" in v.evidence[0]["why"], v


def test_overlapping_reads_and_a_discard_between_are_exempt() -> None:
    h = H()
    a = h.begin("load", "reader-0", 9, workflow="w")
    _read(h, ["b"], proc="reader-1", pid=10)  # inside a's span: concurrent, no order
    h.end(a, "load", **observation([("a", {"v": "a"})]))
    h.call("discard", "w1", 1, workflow="w")
    _read(h, ["c"])
    assert _verdict(h).valid is True


def test_a_read_missing_its_own_processs_write_is_refused() -> None:
    h = H()
    h.call("append", "w1", 1, workflow="w", value={"v": "inbox/01"}, res={"key": "inbox/01"})
    _read(h, [], proc="w1", pid=1)
    v = _verdict(h)
    assert v.valid is False and "own process's write" in v.evidence[0]["why"], v
    h = H()
    h.call("append", "w1", 1, workflow="w", value={"v": "inbox/01"}, res={"key": "inbox/01"})
    _read(h, [], proc="w2", pid=2)  # another process may read before it: only the prefix binds it
    _read(h, ["inbox/01"], proc="w1", pid=1)
    v = _verdict(h)
    assert v.valid is True and v.counts["reads after own writes"] == 1, v


def test_no_reads_is_unknown() -> None:
    assert _verdict(H()).valid == "unknown"


def test_non_prefix_names_one_witness_per_later_read() -> None:
    reads = [
        Read(0, 1, (("a", 1), ("c", 1))),
        Read(2, 3, (("a", 1), ("b", 1), ("c", 1))),
        Read(4, 5, (("a", 1), ("b", 1), ("c", 1), ("d", 1))),
        Read(4.5, 6, (("a", 1),)),  # shorter than what completed before it: lost records
    ]
    found = non_prefix(reads)
    assert [(n.later.start, n.at) for n in found] == [(2, 1), (4, 1), (4.5, 1)], found
    assert "shows no 'c'" in found[2].why(), found[2].why()
    after = non_prefix(reads, discards=[(1.5, 1.8)])  # the first read no longer binds the rest
    assert [(n.later.start, n.at) for n in after] == [(4.5, 1)], after


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("[workload]\nreaders = -1", "workload.readers: expected a number greater than or equal to 0"),
        ("[workload]\nread_pause = 'soon'", "workload.read_pause: expected a number"),
        ("[storm]\nkind = 'append'\nreaders = 1000", "storm.readers: expected a number less than or equal to 100"),
    ],
)
def test_bad_reader_settings_are_refused_with_the_field(text: str, where: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse('name = "x"\n' + text, "scenarios/x.toml")
    assert f"scenarios/x.toml: {where}" in str(caught.value), caught.value


def test_every_scenario_judges_what_its_readers_saw() -> None:
    storm = find("append-storm")
    assert storm.storm is not None and storm.storm.readers >= 2 and storm.storm.workflows < storm.storm.users
    assert "monotonic-loads" in storm.checks
    for name in ("lease-stall", "kill-between-effect-and-record", "take-storm", "store-restart"):
        scenario = find(name)
        assert "monotonic-loads" in scenario.checks, name
        assert scenario.storm is not None or scenario.workload.readers >= 1, name


async def test_a_reads_complete_line_carries_its_keys_in_load_order_and_their_digests(tmp_path: Path) -> None:
    durable = MemoryDurable(MemoryCheckpointer(), MemoryScheduler())
    hist = HistoryWriter(tmp_path / "r.jsonl", "reader-0")
    rec = Recorder(durable, hist)
    await durable.checkpointer.supply("w", "z", {"b": 1, "a": [1, 2]})
    first = await rec.deliver("w", "m1")
    await durable.checkpointer.supply("w", "a", 2)
    await rec.read("w")
    await rec.read("w", "history")
    hist.close()
    done = [line for line in read_lines(tmp_path / "r.jsonl") if line["type"] == "complete"]
    reads = [line for line in done if line["f"] in ("load", "history")]
    assert [r["f"] for r in reads] == ["load", "history"]
    for r in reads:
        assert r["keys"] == ["z", first, "a"], r  # the store's order, not sorted
        assert r["digests"] == [digest({"a": [1, 2], "b": 1}), digest("m1"), digest(2)], r
