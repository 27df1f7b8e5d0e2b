"""The Redis store's own guarantees, beyond the shared conformance suite: order past the hash's
encoding change, tokens across an expired claim hash, LuaEffect exactly once and undone on failure,
cross-slot effects refused, id rules, the stream's blocking-read path, and driver errors wrapped.

Run with ``--wd-store redis-set --wd-store redis-stream --wd-store redis-cluster`` (each test names
the stores it applies to). Every test works under the store's own key prefix, deleted afterwards.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from datetime import timedelta
from typing import Any

import pytest

from without_durability import (
    Fenced,
    InvalidInput,
    InvalidKey,
    InvalidValue,
    InvalidWorkflowId,
    Pass,
    Recorded,
    StoreError,
    StoreUnavailable,
)
from without_durability.testing.harness import StoreUnderTest

redis = pytest.importorskip("redis.asyncio")
from without_durability import Run, SplitDurable, Worker  # noqa: E402
from without_durability.rules import lifecycle_writes  # noqa: E402
from without_durability_redis import (  # noqa: E402
    MAX_WORKFLOW_ID_BYTES,
    LuaEffect,
    LuaEffectFailed,
    RedisCheckpointer,
    RedisSetScheduler,
    RedisStreamScheduler,
)

pytestmark = pytest.mark.asyncio
Store = StoreUnderTest[Any]
LONG = timedelta(hours=1)
CHECKPOINTERS = pytest.mark.wd_store(["redis-set", "redis-cluster"])
_ids = itertools.count()


def wf(label: str) -> str:
    return f"redis-{label}-{next(_ids)}"


def client_of(store: Store) -> Any:
    return store.extra["client"]


def checkpointer_of(store: Store) -> RedisCheckpointer:
    cp = store.checkpointer
    assert isinstance(cp, RedisCheckpointer)
    return cp


async def wait_until(condition: Any, within: float, what: str) -> None:
    """Await ``condition()`` until it is true, polling gently, or fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.05)


def counter(cp: RedisCheckpointer, workflow: str) -> LuaEffect:
    """Add one to a counter under the workflow's tag and return the new count, JSON-encoded."""
    return LuaEffect(
        source="return cjson.encode(redis.call('INCR', KEYS[1]))",
        keys=(f"{cp.hash_key(workflow)}:counter",),
    )


async def read_int(client: Any, key: str) -> int | None:
    value = await client.get(key)
    return None if value is None else int(value)


# -- order survives the hash's conversion ------------------------------------------------------


@CHECKPOINTERS
async def test_order_survives_listpack_to_hashtable_conversion(wd_store: Store) -> None:
    cp, client, w = checkpointer_of(wd_store), client_of(wd_store), wf("order")
    held = await cp.claim(w, alive=LONG, budget=LONG)
    written: list[str] = []
    for i in range(300):  # past hash-max-listpack-entries (128), values past 64 bytes
        key = f"step-{(i * 7919) % 1000:03d}-{i}"  # names that do not sort in record order
        if i % 3 == 0:
            await cp.record(held, key, {"i": i, "pad": "x" * (200 + i)})
        elif i % 3 == 1:
            await cp.supply(w, key, {"i": i, "pad": "y" * 300})
        else:
            key = await cp.append(w, {"i": i, "pad": "z" * 100})
        written.append(key)
    encoding = await client.object("ENCODING", cp.hash_key(w))
    assert encoding in (b"hashtable", "hashtable"), f"expected a hashtable, got {encoding!r}"
    raw = [k.decode() for k in await client.hkeys(cp.hash_key(w))]
    assert raw != written, "the hash kept insertion order by itself: this test would prove nothing"
    loaded = await cp.load(w)
    assert list(loaded) == written, "load order is not the order first recorded"
    assert [v["i"] for v in loaded.values()] == list(range(300))  # type: ignore[index]
    history = await cp.history(w)
    assert [e.key for e in history] == written
    times = [e.written_at for e in history]
    assert times == sorted(times), "written_at does not follow record order"


@CHECKPOINTERS
async def test_append_keys_are_load_positions_with_records_between(wd_store: Store) -> None:
    cp, w = checkpointer_of(wd_store), wf("positions")
    await cp.supply(w, "a", 1)
    first = await cp.append(w, "m")
    await cp.supply(w, "b", 2)
    second = await cp.append(w, "n")
    assert (first, second) == ("inbox/00000000000000000001", "inbox/00000000000000000003")
    assert list(await cp.load(w)) == ["a", first, "b", second]
    await cp.discard(w)
    assert await cp.append(w, "after") == "inbox/00000000000000000000"


# -- tokens --------------------------------------------------------------------------------------


@CHECKPOINTERS
async def test_expired_claim_hash_still_mints_a_higher_token(wd_store: Store) -> None:
    client, w = client_of(wd_store), wf("expired")
    # The store under test's own class (a mutant of it included), with a short TTL.
    cp = type(checkpointer_of(wd_store))(client, prefix=wd_store.extra["prefix"], ttl=timedelta(seconds=1))
    issued = []
    for _ in range(5):  # claims and discards in quick succession: the token runs ahead of nothing
        held = await cp.claim(w, alive=timedelta(milliseconds=100), budget=timedelta(seconds=1))
        issued.append(held.token)
        await cp.discard(w)
    last = await cp.claim(w, alive=timedelta(milliseconds=100), budget=timedelta(milliseconds=200))
    issued.append(last.token)
    await cp.release(last)
    assert issued == sorted(set(issued)), f"tokens not strictly increasing: {issued}"

    async def gone() -> bool:
        return not await client.exists(cp.claim_key(w))

    await wait_until(gone, 10, "the claim hash to expire")
    again = await cp.claim(w, alive=LONG, budget=LONG)
    assert again.token > max(issued), (
        f"a re-created claim hash minted {again.token}, not above the last issued {max(issued)}"
    )
    with pytest.raises(Fenced):
        await cp.record(last, "late", 1)


@CHECKPOINTERS
async def test_a_token_ahead_of_the_clock_is_still_outranked(wd_store: Store) -> None:
    # tokens run ahead of the millisecond clock when claims come faster than one a millisecond;
    # the next claim must still mint above the last, not at the clock's floor or at the last
    client, cp, w = client_of(wd_store), checkpointer_of(wd_store), wf("ahead")
    ahead = (await client.time())[0] * 1000 + 10**9  # seconds -> ms, far ahead of the clock
    await client.hset(cp.claim_key(w), mapping={"token": ahead, "held": 0, "alive": 0, "for": 0})
    held = await cp.claim(w, alive=LONG, budget=LONG)
    assert held.token > ahead, f"a claim minted {held.token}, not above the last token {ahead}"
    with pytest.raises(Fenced):
        await cp.record(Pass(w, ahead), "k", 1)


@CHECKPOINTERS
async def test_a_claim_storm_under_a_short_ttl_never_sees_a_token_again(wd_store: Store) -> None:
    """Claims faster than one a millisecond run the tokens ahead of the server's clock; the claim
    hash must then outlive its TTL until the clock has passed them, or a claim after it expired
    would mint the bare clock, a token already handed out."""
    client, w = client_of(wd_store), wf("storm-ttl")
    cp = type(checkpointer_of(wd_store))(client, prefix=wd_store.extra["prefix"], ttl=timedelta(seconds=1))
    # where a storm of claims faster than one a millisecond leaves a hash: its token 2-3 s ahead
    ahead = (await client.time())[0] * 1000 + 3_000
    await client.hset(cp.claim_key(w), mapping={"token": ahead, "held": 0, "alive": 0, "for": 0})
    last = await cp.claim(w, alive=timedelta(microseconds=1), budget=timedelta(microseconds=1))
    issued = [ahead, last.token]
    assert last.token > ahead
    await asyncio.sleep(1.3)  # past the TTL after the last claim, short of the clock reaching the tokens
    again = await cp.claim(w, alive=LONG, budget=LONG)
    assert again.token > max(issued), (
        f"a claim after the TTL minted {again.token}, not above {max(issued)} already handed out"
    )
    with pytest.raises(Fenced):
        await cp.record(last, "stale", 1)


@CHECKPOINTERS
async def test_a_claim_hash_ahead_of_the_clock_lives_past_its_tokens_millisecond(wd_store: Store) -> None:
    """The hash must still exist in the millisecond its token names: Redis expires a key once its
    clock is past the expiry time, so an expiry at the token's millisecond or later means a claim
    on a re-created hash reads a clock above the token. One millisecond less, and a script whose
    ``TIME`` read the next millisecond after its start (Redis freezes a script's expiry clock at its
    start) arms the hash to expire a millisecond early, when the clock mints that token again.
    Read on Redis's own expiry clock (``PEXPIRETIME``), over claims at different moments: never
    short of the token, and past it whenever the script's clock and ``TIME`` agree."""
    client, w = client_of(wd_store), wf("expiry-past-token")
    cp = type(checkpointer_of(wd_store))(client, prefix=wd_store.extra["prefix"], ttl=timedelta(seconds=1))
    margins = []
    for _ in range(20):
        seconds, micros = await client.time()
        ahead = seconds * 1000 + micros // 1000 + 3_000  # where a storm of claims leaves a token
        await client.delete(cp.claim_key(w))
        await client.hset(cp.claim_key(w), mapping={"token": ahead, "held": 0, "alive": 0, "for": 0})
        held = await cp.claim(w, alive=timedelta(microseconds=1), budget=timedelta(microseconds=1))
        margins.append(await client.pexpiretime(cp.claim_key(w)) - held.token)
        await asyncio.sleep(0.0003)
    assert min(margins) >= 0, f"the claim hash expires before the millisecond of its token: {margins}"
    assert max(margins) >= 1, f"the claim hash never outlives its token's millisecond: {margins}"


@CHECKPOINTERS
async def test_a_cancelled_call_raises_cancelled_even_when_its_reply_arrived(wd_store: Store) -> None:
    """A caller that cancels a call must see ``CancelledError`` (the outcome is then unknown),
    never the call going on as if nothing happened: redis-py's ``wait_for`` on Python 3.11 hands
    back the reply when the cancel lands as it arrives."""
    cp, w = checkpointer_of(wd_store), wf("cancelled")
    held = await cp.claim(w, alive=LONG, budget=LONG)
    rng = random.Random(29)
    swallowed = cancelled = 0
    for i in range(200):
        call = asyncio.ensure_future(cp.renew(held) if i % 2 else cp.load(w))
        await asyncio.sleep(rng.choice([0, 0, 0.0001, 0.0003, 0.001]))
        if not call.cancel():
            continue  # it had finished: no cancel was asked for
        cancelled += 1
        try:
            await call
        except asyncio.CancelledError:
            pass
        else:
            swallowed += 1
    assert cancelled, "no cancel landed while a call was in flight: this shows nothing"
    assert swallowed == 0, f"{swallowed} of {cancelled} cancelled calls returned as if not cancelled"


@CHECKPOINTERS
async def test_records_expire_only_once_the_workflow_is_terminal(wd_store: Store) -> None:
    client = client_of(wd_store)
    cp = type(checkpointer_of(wd_store))(client, prefix=wd_store.extra["prefix"], ttl=timedelta(seconds=60))
    w = wf("ttl")
    held = await cp.claim(w, alive=timedelta(seconds=30), budget=timedelta(seconds=600))
    claim_ttl = await client.pttl(cp.claim_key(w))
    assert claim_ttl > 600_000, f"the claim may expire before its budget: PTTL {claim_ttl}"
    await cp.record(held, "k", 1)
    await cp.renew(held)
    await cp.supply(w, "j", 2)
    await cp.append(w, "m")
    assert await client.pttl(cp.hash_key(w)) == -1, "an open workflow's records were given a TTL"
    with lifecycle_writes():
        await cp.record(held, "wd/finished", "done")
    records_ttl = await client.pttl(cp.hash_key(w))
    assert records_ttl > 600_000, f"a finished record under a live pass may expire: PTTL {records_ttl}"
    await client.pexpire(cp.hash_key(w), 5_000)
    await cp.supply(w, "late", 3)
    assert await client.pttl(cp.hash_key(w)) > 5_000, "a write did not extend the retention"
    failed = wf("ttl-failed")
    held = await cp.claim(failed, alive=timedelta(seconds=30), budget=timedelta(seconds=1))
    with lifecycle_writes():
        await cp.record(held, "wd/failed/0", {"attempts": 1})
        assert 0 < await client.pttl(cp.hash_key(failed)) <= 61_000, "failing did not start the TTL"
        await cp.supply(failed, "wd/rearmed/0", {})
    assert await client.pttl(cp.hash_key(failed)) == -1, "a re-armed workflow's records still expire"


@CHECKPOINTERS
async def test_a_later_write_never_shortens_the_retention_a_pass_set(wd_store: Store) -> None:
    # a pass with a long budget keeps a finished workflow's records at least as long as its claim;
    # a write afterwards, of any kind, may only lengthen that
    client = client_of(wd_store)
    cp = type(checkpointer_of(wd_store))(client, prefix=wd_store.extra["prefix"], ttl=timedelta(seconds=60))
    w = wf("ttl-longest")
    held = await cp.claim(w, alive=timedelta(seconds=30), budget=timedelta(seconds=600))
    with lifecycle_writes():
        await cp.record(held, "wd/finished", "done")
    assert await client.pttl(cp.hash_key(w)) > 600_000
    await cp.supply(w, "late", 3)
    await cp.append(w, "m")
    with lifecycle_writes():
        await cp.supply(w, "wd/finished", "done")
    records_ttl = await client.pttl(cp.hash_key(w))
    assert records_ttl > 600_000, f"a later write shortened the retention to {records_ttl} ms"


@pytest.mark.wd_store("redis-set")
async def test_a_sleep_past_the_ttl_does_not_restart_the_workflow(wd_store: Store) -> None:
    client, w = client_of(wd_store), wf("sleep-past-ttl")
    cp = type(checkpointer_of(wd_store))(client, prefix=wd_store.extra["prefix"], ttl=timedelta(seconds=1))
    durable = SplitDurable(cp, wd_store.scheduler)
    effect = counter(cp, w)

    async def body(run: Run[Any]) -> object:
        await run.transact("reserve", effect, int)
        await run.sleep("nap", timedelta(seconds=4))
        return "woke"

    worker = Worker(
        durable,
        body,
        alive=timedelta(seconds=1),
        budget=timedelta(seconds=1),
        visibility=timedelta(seconds=30),
        poll_interval=timedelta(milliseconds=50),
    )
    await durable.scheduler.schedule(w)
    try:
        async with asyncio.timeout(20):  # the sleep's wakeup outlives the records' old TTL by far
            while "wd/finished" not in await cp.load(w):
                if not await worker.run_once():
                    await asyncio.sleep(0.05)
    except TimeoutError:
        ran = await read_int(client, effect.keys[0])
        pytest.fail(f"the workflow never finished; its exactly-once effect ran {ran} times")
    assert await read_int(client, effect.keys[0]) == 1, "the exactly-once effect ran again after the TTL"
    assert (await cp.load(w))["wd/finished"] == "woke"


# -- LuaEffect: exactly once, undone on failure ----------------------------------------------------


@CHECKPOINTERS
async def test_lua_effect_moves_once_across_ten_resumed_passes(wd_store: Store) -> None:
    cp, client, w = checkpointer_of(wd_store), client_of(wd_store), wf("ten")
    effect = counter(cp, w)
    seen = []
    for attempt in range(10):
        # A pass resumes: it claims, loads what earlier passes recorded, runs the body again.
        held = await cp.claim(w, alive=LONG, budget=LONG)
        loaded = await cp.load(w)
        result = await cp.transact(held, "reserved", effect)
        seen.append(result)
        assert loaded == ({} if attempt == 0 else {"reserved": 1})
        if attempt % 2:
            await cp.release(held)
        else:  # every other pass dies without releasing: a newer claim supersedes it
            await client.hset(cp.claim_key(w), "alive", 0)
    assert await read_int(client, effect.keys[0]) == 1, "the counter moved more than once"
    assert seen[0] == Recorded(1, True)
    assert all(r == Recorded(1, False) for r in seen[1:]), f"later passes saw {seen[1:]}"


@CHECKPOINTERS
async def test_failing_effects_are_undone_and_reported(wd_store: Store) -> None:
    cp, client, w = checkpointer_of(wd_store), client_of(wd_store), wf("undo")
    base = cp.hash_key(w)
    await client.set(f"{base}:kept", "before", px=600_000)
    held = await cp.claim(w, alive=LONG, budget=LONG)
    writes = (
        "redis.call('SET', KEYS[1], 'after'); redis.call('SET', KEYS[2], 'new'); "
        "redis.call('PERSIST', KEYS[1]); "
    )
    keys = (f"{base}:kept", f"{base}:fresh")
    failures = {
        "error()": "error('out of stock')",
        "error_reply": "return redis.error_reply('OUT_OF_STOCK none left')",
        "a failing call": "redis.call('INCR', KEYS[1])",  # INCR on 'after' is not an integer
    }
    for label, tail in failures.items():
        with pytest.raises(LuaEffectFailed) as caught:
            await cp.transact(held, "reserve", LuaEffect(writes + tail, keys))
        assert caught.value.key == "reserve", label
        assert await client.get(f"{base}:kept") == b"before", f"{label}: a changed key not restored"
        assert await client.pttl(f"{base}:kept") > 0, f"{label}: the key's TTL was not restored"
        assert not await client.exists(f"{base}:fresh"), f"{label}: a created key was kept"
    assert await cp.load(w) == {}

    class OutOfStock(Exception):
        pass

    with pytest.raises(OutOfStock, match="OUT_OF_STOCK"):
        await cp.transact(
            held, "reserve", LuaEffect(writes + failures["error_reply"], keys, on_error=OutOfStock)
        )
    for label, body, err in (
        ("a number", "return 5", InvalidValue),
        ("a table", "return {1, 2}", InvalidValue),
        ("not JSON", "return 'five'", InvalidValue),
        ("a syntax error", "return (", InvalidInput),
    ):
        with pytest.raises(err):
            await cp.transact(held, "reserve", LuaEffect(writes + body, keys))
        assert await client.get(f"{base}:kept") == b"before", label
        assert not await client.exists(f"{base}:fresh"), label
    assert await cp.load(w) == {}
    ok = await cp.transact(held, "reserve", LuaEffect(writes + "return cjson.encode('done')", keys))
    assert ok == Recorded("done", True)
    assert await client.get(f"{base}:kept") == b"after"


@CHECKPOINTERS
async def test_an_effect_result_of_exactly_the_limit_is_recorded(wd_store: Store) -> None:
    client, w = client_of(wd_store), wf("limit")
    cp = type(checkpointer_of(wd_store))(client, prefix=wd_store.extra["prefix"], max_value_bytes=16)
    held = await cp.claim(w, alive=LONG, budget=LONG)
    exactly = '"' + "x" * 14 + '"'  # 16 bytes of JSON
    got = await cp.transact(held, "at-limit", LuaEffect(f"return '{exactly}'", ()))
    assert got == Recorded("x" * 14, True)
    with pytest.raises(InvalidValue):
        await cp.transact(held, "over-limit", LuaEffect(f"return '{exactly} '", ()))


class _Prefixed:
    """A codec whose encodings are not JSON: the script must not parse an effect's result as JSON."""

    def encode(self, value: object) -> str:
        return "v1:" + json.dumps(value, sort_keys=True, separators=(",", ":"))

    def decode(self, encoded: str) -> object:
        return json.loads(encoded.removeprefix("v1:"))


@CHECKPOINTERS
async def test_an_effect_result_in_a_codec_that_is_not_json_is_recorded(wd_store: Store) -> None:
    client, w = client_of(wd_store), wf("not-json")
    cp = type(checkpointer_of(wd_store))(client, prefix=wd_store.extra["prefix"], codec=_Prefixed())
    held = await cp.claim(w, alive=LONG, budget=LONG)
    assert await cp.transact(held, "k", LuaEffect("return 'v1:5'", ())) == Recorded(5, True)


@CHECKPOINTERS
async def test_effect_keys_must_carry_the_workflows_tag(wd_store: Store) -> None:
    cp, client, w = checkpointer_of(wd_store), client_of(wd_store), wf("tag")
    held = await cp.claim(w, alive=LONG, budget=LONG)
    stray = f"{wd_store.extra['prefix']}{{elsewhere}}:ledger"
    effect = LuaEffect("redis.call('SET', KEYS[1], 1); return cjson.encode(1)", (stray,))
    with pytest.raises(InvalidKey) as caught:
        await cp.transact(held, "reserve", effect)
    message = str(caught.value)
    assert stray in message and f"{{{w}}}" in message and "hash_key" in message, message
    assert not await client.exists(stray), "a refused effect wrote"
    assert await cp.load(w) == {}
    for own in (cp.hash_key(w), cp.claim_key(w)):
        with pytest.raises(InvalidKey, match="own"):
            await cp.transact(held, "reserve", LuaEffect("return '1'", (own,)))


@pytest.mark.wd_store(["redis-cluster"])
async def test_cross_slot_effect_is_refused_on_the_cluster_having_written_nothing(
    wd_store: Store,
) -> None:
    cp, client, w = checkpointer_of(wd_store), client_of(wd_store), wf("cluster")
    held = await cp.claim(w, alive=LONG, budget=LONG)
    mine = f"{cp.hash_key(w)}:ledger"
    # A key on another node than the workflow's slot.
    home = client.get_node_from_key(mine)
    other = next(
        key
        for key in (f"{wd_store.extra['prefix']}{{far-{i}}}:ledger" for i in range(1000))
        if client.get_node_from_key(key) != home
    )
    declared = LuaEffect(
        "redis.call('SET', KEYS[1], 1); redis.call('SET', KEYS[2], 1); return cjson.encode(1)", (mine, other)
    )
    with pytest.raises(InvalidKey, match="does not carry the workflow's hash tag"):
        await cp.transact(held, "reserve", declared)
    # The same effect reaching the other node's key without declaring it: the node refuses the
    # access mid-script, and the write it had already made to its declared key is undone.
    undeclared = LuaEffect(
        "redis.call('SET', KEYS[1], 1); redis.call('SET', ARGV[1], 1); return cjson.encode(1)",
        (mine,),
        (other,),
    )
    with pytest.raises(LuaEffectFailed, match="non local key"):
        await cp.transact(held, "reserve", undeclared)
    assert not await client.exists(mine), "the effect's write survived its failure"
    assert not await client.exists(other), "a cross-node write landed"
    assert await cp.load(w) == {}


# -- ids -----------------------------------------------------------------------------------------


@CHECKPOINTERS
async def test_ids_with_braces_or_too_long_are_refused_clearly(wd_store: Store) -> None:
    cp = checkpointer_of(wd_store)
    for bad in ("a{b}", "}", "x" * (MAX_WORKFLOW_ID_BYTES + 1)):
        with pytest.raises(InvalidWorkflowId, match=r"brace|bytes"):
            await cp.claim(bad, alive=LONG, budget=LONG)
        with pytest.raises(InvalidWorkflowId):
            await cp.supply(bad, "k", 1)
        with pytest.raises(InvalidWorkflowId):
            await wd_store.scheduler.schedule(bad)
    ok = "é" * (MAX_WORKFLOW_ID_BYTES // 2)  # exactly the limit in UTF-8 bytes
    assert await cp.supply(ok, "k", 1) == Recorded(1, True)
    with pytest.raises(InvalidInput, match="brace"):
        RedisCheckpointer(client_of(wd_store), prefix="wd:{x}:")


# -- clients and errors ----------------------------------------------------------------------------


@pytest.mark.wd_store(["redis-set"])
async def test_a_decoding_client_works_too(wd_store: Store) -> None:
    server = wd_store.extra["server"]
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        prefix = wd_store.extra["prefix"]
        cp = RedisCheckpointer(client, prefix=prefix)
        sched = RedisSetScheduler(client, prefix=prefix, namespace="decoding")
        w = wf("decode")
        held = await cp.claim(w, alive=LONG, budget=LONG)
        assert await cp.record(held, "k", [1, "é"]) == Recorded([1, "é"], True)
        assert await cp.supply(w, "k", 2) == Recorded([1, "é"], False)
        await cp.append(w, {"m": 1})
        assert await cp.transact(held, "t", counter(cp, w)) == Recorded(1, True)
        assert list(await cp.load(w)) == ["k", "inbox/00000000000000000001", "t"]
        await sched.schedule(w)
        got = await sched.take(LONG)
        assert got is not None and got.workflow == w
        stream = RedisStreamScheduler(client, prefix=prefix, namespace="decoding")
        assert await stream.take(LONG) is None
        await stream.schedule(w)
        await stream.wait(timedelta(seconds=5))
        got = await stream.take(LONG)
        assert got is not None and got.workflow == w
        await stream.wake_at(got, None)
        assert (await stream.now()).tzinfo is not None
    finally:
        await client.aclose()


async def test_an_unreachable_server_is_store_unavailable() -> None:
    from without_durability.testing.servers import free_port

    client = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=1)
    try:
        cp = RedisCheckpointer(client)
        with pytest.raises(StoreUnavailable, match=r"127\.0\.0\.1") as caught:
            await cp.supply("w", "k", 1)
        assert caught.value.__cause__ is not None
        with pytest.raises(StoreUnavailable):
            await RedisSetScheduler(client).take(LONG)
    finally:
        await client.aclose()


@CHECKPOINTERS
async def test_a_foreign_encoding_is_a_store_error_naming_the_key(wd_store: Store) -> None:
    cp, client, w = checkpointer_of(wd_store), client_of(wd_store), wf("foreign")
    await client.hset(cp.hash_key(w), "k", "0:0:not json")
    with pytest.raises(StoreError, match="'k'"):
        await cp.load(w)


# -- the stream scheduler ------------------------------------------------------------------------


STREAMS = pytest.mark.wd_store(["redis-stream", "redis-cluster-stream"])


def stream_of(store: Store) -> RedisStreamScheduler:
    sched = store.scheduler
    assert isinstance(sched, RedisStreamScheduler)
    return sched


@STREAMS
async def test_stream_wait_wakes_for_a_schedule_not_the_poll_interval(wd_store: Store) -> None:
    sched, w = stream_of(wd_store), wf("wake")
    assert await sched.take(LONG) is None

    async def later() -> None:
        await asyncio.sleep(0.3)
        await sched.schedule(w)

    started = time.monotonic()
    arrival = asyncio.create_task(later())
    await sched.wait(timedelta(seconds=20))
    waited = time.monotonic() - started
    await arrival
    assert 0.25 < waited < 5, f"wait returned after {waited:.2f}s for a schedule made at 0.3s"
    got = await sched.take(LONG)
    assert got is not None and got.workflow == w


@STREAMS
async def test_stream_wait_sees_work_that_arrived_since_the_empty_take(wd_store: Store) -> None:
    sched, w = stream_of(wd_store), wf("gap")
    assert await sched.take(LONG) is None
    await sched.schedule(w)  # between the empty take and the wait
    started = time.monotonic()
    await sched.wait(timedelta(seconds=20))
    assert time.monotonic() - started < 5, "wait slept through work queued after the empty take"


@STREAMS
async def test_stream_wait_wakes_when_a_timer_falls_due(wd_store: Store) -> None:
    sched, w = stream_of(wd_store), wf("timer")
    await sched.schedule(w, await sched.now() + timedelta(milliseconds=400))
    assert await sched.take(LONG) is None
    started = time.monotonic()
    await sched.wait(timedelta(seconds=20))
    waited = time.monotonic() - started
    assert 0.2 < waited < 5, f"wait returned after {waited:.2f}s for a timer due at 0.4s"
    got = await sched.take(LONG)
    assert got is not None and got.workflow == w
    started = time.monotonic()
    assert await sched.take(LONG) is None
    await sched.wait(timedelta(milliseconds=300))  # the next timer is the delivery's, an hour out
    assert 0.25 < time.monotonic() - started < 5, "wait did not keep to at_most"


@STREAMS
async def test_stream_keeps_itself_short(wd_store: Store) -> None:
    sched, client = stream_of(wd_store), client_of(wd_store)
    ws = [wf("short") for _ in range(5)]
    for w in ws:
        await sched.schedule(w)
    seen = []
    while (d := await sched.take(LONG)) is not None:
        seen.append(d.workflow)
        await sched.wake_at(d, None)
    assert sorted(seen) == sorted(ws)
    assert await client.xlen(sched.stream_key) == 0, "answered entries stayed in the stream"
    pending = await client.xpending(sched.stream_key, "wd")
    assert pending["pending"] == 0, f"answered deliveries stayed pending: {pending}"
    assert await client.hlen(sched.entries_key) == 0 and await client.zcard(sched.timers_key) == 0


@STREAMS
async def test_stream_redelivery_and_a_wakeup_while_held_leave_one_entry(wd_store: Store) -> None:
    """A redelivery (the take's visibility ran out) and a wakeup of a held workflow each make a
    fresh entry: the older one must go, or the stream and its pending list grow by one entry per
    redelivery for ever (a second queue entry per workflow)."""
    sched, client, w = stream_of(wd_store), client_of(wd_store), wf("again")
    await sched.schedule(w)
    first = await sched.take(timedelta(milliseconds=50))
    assert first is not None
    await asyncio.sleep(0.1)
    again = await sched.take(LONG)  # the first take's visibility ran out: redelivered
    assert again is not None and again.workflow == w
    await sched.schedule(w)  # a wakeup while the redelivery is held
    await asyncio.sleep(0.01)
    entries = await client.xrange(sched.stream_key, "-", "+")
    assert len(entries) == 1, f"{len(entries)} stream entries for one workflow: {entries}"
    third = await sched.take(LONG)  # the wakeup, visible at once
    assert third is not None and third.workflow == w
    await sched.wake_at(third, None)
    assert await client.xlen(sched.stream_key) == 0, "a finished workflow left entries in the stream"
    pending = await client.xpending(sched.stream_key, "wd")
    assert pending["pending"] == 0, f"superseded deliveries stayed pending: {pending}"


@STREAMS
async def test_stream_cancel_drops_the_pending_entry(wd_store: Store) -> None:
    sched, client, w = stream_of(wd_store), client_of(wd_store), wf("cancel")
    await sched.schedule(w)
    got = await sched.take(LONG)
    assert got is not None
    assert (await client.xpending(sched.stream_key, "wd"))["pending"] == 1
    await sched.cancel(w)
    assert (await client.xpending(sched.stream_key, "wd"))["pending"] == 0
    await sched.wake_at(got, await sched.now())
    assert await sched.take(LONG) is None, "wake_at reinstated a cancelled delivery"
    assert not await client.hexists(sched.entries_key, w)


# -- the factories clean up after themselves -------------------------------------------------------


@pytest.mark.wd_store(["redis-set", "redis-stream", "redis-cluster", "redis-cluster-stream"])
async def test_a_store_under_test_deletes_exactly_its_own_keys(wd_factory: Any) -> None:
    from without_durability_redis.kit import delete_prefix

    factory, server = wd_factory
    async with factory.open(server) as store:
        client, prefix = client_of(store), store.extra["prefix"]
        bystander = f"bystander-{next(_ids)}"
        await client.set(bystander, "keep")  # stands for a WD_REDIS_URL server's own data
        for i in range(6):  # several workflows, so a cluster spreads them over its nodes
            w = wf(f"clean{i}")
            held = await store.checkpointer.claim(w, alive=LONG, budget=LONG)
            await store.checkpointer.transact(held, "t", store.effects.ledger_add(w, 1))
            await store.durable.deliver(w, "m")
        assert [k async for k in client.scan_iter(match=f"{prefix}*")], "nothing was written"
    check = type(client).from_url(server.url)
    try:
        left = [k async for k in check.scan_iter(match=f"{prefix}*")]
        assert left == [], f"keys left behind under {prefix}: {left}"
        assert await check.get(bystander) == b"keep", "cleanup touched a key outside its prefix"
    finally:
        await delete_prefix(check, bystander)
        await check.aclose()


# -- mutants: a broken script can be swapped in, and is noticed ------------------------------------


@CHECKPOINTERS
async def test_a_mutant_without_the_fence_in_record_lets_a_stale_pass_write(wd_store: Store) -> None:
    from without_durability_redis import script_source

    fence = "if redis.call('HGET', KEYS[2], 'token') ~= ARGV[1] then\n  return {'fenced'}\nend"
    assert fence in script_source("record"), "the RECORD script no longer reads as this test expects"

    class Unfenced(RedisCheckpointer):
        script_overrides = {"record": script_source("record").replace(fence, "")}  # noqa: RUF012

    real = checkpointer_of(wd_store)
    mutant = Unfenced(client_of(wd_store), prefix=wd_store.extra["prefix"])
    w = wf("mutant")
    old = await real.claim(w, alive=LONG, budget=LONG)
    await real.release(old)
    await real.claim(w, alive=LONG, budget=LONG)
    with pytest.raises(Fenced):
        await real.record(old, "stale", 1)
    assert await mutant.record(old, "stale", 1) == Recorded(1, True), "the mutant kept the fence"


# -- a script the driver re-sends after a lost reply -------------------------------------------


@CHECKPOINTERS
async def test_a_resent_claim_append_or_transact_lands_once(wd_store: Store) -> None:
    # redis-py re-sends a command whose connection failed (3 retries by default), so a script can
    # run twice for one call. Run each the way a re-send would: the same arguments, twice.
    cp, client, w = checkpointer_of(wd_store), client_of(wd_store), wf("resent")
    ttl = int(cp.ttl.total_seconds() * 1000)
    claim_args = [3_600_000_000, 3_600_000_000, ttl, "nonce-1"]
    first = await cp._scripts.run("claim", [cp.claim_key(w)], claim_args)
    again = await cp._scripts.run("claim", [cp.claim_key(w)], claim_args)
    assert first == again and first[0] == b"ok", f"a re-sent claim got {again}, not {first}"
    other = await cp._scripts.run("claim", [cp.claim_key(w)], [*claim_args[:3], "nonce-2"])
    assert other == [b"contended"], f"another caller's claim got {other}"

    keys = [cp.hash_key(w), cp._nonces_key(w)]
    append_args = ['"m"', "inbox/", 20, ttl, "nonce-3"]
    key = await cp._scripts.run("append", keys, append_args)
    assert await cp._scripts.run("append", keys, append_args) == key
    assert await cp.load(w) == {key.decode(): "m"}, "a re-sent append appended twice"
    await cp.discard(w)  # lapses the claim the re-sent script holds
    held = await cp.claim(w, alive=LONG, budget=LONG)
    effect = counter(cp, w)
    text = cp._scripts.source("transact").replace("--[[effect]]", effect.source, 1)
    keys = [cp.hash_key(w), cp.claim_key(w), cp._nonces_key(w), *effect.keys]
    args = [held.token, "t", cp.max_value_bytes, ttl, "1", "nonce-4"]
    assert await cp._scripts.run_source(text, keys, args) == [b"ok", b"1"]
    resent = await cp._scripts.run_source(text, keys, args)
    assert resent == [b"ok", b"1"], f"a re-sent transact no longer knew it was its own: {resent}"
    assert await cp._scripts.run_source(text, keys, [*args[:5], "nonce-5"]) == [b"recorded", b"1"]
    assert await read_int(client, effect.keys[0]) == 1
    await cp.discard(w)
    assert not await client.exists(cp._nonces_key(w)), "discard left the nonces"


@CHECKPOINTERS
async def test_a_workflow_resumed_ten_times_moves_its_counter_once(wd_store: Store) -> None:
    from without_durability.run import Blocked, Finished, resume

    cp, client, w = checkpointer_of(wd_store), client_of(wd_store), wf("resume")
    effect = counter(cp, w)

    async def body(run: Run[LuaEffect]) -> object:
        reserved = await run.transact("reserved", effect, int)
        approval = await run.awaiting("approval", str)
        return (reserved, approval)

    outcomes = []
    for attempt in range(10):
        if attempt == 9:
            await wd_store.durable.arrive(w, "approval", "yes")
        held = await cp.claim(w, alive=LONG, budget=LONG)
        outcomes.append(await resume(wd_store.durable, held, body))
        await cp.release(held)
    assert all(isinstance(o, Blocked) for o in outcomes[:9]), outcomes
    assert outcomes[9] == Finished((1, "yes")), outcomes[9]
    assert await read_int(client, effect.keys[0]) == 1, "the counter moved more than once"
