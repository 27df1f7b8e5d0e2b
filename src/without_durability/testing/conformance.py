"""The conformance suite: one test per guarantee of DESIGN §3, run against every selected store.

Use it from a test module: ``from without_durability.testing.conformance import *`` (with this
package's pytest plugin active, which it is once the distribution is installed), then pick stores with
``--wd-store``. Every test takes the ``wd_store`` fixture, a fresh ``StoreUnderTest``.

Time: the suite moves the store's clock with ``wd_store.clock.advance``. On a server's clock that is
a real wait, so every deadline below is a multiple of a unit with half a unit of margin either side.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from datetime import timedelta
from typing import Any

import pytest

from .._values import Delivery, Pass, Recorded
from ..errors import Contended, Fenced, InvalidInput, InvalidKey, InvalidValue
from ..rules import INBOX_PREFIX
from .answers_and_takes import *  # noqa: F403  (optional capabilities: skipped by stores without them)
from .harness import EffectFailed, StoreUnderTest
from .model import test_store_agrees_with_reference_model as test_store_agrees_with_reference_model
from .prefix import Read, non_prefix

Store = StoreUnderTest[Any]
_ids = itertools.count()
LONG = timedelta(hours=1)


def unit(store: Store) -> timedelta:
    """The suite's time unit: deadlines are whole units, checks fall half a unit away from them."""
    return timedelta(seconds=0.5) if store.clock.real else timedelta(seconds=10)


def wf(label: str) -> str:
    """A workflow id no other test uses."""
    return f"conf-{label}-{next(_ids)}"


def canon(value: object) -> str:
    """A value as canonical JSON, so reads compare by value whatever the decoded type."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


async def claimable(store: Store, workflow: str) -> Pass | None:
    """A claim if the workflow is free now, else None."""
    try:
        return await store.checkpointer.claim(workflow, alive=LONG, budget=LONG)
    except Contended:
        return None


# -- claim --------------------------------------------------------------------------------


async def test_claim_live_is_contended(wd_store: Store) -> None:
    w = wf("contended")
    first = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    assert first.workflow == w
    with pytest.raises(Contended):
        await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)


async def test_exactly_one_of_concurrent_claims_wins(wd_store: Store) -> None:
    for round_ in range(3):
        w = wf(f"race{round_}")
        outcomes = await asyncio.gather(
            *(wd_store.checkpointer.claim(w, alive=LONG, budget=LONG) for _ in range(16)),
            return_exceptions=True,
        )
        wins = [o for o in outcomes if isinstance(o, Pass)]
        losses = [o for o in outcomes if isinstance(o, Contended)]
        assert len(wins) == 1, f"round {round_}: expected exactly one winner of 16 claims, got {outcomes!r}"
        assert len(losses) == 15, f"round {round_}: expected 15 Contended, got {outcomes!r}"


async def test_lapsed_claim_is_taken_with_higher_token(wd_store: Store) -> None:
    u, w = unit(wd_store), wf("lapse")
    first = await wd_store.checkpointer.claim(w, alive=2 * u, budget=LONG)
    await wd_store.clock.advance(u)
    assert await claimable(wd_store, w) is None, "a claim inside its liveness window was taken"
    await wd_store.clock.advance(1.5 * u)
    second = await claimable(wd_store, w)
    assert second is not None, "a claim past its liveness window could not be taken"
    assert second.token > first.token, f"token did not increase: {first.token} then {second.token}"


async def test_renew_extends_liveness(wd_store: Store) -> None:
    u, w = unit(wd_store), wf("renew")
    held = await wd_store.checkpointer.claim(w, alive=2 * u, budget=LONG)
    await wd_store.clock.advance(1.5 * u)
    await wd_store.checkpointer.renew(held)
    await wd_store.clock.advance(1.5 * u)  # past the first window, inside the renewed one
    assert await claimable(wd_store, w) is None, "renew did not extend liveness"


async def test_renew_never_passes_the_budget(wd_store: Store) -> None:
    u, w = unit(wd_store), wf("budget")
    held = await wd_store.checkpointer.claim(w, alive=3 * u, budget=4 * u)
    await wd_store.clock.advance(2.5 * u)
    await wd_store.checkpointer.renew(held)  # would reach 5.5u; the budget ends at 4u
    await wd_store.clock.advance(2 * u)
    assert await claimable(wd_store, w) is not None, "renew carried liveness past the budget"


async def test_claim_liveness_starts_under_the_budget(wd_store: Store) -> None:
    u, w = unit(wd_store), wf("least")
    await wd_store.checkpointer.claim(w, alive=6 * u, budget=2 * u)
    await wd_store.clock.advance(2.5 * u)
    assert await claimable(wd_store, w) is not None, "claim liveness was not capped by its budget"


async def test_release_then_renew_cannot_revive(wd_store: Store) -> None:
    w = wf("release")
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.checkpointer.release(held)
    await wd_store.checkpointer.renew(held)
    after = await claimable(wd_store, w)
    assert after is not None, "renew after release revived the claim"
    assert after.token > held.token


async def test_renew_of_superseded_pass_is_fenced(wd_store: Store) -> None:
    w = wf("renew-fenced")
    old = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.checkpointer.release(old)
    await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    with pytest.raises(Fenced):
        await wd_store.checkpointer.renew(old)


async def test_renew_is_fenced_by_its_own_workflow_not_by_another_holding_the_same_token(
    wd_store: Store,
) -> None:
    # stores that count tokens per workflow give both first claims the same token: a renewal that
    # matched on the token alone would find the other workflow's live claim and not be fenced
    w, other = wf("renew-own"), wf("renew-other")
    old = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.checkpointer.release(old)
    await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.checkpointer.claim(other, alive=LONG, budget=LONG)
    with pytest.raises(Fenced):
        await wd_store.checkpointer.renew(old)


async def test_release_of_superseded_pass_leaves_the_holder_alone(wd_store: Store) -> None:
    w = wf("release-old")
    old = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.checkpointer.release(old)
    await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.checkpointer.release(old)
    assert await claimable(wd_store, w) is None, "a superseded pass's release freed the new holder"


# -- the fence ----------------------------------------------------------------------------


async def test_superseded_record_is_fenced_and_writes_nothing(wd_store: Store) -> None:
    w = wf("fence")
    old = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.checkpointer.release(old)
    new = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    with pytest.raises(Fenced):
        await wd_store.checkpointer.record(old, "step", "stale")
    assert await wd_store.checkpointer.load(w) == {}, "a fenced record wrote"
    recorded = await wd_store.checkpointer.record(new, "step", "fresh")
    assert recorded == Recorded("fresh", True)


async def test_record_without_any_claim_is_fenced(wd_store: Store) -> None:
    w = wf("unclaimed")
    with pytest.raises(Fenced):
        await wd_store.checkpointer.record(Pass(w, 1), "step", 1)
    assert await wd_store.checkpointer.load(w) == {}


async def test_refused_write_renews_nobody(wd_store: Store) -> None:
    u, w = unit(wd_store), wf("stray")
    old = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.checkpointer.release(old)
    await wd_store.checkpointer.claim(w, alive=2 * u, budget=LONG)
    await wd_store.clock.advance(1.5 * u)
    with pytest.raises(Fenced):
        await wd_store.checkpointer.record(old, "step", "stray")
    await wd_store.clock.advance(u)  # the holder went quiet 2.5u ago; its window was 2u
    assert await claimable(wd_store, w) is not None, "a refused write renewed the holder's claim"


async def test_accepted_write_is_a_renewal(wd_store: Store) -> None:
    u, w = unit(wd_store), wf("write-renews")
    held = await wd_store.checkpointer.claim(w, alive=2 * u, budget=LONG)
    await wd_store.clock.advance(1.5 * u)
    await wd_store.checkpointer.record(held, "step", 1)
    await wd_store.clock.advance(1.5 * u)
    assert await claimable(wd_store, w) is None, "an accepted record did not renew the claim"


async def test_record_renewal_keeps_the_claims_own_window(wd_store: Store) -> None:
    u, w = unit(wd_store), wf("alive-for")
    held = await wd_store.checkpointer.claim(w, alive=2 * u, budget=LONG)
    await wd_store.clock.advance(u)
    await wd_store.checkpointer.record(held, "step", 1)
    await wd_store.clock.advance(2.5 * u)  # the renewal lasts the claim's 2u window, no longer
    assert await claimable(wd_store, w) is not None, "record renewed for longer than the claim's window"


async def test_transact_renews_within_the_budget_and_its_own_workflow_only(wd_store: Store) -> None:
    u, w, v = unit(wd_store), wf("transact-budget"), wf("transact-other")
    held = await wd_store.checkpointer.claim(w, alive=3 * u, budget=4 * u)
    await wd_store.checkpointer.claim(v, alive=2 * u, budget=LONG)  # often the same token as held
    await wd_store.clock.advance(2.5 * u)
    await wd_store.checkpointer.transact(held, "step", wd_store.effects.ledger_add(w, 1))
    assert await claimable(wd_store, v) is not None, "a transact renewed another workflow's claim"
    await wd_store.clock.advance(2 * u)  # the renewal would reach 5.5u; the budget ends at 4u
    assert await claimable(wd_store, w) is not None, "transact carried liveness past the budget"


async def test_discard_raises_the_fence_and_leaves_the_id_claimable(wd_store: Store) -> None:
    w = wf("discard")
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.checkpointer.record(held, "a", 1)
    await wd_store.checkpointer.discard(w)
    assert await wd_store.checkpointer.load(w) == {}, "discard left records"
    assert await wd_store.checkpointer.history(w) == []
    with pytest.raises(Fenced):
        await wd_store.checkpointer.record(held, "b", 2)
    assert await wd_store.checkpointer.load(w) == {}, "a pass in flight wrote after discard"
    after = await claimable(wd_store, w)
    assert after is not None, "discard left the workflow claimed"
    assert after.token > held.token, f"token reused after discard: {held.token} then {after.token}"


async def test_tokens_strictly_increase_across_discards(wd_store: Store) -> None:
    w = wf("tokens")
    seen: list[int] = []
    for _ in range(4):
        held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
        seen.append(held.token)
        await wd_store.checkpointer.record(held, "x", 1)
        await wd_store.checkpointer.discard(w)
    assert seen == sorted(set(seen)), f"tokens not strictly increasing: {seen}"


# -- first writer wins ----------------------------------------------------------------------


async def test_first_writer_wins_with_won_from_encodings(wd_store: Store) -> None:
    w = wf("fww")
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    first = await wd_store.checkpointer.record(held, "pair", (1, 2))
    assert first == Recorded([1, 2], True), f"a tuple's first record: got {first!r}"
    again = await wd_store.checkpointer.record(held, "pair", (1, 2))
    assert again == Recorded([1, 2], True), f"the same value again: got {again!r}"
    other = await wd_store.checkpointer.record(held, "pair", (3, 4))
    assert other == Recorded([1, 2], False), f"a different value: got {other!r}"
    supplied = await wd_store.checkpointer.supply(w, "pair", {"x": 1})
    assert supplied == Recorded([1, 2], False), f"supply of a different value: got {supplied!r}"
    assert await wd_store.checkpointer.load(w) == {"pair": [1, 2]}


async def test_concurrent_supplies_agree_on_one_winner(wd_store: Store) -> None:
    w = wf("supply-race")
    results = await asyncio.gather(*(wd_store.checkpointer.supply(w, "k", i) for i in range(16)))
    stored = (await wd_store.checkpointer.load(w))["k"]
    assert all(r.value == stored for r in results), f"results disagree with stored {stored}: {results}"
    winners = [i for i, r in enumerate(results) if r.won]
    assert winners == [stored], f"expected only caller {stored} to win, got {winners}"


async def test_supply_works_while_a_pass_holds_the_claim(wd_store: Store) -> None:
    w = wf("supply-held")
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    assert await wd_store.checkpointer.supply(w, "approval", "yes") == Recorded("yes", True)
    assert (await wd_store.checkpointer.record(held, "approval", "no")) == Recorded("yes", False)


async def test_inbox_keys_are_refused_by_record_and_supply(wd_store: Store) -> None:
    w = wf("inbox-reserved")
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    with pytest.raises(InvalidKey, match="inbox/"):
        await wd_store.checkpointer.record(held, f"{INBOX_PREFIX}00000000000000000001", 1)
    with pytest.raises(InvalidKey, match="inbox/"):
        await wd_store.checkpointer.supply(w, f"{INBOX_PREFIX}x", 1)
    assert await wd_store.checkpointer.load(w) == {}


async def test_values_the_codec_cannot_carry_are_refused(wd_store: Store) -> None:
    w = wf("bad-value")
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.checkpointer.record(held, "kept", 1)
    for bad in ({1, 2}, object(), float("nan")):
        with pytest.raises(InvalidValue, match=w):
            await wd_store.checkpointer.record(held, "bad", bad)
        with pytest.raises(InvalidValue):
            await wd_store.checkpointer.supply(w, "bad", bad)
        with pytest.raises(InvalidValue):
            await wd_store.checkpointer.append(w, bad)
    assert await wd_store.checkpointer.load(w) == {"kept": 1}, "a refused value lost or changed data"


async def test_oversize_values_are_refused(wd_store: Store) -> None:
    w = wf("oversize")
    await wd_store.checkpointer.supply(w, "kept", 1)
    limit = getattr(wd_store.checkpointer, "max_value_bytes", None)
    assert isinstance(limit, int), "a store exposes max_value_bytes, its limit on one encoded value"
    with pytest.raises(InvalidValue, match="limit"):
        await wd_store.checkpointer.supply(w, "big", "x" * (limit + 1))
    assert await wd_store.checkpointer.load(w) == {"kept": 1}


async def test_bad_arguments_are_refused_clearly(wd_store: Store) -> None:
    with pytest.raises(InvalidInput):
        await wd_store.checkpointer.claim("", alive=LONG, budget=LONG)
    with pytest.raises(InvalidInput, match="alive"):
        await wd_store.checkpointer.claim(wf("zero"), alive=timedelta(0), budget=LONG)
    with pytest.raises(InvalidInput):
        await wd_store.checkpointer.supply(wf("k"), "", 1)
    with pytest.raises(InvalidInput, match="timezone"):
        from datetime import datetime

        await wd_store.scheduler.schedule(wf("naive"), datetime(2030, 1, 1))


# -- order, append, history ----------------------------------------------------------------


async def test_load_keeps_first_recorded_order(wd_store: Store) -> None:
    w = wf("order")
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.checkpointer.record(held, "b", 1)
    await wd_store.checkpointer.supply(w, "a", 2)
    first_inbox = await wd_store.checkpointer.append(w, "m1")
    await wd_store.checkpointer.record(held, "c", 3)
    await wd_store.checkpointer.record(held, "b", 99)  # a losing write moves nothing
    await wd_store.checkpointer.supply(w, "a", 98)
    second_inbox = await wd_store.checkpointer.append(w, "m2")
    loaded = await wd_store.checkpointer.load(w)
    want = {"b": 1, "a": 2, first_inbox: "m1", "c": 3, second_inbox: "m2"}
    assert list(loaded.items()) == list(want.items()), f"load order: expected {want!r}, got {loaded!r}"


async def test_sequential_appends_sort_in_append_order(wd_store: Store) -> None:
    w = wf("append-seq")
    keys = [await wd_store.checkpointer.append(w, i) for i in range(12)]
    assert all(k.startswith(INBOX_PREFIX) for k in keys), f"append keys must start inbox/: {keys}"
    assert keys == sorted(keys) and len(set(keys)) == 12, f"append keys out of order: {keys}"
    assert list(await wd_store.checkpointer.load(w)) == keys


async def test_concurrent_appends_lose_nothing_and_agree_with_load(wd_store: Store) -> None:
    w = wf("append-race")
    n = 32
    keys = await asyncio.gather(*(wd_store.checkpointer.append(w, {"n": i}) for i in range(n)))
    assert len(set(keys)) == n, f"duplicate append keys: {sorted(keys)}"
    loaded = await wd_store.checkpointer.load(w)
    assert sorted(loaded) == sorted(keys), f"appended keys missing from load: {set(keys) - set(loaded)}"
    for i, key in enumerate(keys):
        assert loaded[key] == {"n": i}, f"append {i} under {key} holds {loaded[key]!r}"
    assert list(loaded) == sorted(loaded), f"key order and load order disagree: {list(loaded)}"


async def test_appends_to_many_workflows_interleave_safely(wd_store: Store) -> None:
    ws = [wf("append-many") for _ in range(4)]
    keys = await asyncio.gather(*(wd_store.checkpointer.append(w, w) for w in ws for _ in range(6)))
    per: dict[str, list[str]] = {w: [] for w in ws}
    for (w, _), key in zip(((w, i) for w in ws for i in range(6)), keys, strict=True):
        per[w].append(key)
    for w in ws:
        loaded = await wd_store.checkpointer.load(w)
        assert sorted(loaded) == sorted(per[w]) and list(loaded) == sorted(loaded), (
            f"{w}: expected keys {sorted(per[w])} in order, got {list(loaded)}"
        )


async def test_loads_only_grow_under_concurrent_writers_and_readers(wd_store: Store) -> None:
    """A load never shows a record before one that an earlier load returned: concurrent appenders,
    deliverers, a supplier and a pass recording and transacting write one workflow while readers
    loop ``load`` and ``history`` on it; every read that began after another ended extends it; a
    reader walking the inbox with a cursor misses nothing; each writer's next load shows what it
    just wrote."""
    w = wf("prefix")
    cp = wd_store.checkpointer
    held = await cp.claim(w, alive=LONG, budget=LONG)
    rounds = 24
    writing = asyncio.Event()
    reads: list[Read] = []
    acked: dict[str, object] = {}
    unseen: list[str] = []

    async def read(how: int) -> Read:
        start = time.monotonic()
        if how % 2:
            items = tuple((e.key, canon(e.value)) for e in await cp.history(w))
        else:
            items = tuple((k, canon(v)) for k, v in (await cp.load(w)).items())
        read = Read(start, time.monotonic(), items)
        reads.append(read)
        return read

    async def writer(kind: str, n: int) -> None:
        for i in range(rounds):
            value: object = {"by": f"{kind}{n}", "i": i}
            if kind == "append":
                key = await cp.append(w, value)
            elif kind == "deliver":
                key = await wd_store.durable.deliver(w, value)
            elif kind == "supply":
                key = f"s{n}-{i}"
                await cp.supply(w, key, value)
            elif kind == "transact":
                key = f"t{n}-{i}"
                value = (await cp.transact(held, key, wd_store.effects.ledger_add(w, 1))).value
            else:
                key = f"r{n}-{i}"
                await cp.record(held, key, value)
            acked[key] = value
            if i % 4 == 0:  # read your writes
                seen = dict((await read(i // 4)).items)
                if seen.get(key) != canon(value):
                    unseen.append(f"{kind}{n} wrote {key}={value!r}, then loaded {seen.get(key)!r}")
            await asyncio.sleep(0)

    async def reader(n: int) -> list[str]:
        cursor, consumed, how = "", [], n
        while writing.is_set() or how == n:
            got = await read(how)
            how += 1
            fresh = [k for k, _ in got.items if k.startswith(INBOX_PREFIX) and k > cursor]
            consumed += fresh
            cursor = max([cursor, *fresh])
            await asyncio.sleep(0)
        got = await read(how)  # after the writers: the cursor must have everything by now
        fresh = [k for k, _ in got.items if k.startswith(INBOX_PREFIX) and k > cursor]
        return consumed + fresh

    writing.set()
    writers = [("append", n) for n in range(4)] + [("deliver", n) for n in range(2)]
    writers += [("supply", 0), ("record", 0), ("transact", 0)]
    readers = [asyncio.create_task(reader(n)) for n in range(3)]
    await asyncio.gather(*(writer(kind, n) for kind, n in writers))
    writing.clear()
    walked = await asyncio.gather(*readers)
    loaded = await cp.load(w)
    assert loaded == acked, f"acknowledged writes {len(acked)}, loaded {len(loaded)}"
    broken = non_prefix(reads)
    assert not broken, (
        f"{len(broken)} of {len(reads)} loads showed a record before one an earlier load returned; "
        f"first: {broken[0].why()} (earlier load had {len(broken[0].earlier.items)} records, "
        f"this one {len(broken[0].later.items)})"
    )
    inbox = sorted(k for k in acked if k.startswith(INBOX_PREFIX))
    for n, consumed in enumerate(walked):
        assert consumed == inbox, f"reader {n}'s cursor skipped {sorted(set(inbox) - set(consumed))}"
    assert not unseen, f"a writer's next load did not show its own write: {unseen[:3]}"


async def test_history_stamps_the_winning_write_only(wd_store: Store) -> None:
    u, w = unit(wd_store), wf("history")
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.checkpointer.record(held, "one", 1)
    await wd_store.clock.advance(u)
    await wd_store.checkpointer.supply(w, "two", 2)
    key = await wd_store.checkpointer.append(w, 3)
    before = await wd_store.checkpointer.history(w)
    await wd_store.clock.advance(u)
    await wd_store.checkpointer.record(held, "one", 10)
    await wd_store.checkpointer.record(held, "one", 1)
    await wd_store.checkpointer.supply(w, "two", 20)
    after = await wd_store.checkpointer.history(w)
    assert [e.key for e in after] == ["one", "two", key]
    assert [e.value for e in after] == [1, 2, 3]
    assert after == before, f"a losing write moved history: {before!r} then {after!r}"
    times = [e.written_at for e in after]
    assert all(t.tzinfo is not None for t in times), f"written_at must be timezone-aware: {times}"
    assert times == sorted(times), f"written_at out of record order: {times}"
    assert times[1] - times[0] >= u * 0.8, f"written_at does not follow the store clock: {times}"
    assert list((await wd_store.checkpointer.load(w)).items()) == [(e.key, e.value) for e in after]


# -- transact ------------------------------------------------------------------------------


async def test_transact_performs_once_and_records(wd_store: Store) -> None:
    w = wf("transact")
    kit = wd_store.effects
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    first = await wd_store.checkpointer.transact(held, "reserve", kit.ledger_add(w, 5))
    assert first == Recorded(5, True), f"transact result: {first!r}"
    for _ in range(3):
        again = await wd_store.checkpointer.transact(held, "reserve", kit.ledger_add(w, 5))
        assert again.value == 5, f"a recorded transact returned {again!r}"
    assert await kit.ledger_read(w) == 5, "the effect ran more than once"
    assert (await wd_store.checkpointer.load(w)) == {"reserve": 5}


async def test_transact_on_a_recorded_key_performs_nothing(wd_store: Store) -> None:
    w = wf("transact-recorded")
    kit = wd_store.effects
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.checkpointer.record(held, "reserve", "by record")
    result = await wd_store.checkpointer.transact(held, "reserve", kit.ledger_add(w, 1))
    assert result.value == "by record"
    assert await kit.ledger_read(w) == 0, "transact performed its effect on a recorded key"


async def test_transact_by_a_superseded_pass_performs_nothing(wd_store: Store) -> None:
    w = wf("transact-fenced")
    kit = wd_store.effects
    old = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.checkpointer.release(old)
    await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    with pytest.raises(Fenced):
        await wd_store.checkpointer.transact(old, "reserve", kit.ledger_add(w, 1))
    assert await kit.ledger_read(w) == 0, "a superseded pass's transact performed its effect"
    assert await wd_store.checkpointer.load(w) == {}


async def test_transact_superseded_mid_effect_rolls_back(wd_store: Store) -> None:
    w = wf("transact-mid")
    kit = wd_store.effects
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    with pytest.raises(Fenced):
        await wd_store.checkpointer.transact(held, "reserve", kit.superseding(held, kit.ledger_add(w, 1)))
    assert await kit.ledger_read(w) == 0, "the effect of a pass superseded mid-effect was kept"
    assert await wd_store.checkpointer.load(w) == {}, "a pass superseded mid-effect recorded"


async def test_transact_whose_effect_fails_rolls_back(wd_store: Store) -> None:
    w = wf("transact-fail")
    kit = wd_store.effects
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    with pytest.raises(EffectFailed):
        await wd_store.checkpointer.transact(held, "reserve", kit.failing(kit.ledger_add(w, 1)))
    assert await kit.ledger_read(w) == 0, "a failed effect's write was kept"
    assert await wd_store.checkpointer.load(w) == {}
    ok = await wd_store.checkpointer.transact(held, "reserve", kit.ledger_add(w, 2))
    assert ok == Recorded(2, True) and await kit.ledger_read(w) == 2


async def test_concurrent_transacts_on_one_key_perform_once(wd_store: Store) -> None:
    w = wf("transact-race")
    kit = wd_store.effects
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    results = await asyncio.gather(
        *(wd_store.checkpointer.transact(held, "reserve", kit.ledger_add(w, 1)) for _ in range(8)),
        return_exceptions=True,
    )
    values = [r.value for r in results if isinstance(r, Recorded)]
    assert values and all(v == 1 for v in values), f"transact results: {results!r}"
    assert await kit.ledger_read(w) == 1, "concurrent transacts on one key moved the ledger twice"


# -- the scheduler -------------------------------------------------------------------------


async def test_take_hides_what_it_hands_out(wd_store: Store) -> None:
    w = wf("take")
    await wd_store.scheduler.schedule(w)
    got = await wd_store.scheduler.take(LONG)
    assert isinstance(got, Delivery) and got.workflow == w, f"take: got {got!r}"
    assert await wd_store.scheduler.take(LONG) is None, "a taken delivery was handed out again"


async def test_future_schedule_is_not_visible_early(wd_store: Store) -> None:
    u, w = unit(wd_store), wf("future")
    await wd_store.scheduler.schedule(w, await wd_store.now() + 2 * u)
    assert await wd_store.scheduler.take(LONG) is None, "a future schedule was visible early"
    await wd_store.clock.advance(2.5 * u)
    got = await wd_store.scheduler.take(LONG)
    assert got is not None and got.workflow == w


async def test_schedule_keeps_the_earlier_time(wd_store: Store) -> None:
    u, w = unit(wd_store), wf("earlier")
    now = await wd_store.now()
    await wd_store.scheduler.schedule(w, now + 4 * u)
    await wd_store.scheduler.schedule(w, now + 2 * u)
    await wd_store.scheduler.schedule(w, now + 8 * u)
    await wd_store.clock.advance(2.5 * u)
    got = await wd_store.scheduler.take(LONG)
    assert got is not None and got.workflow == w, "schedule did not keep the earlier time"


async def test_concurrent_takes_never_share_a_delivery(wd_store: Store) -> None:
    ws = [wf("storm") for _ in range(40)]
    for w in ws:
        await wd_store.scheduler.schedule(w)
    taken: list[str] = []

    async def taker() -> None:
        for _ in range(2 * len(ws)):  # bounded: a store that never hides would loop forever
            d = await wd_store.scheduler.take(LONG)
            if d is None:
                return
            taken.append(d.workflow)

    await asyncio.gather(*(taker() for _ in range(8)))
    assert sorted(taken) == sorted(ws), (
        f"each delivery once: duplicates {sorted({t for t in taken if taken.count(t) > 1})}, "
        f"missing {sorted(set(ws) - set(taken))}"
    )


async def test_unanswered_delivery_reappears_after_its_visibility(wd_store: Store) -> None:
    u, w = unit(wd_store), wf("reappear")
    await wd_store.scheduler.schedule(w)
    first = await wd_store.scheduler.take(2 * u)
    assert first is not None
    await wd_store.clock.advance(u)
    assert await wd_store.scheduler.take(2 * u) is None, "a hidden delivery reappeared early"
    await wd_store.clock.advance(1.5 * u)
    second = await wd_store.scheduler.take(2 * u)
    assert second is not None and second.workflow == w, "an unanswered delivery did not reappear"


async def test_wake_at_none_removes_the_delivery(wd_store: Store) -> None:
    u, w = unit(wd_store), wf("done")
    await wd_store.scheduler.schedule(w)
    got = await wd_store.scheduler.take(u)
    assert got is not None
    await wd_store.scheduler.wake_at(got, None)
    await wd_store.clock.advance(1.5 * u)
    assert await wd_store.scheduler.take(u) is None, "wake_at(None) left the delivery queued"


async def test_wake_at_sets_the_next_visibility(wd_store: Store) -> None:
    u, w = unit(wd_store), wf("sleep")
    await wd_store.scheduler.schedule(w)
    got = await wd_store.scheduler.take(LONG)
    assert got is not None
    await wd_store.scheduler.wake_at(got, await wd_store.now() + 2 * u)
    await wd_store.clock.advance(u)
    assert await wd_store.scheduler.take(LONG) is None, "woke before its time"
    await wd_store.clock.advance(1.5 * u)
    again = await wd_store.scheduler.take(LONG)
    assert again is not None and again.workflow == w, "did not wake at its time"


async def test_wake_at_does_not_reinstate_a_cancelled_delivery(wd_store: Store) -> None:
    u, w = unit(wd_store), wf("cancelled")
    await wd_store.scheduler.schedule(w)
    got = await wd_store.scheduler.take(u)
    assert got is not None
    await wd_store.scheduler.cancel(w)
    await wd_store.scheduler.wake_at(got, await wd_store.now())
    await wd_store.clock.advance(1.5 * u)
    assert await wd_store.scheduler.take(u) is None, "wake_at reinstated a cancelled delivery"


async def test_wake_at_does_not_overwrite_a_wakeup_since_the_take(wd_store: Store) -> None:
    w = wf("woken")
    await wd_store.scheduler.schedule(w)
    got = await wd_store.scheduler.take(LONG)
    assert got is not None
    await wd_store.scheduler.schedule(w)  # a wakeup arrives while the pass runs
    await wd_store.scheduler.wake_at(got, await wd_store.now() + LONG)
    again = await wd_store.scheduler.take(LONG)
    assert again is not None and again.workflow == w, "wake_at overwrote a wakeup that arrived since"


async def test_a_wakeup_for_later_than_the_hidden_time_survives_the_answer(wd_store: Store) -> None:
    # The wakeup leaves the visibility as the take set it (that time is earlier), so only a store
    # that counts wakeups, not one that compares times, can tell it arrived.
    u = unit(wd_store)
    for answer in ("done", "later"):
        w = wf(f"woken-later-{answer}")
        await wd_store.scheduler.schedule(w)
        got = await wd_store.scheduler.take(u)
        assert got is not None and got.workflow == w
        await wd_store.scheduler.schedule(w, await wd_store.now() + 2 * u)  # while the pass runs
        await wd_store.scheduler.wake_at(got, None if answer == "done" else await wd_store.now() + LONG)
        await wd_store.clock.advance(2.5 * u)
        again = await wd_store.scheduler.take(u)
        assert again is not None and again.workflow == w, (
            f"wake_at({'None' if answer == 'done' else 'later'}) dropped a wakeup for a time past the "
            f"delivery's hidden time that arrived while it was held: take gave {again!r}"
        )
        await wd_store.scheduler.cancel(w)


async def test_a_wakeup_after_the_visibility_ran_out_survives_the_answer(wd_store: Store) -> None:
    u, w = unit(wd_store), wf("woken-late")
    await wd_store.scheduler.schedule(w)
    got = await wd_store.scheduler.take(u)
    assert got is not None and got.workflow == w
    await wd_store.clock.advance(1.5 * u)  # the pass outlives its visibility; nobody takes it again
    await wd_store.scheduler.schedule(w)  # an arrival's wakeup, after the take
    await wd_store.scheduler.wake_at(got, None)  # the late holder answers: it saw nothing to do
    again = await wd_store.scheduler.take(u)
    assert again is not None and again.workflow == w, (
        f"wake_at(None) of a delivery whose visibility ran out dropped a wakeup since: take gave {again!r}"
    )


async def test_wake_at_does_not_overwrite_a_later_wakeup_since_the_take(wd_store: Store) -> None:
    u, w = unit(wd_store), wf("woken-later")
    await wd_store.scheduler.schedule(w)
    got = await wd_store.scheduler.take(LONG)
    assert got is not None
    await wd_store.scheduler.schedule(w, await wd_store.now() + 2 * u)  # a wakeup for later, mid-pass
    await wd_store.scheduler.wake_at(got, None)
    await wd_store.clock.advance(2.5 * u)
    again = await wd_store.scheduler.take(LONG)
    assert again is not None and again.workflow == w, "wake_at removed a later wakeup that arrived since"


class Takes:
    """What a scheduler test did, for its failure messages: each take (what it got, when on the
    test's clock, with which visibility) and each answer, so a failure names the call that went
    wrong rather than the last one made."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.started = time.monotonic()
        self.moved = 0.0
        self.lines: list[str] = []

    def _at(self) -> str:
        return f"t={time.monotonic() - self.started + (0 if self.store.clock.real else self.moved):.2f}s"

    async def advance(self, by: timedelta) -> None:
        """Move the store's clock, and say so in the log."""
        await self.store.clock.advance(by)
        self.moved += by.total_seconds()
        self.lines.append(f"{self._at()}: the clock moved {by.total_seconds():g}s")

    async def take(self, label: str, visibility: timedelta) -> Delivery | None:
        """``take(visibility)``, logged as ``label``."""
        got = await self.store.scheduler.take(visibility)
        what = "nothing" if got is None else f"{got.workflow} (receipt {got.receipt!r})"
        self.lines.append(f"{self._at()}: {label} = take(visibility={visibility.total_seconds():g}s) gave {what}")
        return got

    async def answer(self, label: str, d: Delivery, kind: str) -> None:
        """Answer ``d`` as ``kind``: ``done`` (None), ``now`` or ``later`` (an hour on)."""
        now = await self.store.now()
        at = {"done": None, "now": now, "later": now + LONG}[kind]
        await self.store.scheduler.wake_at(d, at)
        self.lines.append(f"{self._at()}: wake_at({label}, {kind}: {at and at.isoformat()})")

    async def schedule(self, w: str) -> None:
        """``schedule(w)`` due now, logged."""
        await self.store.scheduler.schedule(w)
        self.lines.append(f"{self._at()}: schedule({w})")

    def __str__(self) -> str:
        return "; what was done: " + "; ".join(self.lines)


@pytest.mark.parametrize("kind", ["done", "later", "now"])
async def test_stale_delivery_cannot_answer_for_a_newer_take(wd_store: Store, kind: str) -> None:
    u, w = unit(wd_store), wf(f"stale-{kind}")
    log = Takes(wd_store)
    await log.schedule(w)
    first = await log.take("first", u)
    assert first is not None and first.workflow == w, f"the scheduled workflow was not taken{log}"
    await log.advance(1.5 * u)
    second = await log.take("second", LONG)
    assert second is not None and second.workflow == w, (
        f"a delivery whose visibility ran out was not taken again{log}"
    )
    assert second.receipt != first.receipt, f"two takes of one workflow got equal receipts{log}"
    hidden = await log.take("check", LONG)
    assert hidden is None, (
        "the second take did not hide the workflow for its own visibility (before any answer: the cause is "
        f"the take, not an answer){log}"
    )
    await log.answer("first", first, kind)  # the first taker answers late: stale
    stray = await log.take("after the stale answer", LONG)
    assert stray is None, f"a stale answer ({kind}) made the workflow the second take holds visible{log}"
    await log.answer("second", second, "now")
    third = await log.take("third", LONG)
    assert third is not None and third.workflow == w, (
        f"the newer holder's answer (due now) found nothing to act on: the stale answer ({kind}) removed or "
        f"moved its delivery{log}"
    )


@pytest.mark.parametrize("kind", ["done", "later", "now"])
async def test_a_stale_answer_after_a_retake_at_the_same_visibility_changes_nothing(
    wd_store: Store, kind: str
) -> None:
    # the same visibility both times: a store whose receipt is the visibility alone, not the moment
    # it was set, could take the stale receipt for the current one
    u, w = unit(wd_store), wf(f"stale-same-{kind}")
    log = Takes(wd_store)
    await log.schedule(w)
    first = await log.take("first", 2 * u)
    assert first is not None and first.workflow == w, f"the scheduled workflow was not taken{log}"
    await log.advance(2.5 * u)
    second = await log.take("second", 2 * u)
    assert second is not None and second.workflow == w, f"a delivery whose visibility ran out was not taken again{log}"
    assert second.receipt != first.receipt, f"two takes of one workflow got equal receipts{log}"
    await log.answer("first", first, kind)
    stray = await log.take("after the stale answer", 2 * u)
    assert stray is None, f"a stale answer ({kind}) made the workflow the second take holds visible{log}"
    await log.answer("second", second, "later")
    await log.advance(2.5 * u)
    gone = await log.take("after the holder's 'later'", 2 * u)
    assert gone is None, (
        f"the newer holder's answer (an hour on) did not act: the stale answer ({kind}) left the workflow "
        f"queued sooner{log}"
    )
    await wd_store.scheduler.cancel(w)


@pytest.mark.parametrize("kind", ["done", "later", "now"])
async def test_two_takes_whose_visibilities_end_together_get_different_receipts(wd_store: Store, kind: str) -> None:
    # the first take hides the workflow until t + 3u; a wakeup at t + u makes it due again, and a
    # second take then hides it for 2u: until t + 3u too, on a clock the suite moves. A receipt that
    # is the hidden-until time alone would be equal for both, and the first holder's late answer
    # would act on the second's delivery
    u, w = unit(wd_store), wf(f"coincide-{kind}")
    log = Takes(wd_store)
    await log.schedule(w)
    first = await log.take("first", 3 * u)
    assert first is not None and first.workflow == w, f"the scheduled workflow was not taken{log}"
    await log.advance(u)
    await log.schedule(w)  # a wakeup while the first take holds it: due now
    second = await log.take("second", 2 * u)
    assert second is not None and second.workflow == w, f"a wakeup while held did not make it due{log}"
    assert second.receipt != first.receipt, f"two takes hidden until the same time got equal receipts{log}"
    await log.answer("first", first, kind)  # stale: the second take superseded it
    stray = await log.take("after the stale answer", 2 * u)
    assert stray is None, f"a stale answer ({kind}) made the workflow the second take holds visible{log}"
    await log.answer("second", second, "now")
    third = await log.take("third", LONG)
    assert third is not None and third.workflow == w, (
        f"the second holder's answer found nothing to act on: the stale answer ({kind}) acted on it{log}"
    )
    await wd_store.scheduler.cancel(w)


async def test_schedule_twice_then_take_twice_gives_one_delivery(wd_store: Store) -> None:
    w = wf("twice")
    log = Takes(wd_store)
    await log.schedule(w)
    await log.schedule(w)
    first = await log.take("first", LONG)
    assert first is not None and first.workflow == w, f"the scheduled workflow was not taken{log}"
    second = await log.take("second", LONG)
    assert second is None, f"two schedules of one workflow queued two deliveries: one entry per workflow{log}"
    await log.answer("first", first, "done")
    assert await log.take("after done", LONG) is None, f"a second entry of the workflow was left behind{log}"


@pytest.mark.parametrize("kind", ["done", "later", "now"])
async def test_a_wakeup_while_held_survives_each_answer_kind(wd_store: Store, kind: str) -> None:
    w = wf(f"held-{kind}")
    log = Takes(wd_store)
    await log.schedule(w)
    got = await log.take("held", LONG)
    assert got is not None and got.workflow == w, f"the scheduled workflow was not taken{log}"
    await log.schedule(w)  # a wakeup while the delivery is held
    await log.answer("held", got, kind)
    again = await log.take("again", LONG)
    assert again is not None and again.workflow == w, (
        f"the holder's answer ({kind}) dropped a wakeup that arrived while it held the delivery{log}"
    )
    await wd_store.scheduler.wake_at(again, None)


async def test_answering_one_delivery_leaves_one_taken_with_it_alone(wd_store: Store) -> None:
    # two takes at one instant of a fake clock set one visibility time: only the workflow tells
    # the two queue entries apart when one of them is answered
    u, sched = unit(wd_store), wd_store.scheduler
    for answer in ("done", "later"):
        pair = {wf(f"pair-{answer}"), wf(f"pair-{answer}")}
        for w in sorted(pair):
            await sched.schedule(w)
        first, second = await sched.take(u), await sched.take(u)
        assert first is not None and second is not None and {first.workflow, second.workflow} == pair
        await sched.wake_at(first, None if answer == "done" else await wd_store.now() + LONG)
        await wd_store.clock.advance(1.5 * u)
        again = await sched.take(LONG)
        assert again is not None and again.workflow == second.workflow, (
            f"answering {first.workflow} ({answer}) changed {second.workflow}, taken with it"
        )
        await sched.wake_at(again, None)


# -- the durable transitions -----------------------------------------------------------------


async def test_arrive_records_and_schedules(wd_store: Store) -> None:
    w = wf("arrive")
    assert await wd_store.durable.arrive(w, "approval", {"ok": True}) == Recorded({"ok": True}, True)
    assert await wd_store.durable.arrive(w, "approval", {"ok": False}) == Recorded({"ok": True}, False)
    got = await wd_store.scheduler.take(LONG)
    assert got is not None and got.workflow == w
    assert await wd_store.checkpointer.load(w) == {"approval": {"ok": True}}


async def test_deliver_appends_and_schedules(wd_store: Store) -> None:
    w = wf("deliver")
    k1 = await wd_store.durable.deliver(w, "hello")
    k2 = await wd_store.durable.deliver(w, "again")
    assert k1 < k2 and k1.startswith(INBOX_PREFIX)
    got = await wd_store.scheduler.take(LONG)
    assert got is not None and got.workflow == w
    assert await wd_store.checkpointer.load(w) == {k1: "hello", k2: "again"}


async def test_durable_discard_forgets_fences_and_cancels(wd_store: Store) -> None:
    w = wf("durable-discard")
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.durable.arrive(w, "a", 1)
    await wd_store.durable.discard(w)
    assert await wd_store.checkpointer.load(w) == {}
    assert await wd_store.scheduler.take(LONG) is None, "discard left the workflow queued"
    with pytest.raises(Fenced):
        await wd_store.checkpointer.record(held, "b", 2)


# -- hardening: inputs past a store's limits, and fuzzed inputs ------------------------------------
# Bad input of any shape is the library's InvalidInput naming the limit, never a raw Python error,
# and a refused call leaves what was stored as it was.

_CENTURY_AND_MORE = (timedelta.max, timedelta(days=365 * 300), timedelta(days=365 * 100 + 1))


async def test_durations_past_a_century_are_refused_naming_the_limit(wd_store: Store) -> None:
    w = wf("century")
    for too_long in _CENTURY_AND_MORE:
        with pytest.raises(InvalidInput, match="century"):
            await wd_store.checkpointer.claim(w, alive=too_long, budget=LONG)
        with pytest.raises(InvalidInput, match="century"):
            await wd_store.checkpointer.claim(w, alive=LONG, budget=too_long)
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)  # nothing was claimed
    await wd_store.scheduler.schedule(w)
    for too_long in _CENTURY_AND_MORE:
        with pytest.raises(InvalidInput, match="century"):
            await wd_store.scheduler.take(too_long)
    got = await wd_store.scheduler.take(LONG)
    assert got is not None and got.workflow == w, f"a refused take hid the workflow: {got!r}"
    again = await wd_store.scheduler.take(LONG)
    assert again is None, f"a delivery taken for an hour was handed out again at once: {again!r}"
    await wd_store.checkpointer.release(held)


async def test_lone_surrogates_in_ids_and_keys_are_refused(wd_store: Store) -> None:
    w = wf("surrogate")
    await wd_store.checkpointer.supply(w, "kept", 1)
    for bad in ("\ud800", "a\udfffb"):
        with pytest.raises(InvalidInput, match="surrogate"):
            await wd_store.checkpointer.claim(bad, alive=LONG, budget=LONG)
        with pytest.raises(InvalidInput, match="surrogate"):
            await wd_store.checkpointer.supply(bad, "k", 1)
        with pytest.raises(InvalidInput, match="surrogate"):
            await wd_store.checkpointer.supply(w, bad, 1)
        with pytest.raises(InvalidInput, match="surrogate"):
            await wd_store.checkpointer.append(bad, 1)
        with pytest.raises(InvalidInput, match="surrogate"):
            await wd_store.checkpointer.load(bad)
        with pytest.raises(InvalidInput, match="surrogate"):
            await wd_store.scheduler.schedule(bad)
        with pytest.raises(InvalidInput, match="surrogate"):
            await wd_store.durable.arrive(w, bad, 1)
    assert await wd_store.checkpointer.load(w) == {"kept": 1}


async def test_values_nested_too_deep_are_refused_naming_the_limit(wd_store: Store) -> None:
    w = wf("deep")
    held = await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    await wd_store.checkpointer.record(held, "kept", 1)
    deep: object = 0
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(InvalidValue, match="levels deep"):
        await wd_store.checkpointer.record(held, "deep", deep)
    with pytest.raises(InvalidValue, match="levels deep"):
        await wd_store.checkpointer.supply(w, "deep", {"d": deep})
    with pytest.raises(InvalidValue, match="levels deep"):
        await wd_store.checkpointer.append(w, deep)
    assert await wd_store.checkpointer.load(w) == {"kept": 1}


async def test_a_pass_no_store_minted_is_refused(wd_store: Store) -> None:
    w = wf("forged")
    await wd_store.checkpointer.claim(w, alive=LONG, budget=LONG)
    for token in (0, -1, 2**63, 2**80, True):
        forged = Pass(w, token)
        with pytest.raises(InvalidInput, match="minted"):
            await wd_store.checkpointer.record(forged, "k", 1)
        with pytest.raises(InvalidInput, match="minted"):
            await wd_store.checkpointer.renew(forged)
        with pytest.raises(InvalidInput, match="minted"):
            await wd_store.checkpointer.release(forged)
    assert await wd_store.checkpointer.load(w) == {}


def test_fuzzed_inputs_raise_only_library_errors_and_store_nothing(
    wd_factory: tuple[Any, Any],
) -> None:
    """Hypothesis over the public API's arguments: each call returns or raises one of the
    library's own errors, and a call refused with ``InvalidInput`` changed no stored record."""
    from .fuzz import check_fuzzed_inputs

    factory, server = wd_factory
    check_fuzzed_inputs(factory, server)


# -- lifecycle (issue 14): waits, fences, terminal states, retries; the tests live in lifecycle.py --

from .lifecycle import *  # noqa: E402, F403


def _mark_async() -> None:
    """Mark every coroutine test for pytest-asyncio here, at definition, so the suite runs whatever
    asyncio mode the importing project uses (strict mode only runs marked tests)."""
    import inspect

    for name, value in list(globals().items()):
        if name.startswith("test_") and inspect.iscoroutinefunction(value):
            globals()[name] = pytest.mark.asyncio(value)


_mark_async()
