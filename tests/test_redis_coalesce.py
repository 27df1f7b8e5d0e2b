"""The Redis checkpointer's concurrent calls sent together (one pipeline per turn of the event loop),
and the adversary that optimization ships with: a caller cancelled before its batch is written sends
nothing, even while the batch waits for a connection; one cancelled after raises ``CancelledError``
and its call lands whole or not at all; a call the server refuses fails only itself; hundreds at
once lose nothing. Each runs both ways a batch can go out (packed by hiredis on a pooled
connection, or through redis-py's pipeline). Run with ``--wd-store redis-set``."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from without_durability import StoreError
from without_durability.rules import INBOX_DIGITS, INBOX_PREFIX
from without_durability.testing.harness import StoreUnderTest

pytest.importorskip("redis.asyncio")
from redis.asyncio import BlockingConnectionPool, Redis

from without_durability_redis import RedisCheckpointer

pytestmark = [pytest.mark.asyncio, pytest.mark.wd_store(["redis-set"])]
Store = StoreUnderTest[Any]
LONG = timedelta(hours=1)
TINY = timedelta(microseconds=1)
WAYS = pytest.mark.parametrize("direct", [True, False], ids=["hiredis-packed", "redis-py-pipeline"])
_ids = itertools.count()


def inbox(n: int) -> str:
    return f"{INBOX_PREFIX}{n:0{INBOX_DIGITS}d}"


def wf(label: str) -> str:
    return f"coalesce-{label}-{next(_ids)}"


def checkpointer(store: Store, client: Any, direct: bool) -> RedisCheckpointer:
    cp = RedisCheckpointer(client, prefix=store.extra["prefix"], warn_persistence=False)
    assert cp._scripts._coalesce, "the checkpointer sends concurrent calls together"
    if not direct:
        cp._scripts._direct = False
    return cp


@pytest.fixture
async def pooled(wd_store: Store) -> AsyncIterator[Redis]:
    client = Redis.from_url(wd_store.extra["server"].url)
    yield client
    await client.aclose()


@pytest.fixture
async def one_connection(wd_store: Store) -> AsyncIterator[Redis]:
    """A client whose pool has one connection and makes a caller wait for it (as an exhausted
    pool of any size does)."""
    pool = BlockingConnectionPool.from_url(wd_store.extra["server"].url, max_connections=1, timeout=None)
    client = Redis(connection_pool=pool)
    yield client
    await client.aclose()


@WAYS
async def test_a_caller_cancelled_while_its_batch_waits_for_a_connection_sends_nothing(
    wd_store: Store, one_connection: Redis, direct: bool
) -> None:
    """Issue 29's first bug in Redis form: the pool's only connection is busy; appends under
    ``wait_for`` become one batch that waits for it; every caller times out. Once the connection
    is free, none of those appends may land (a caller that retries would append twice)."""
    cp, w = checkpointer(wd_store, one_connection, direct), wf("waiting")
    await cp.append(w, "before")  # the scripts are loaded, the persistence read
    held = await one_connection.connection_pool.get_connection()
    try:
        got = await asyncio.gather(
            *(asyncio.wait_for(cp.append(w, f"gave-up-{i}"), 0.3) for i in range(5)), return_exceptions=True
        )
        assert all(isinstance(g, TimeoutError) for g in got), got
    finally:
        await one_connection.connection_pool.release(held)
    assert await cp.append(w, "after") == inbox(1), "a cancelled append took a position"
    assert list((await cp.load(w)).values()) == ["before", "after"]


@WAYS
async def test_a_caller_cancelled_in_the_turn_it_called_sends_nothing(
    wd_store: Store, pooled: Redis, direct: bool
) -> None:
    cp, w = checkpointer(wd_store, pooled, direct), wf("same-turn")
    await cp.append(w, "before")
    calls = [asyncio.ensure_future(cp.append(w, f"kept-{i}")) for i in range(6)]
    dropped = [asyncio.ensure_future(cp.append(w, f"dropped-{i}")) for i in range(6)]
    await asyncio.sleep(0)  # every call has joined the batch, none is written yet
    for call in dropped:
        call.cancel()
    keys = await asyncio.gather(*calls)
    for call in dropped:
        with pytest.raises(asyncio.CancelledError):
            await call
    values = list((await cp.load(w)).values())
    assert sorted(values) == sorted(["before", *(f"kept-{i}" for i in range(6))]), values
    assert sorted(keys) == [inbox(n) for n in range(1, 7)], keys


@WAYS
async def test_a_caller_cancelled_after_its_batch_was_written_gets_cancelled_and_lands_whole(
    wd_store: Store, pooled: Redis, direct: bool
) -> None:
    """The server is inside another client's script: the batch is written and waits for its
    replies; its callers are cancelled. They raise ``CancelledError`` (never a reply), and each
    call either ran whole or not at all: here, with the bytes on the wire, all of them ran."""
    cp, w = checkpointer(wd_store, pooled, direct), wf("written")
    await cp.append(w, "before")
    other = Redis.from_url(wd_store.extra["server"].url)
    spin = (
        "local s = redis.call('TIME') local t0 = s[1] * 1e6 + s[2] "
        "while true do local n = redis.call('TIME') if n[1] * 1e6 + n[2] - t0 > 4e5 then break end end"
    )
    try:
        busy = asyncio.ensure_future(other.eval(spin, 0))
        await asyncio.sleep(0.1)  # the server is inside the script now
        calls = [asyncio.ensure_future(cp.append(w, f"unknown-{i}")) for i in range(4)]
        await asyncio.sleep(0.1)  # written, waiting for the busy server
        for call in calls:
            call.cancel()
        got = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(g, asyncio.CancelledError) for g in got), got
        await busy
    finally:
        await other.aclose()
    after = await cp.append(w, "after")
    values = list((await cp.load(w)).values())
    assert values[0] == "before" and values[-1] == "after", values
    assert sorted(values[1:-1]) == [f"unknown-{i}" for i in range(4)], values
    assert after == inbox(5), after


@WAYS
async def test_a_call_the_server_refuses_fails_only_itself(
    wd_store: Store, pooled: Redis, direct: bool
) -> None:
    """One workflow's keys are of the wrong type (the server refuses every script touching them);
    sent together with valid claims and appends, only its own calls fail."""
    cp = checkpointer(wd_store, pooled, direct)
    bad, good = wf("wrong-type"), [wf("fine") for _ in range(8)]
    await pooled.set(cp.claim_key(bad), "not a hash")
    await pooled.set(cp.hash_key(bad), "not a hash")
    await cp.claim(good[0], alive=LONG, budget=LONG)  # the scripts are loaded
    calls = [
        *(cp.claim(w, alive=LONG, budget=LONG) for w in good[1:]),
        cp.claim(bad, alive=LONG, budget=LONG),
        *(cp.append(w, "m") for w in good),
        cp.append(bad, "m"),
    ]
    got = await asyncio.gather(*calls, return_exceptions=True)
    refused = [got[7], got[16]]
    assert all(isinstance(g, StoreError) and "WRONGTYPE" in str(g) for g in refused), refused
    fine = got[:7] + got[8:16]
    assert not any(isinstance(g, BaseException) for g in fine), fine
    for w in good:
        assert await cp.load(w) == {inbox(0): "m"}


@WAYS
async def test_hundreds_of_calls_at_once_lose_nothing_and_share_few_connections(
    wd_store: Store, pooled: Redis, direct: bool
) -> None:
    cp = checkpointer(wd_store, pooled, direct)
    one, many = wf("appends"), [wf("claims") for _ in range(300)]
    await cp.append(one, "first")
    keys, passes = await asyncio.gather(
        asyncio.gather(*(cp.append(one, i) for i in range(500))),
        asyncio.gather(*(cp.claim(w, alive=LONG, budget=LONG) for w in many)),
    )
    assert sorted(keys) == [inbox(n) for n in range(1, 501)], "an append was lost or doubled"
    loaded = await cp.load(one)
    assert list(loaded) == sorted(loaded), "load order is not append order"
    assert sorted(v for k, v in loaded.items() if k != inbox(0)) == list(range(500))
    assert [p.workflow for p in passes] == many
    made = len(pooled.connection_pool._available_connections) + len(
        pooled.connection_pool._in_use_connections
    )
    assert made <= 8, f"800 concurrent calls took {made} connections: they were not sent together"


@WAYS
async def test_a_claim_burst_runs_tokens_ahead_of_the_clock_and_never_repeats_one(
    wd_store: Store, pooled: Redis, direct: bool
) -> None:
    """Many tasks claiming one workflow with a lease of a microsecond: sent together, claims come
    faster than one a millisecond, so the tokens run ahead of the server's clock; each is distinct
    and they rise in the order the server ran them."""
    cp, w = checkpointer(wd_store, pooled, direct), wf("burst")
    await cp.claim(w, alive=TINY, budget=TINY)
    tokens: list[int] = []

    async def claimer() -> None:
        for _ in range(40):
            tokens.append((await cp.claim(w, alive=TINY, budget=TINY)).token)

    await asyncio.gather(*(claimer() for _ in range(50)))
    now = await pooled.time()
    lead = max(tokens) - (now[0] * 1000 + now[1] // 1000)
    assert len(set(tokens)) == len(tokens) == 2000, "a token was handed out twice"
    if direct:  # as the checkpointer ships: faster than one claim a millisecond
        assert lead > 0, f"2,000 claims sent together never got ahead of the clock ({lead} ms)"
