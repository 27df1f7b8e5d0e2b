"""The Redis schedulers' one-round-trip paths: ``answer_and_take`` (one script that answers a
delivery and takes the next, with the guarantees of ``wake_at`` then ``take``) and the batching
option ``take_many``/``finish_many``. Run with ``--wd-store redis-set --wd-store redis-stream``."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from without_durability import AnswersAndTakes, Delivery
from without_durability.errors import InvalidInput
from without_durability.testing.harness import StoreUnderTest

pytest.importorskip("redis.asyncio")
from without_durability_redis import RedisSetScheduler, RedisStreamScheduler
from without_durability_redis._scripts import text

pytestmark = [pytest.mark.asyncio, pytest.mark.wd_store(["redis-set", "redis-stream"])]

Store = StoreUnderTest[Any]
Sched = RedisSetScheduler | RedisStreamScheduler
LONG = timedelta(hours=1)


def scheduler(store: Store) -> Sched:
    """The store's own scheduler (under a fresh prefix per test)."""
    sched = store.scheduler
    assert isinstance(sched, RedisSetScheduler | RedisStreamScheduler)
    return sched


async def queued(sched: Sched) -> dict[str, float]:
    """What the queue holds: workflow -> the time it becomes visible (microseconds), 0 for a stream
    entry waiting to be read (ready now)."""
    if isinstance(sched, RedisSetScheduler):
        rows = await sched.client.zrange(sched.key, 0, -1, withscores=True)
        return {text(w): s for w, s in rows}
    timers = {text(w): s for w, s in await sched.client.zrange(sched.timers_key, 0, -1, withscores=True)}
    entries = {text(w) for w in await sched.client.hkeys(sched.entries_key)}
    return {w: timers.get(w, 0.0) for w in timers.keys() | entries}


def receipt_time(d: Delivery) -> float:
    r: Any = d.receipt
    return float(r.visible_at if hasattr(r, "visible_at") else r.timer)


async def test_it_is_offered_as_the_optional_capability(wd_store: Store) -> None:
    assert isinstance(scheduler(wd_store), AnswersAndTakes)


async def test_a_due_sleep_answer_is_never_handed_back_but_left_for_the_next_take(wd_store: Store) -> None:
    sched = scheduler(wd_store)
    await sched.schedule("sleeper")
    d = await sched.take(LONG)
    assert d is not None
    past = await sched.now() - timedelta(seconds=5)
    assert await sched.answer_and_take(d, past, LONG) is None, "it must not hand back its own workflow"
    assert "sleeper" in await queued(sched)
    if isinstance(sched, RedisStreamScheduler):
        started = time.monotonic()  # a wait from that empty answer must see the sleeper's entry
        await sched.wait(timedelta(seconds=20))
        assert time.monotonic() - started < 5, "wait slept through the entry the answer made"
    again = await sched.take(LONG)
    assert again is not None and again.workflow == "sleeper", "a due sleep answer is left for the next take"


async def test_a_later_sleep_answer_hides_the_workflow_until_then(wd_store: Store) -> None:
    sched = scheduler(wd_store)
    await sched.schedule("sleeper")
    await sched.schedule("other")
    d = await sched.take(LONG)
    assert d is not None and d.workflow == "sleeper"
    at = await sched.now() + timedelta(minutes=5)
    nxt = await sched.answer_and_take(d, at, LONG)
    assert nxt is not None and nxt.workflow == "other"
    assert (await queued(sched))["sleeper"] == pytest.approx(at.timestamp() * 1e6, abs=1)
    assert await sched.take(LONG) is None, "a sleeping workflow must not be handed out early"


async def test_a_delivery_from_elsewhere_is_refused_before_anything_is_written(wd_store: Store) -> None:
    sched = scheduler(wd_store)
    other: Sched = (RedisStreamScheduler if isinstance(sched, RedisSetScheduler) else RedisSetScheduler)(
        sched.client, namespace=sched.namespace, prefix=sched.prefix + "other:"
    )
    await other.schedule("x")
    d = await other.take(LONG)
    assert d is not None
    before = await queued(other)
    for call in (lambda: sched.answer_and_take(d, None, LONG), lambda: sched.finish_many([d])):
        with pytest.raises(InvalidInput, match="was not handed out by"):
            await call()
    assert await queued(other) == before
    await other.client.delete(*[k for k in await other.client.keys(other.prefix + "*")])


async def test_concurrent_take_many_hand_out_every_workflow_exactly_once(wd_store: Store) -> None:
    sched = scheduler(wd_store)
    names = [f"b-{i:03d}" for i in range(60)]
    for n in names:
        await sched.schedule(n)
    got: list[str] = []

    async def taker() -> None:
        while batch := await sched.take_many(LONG, 7):
            assert len(batch) <= 7
            got.extend(d.workflow for d in batch)
            await sched.finish_many(batch)

    await asyncio.gather(*(taker() for _ in range(4)))
    assert sorted(got) == names, f"expected each of 60 once, got {len(got)} ({len(set(got))} distinct)"
    assert await queued(sched) == {}, "finish_many must have removed every delivery"


async def test_finish_many_removes_only_deliveries_still_current(wd_store: Store) -> None:
    sched = scheduler(wd_store)
    for n in ("done", "woken", "cancelled"):
        await sched.schedule(n)
    batch = await sched.take_many(LONG, 10)
    assert sorted(d.workflow for d in batch) == ["cancelled", "done", "woken"]
    assert await sched.take(LONG) is None, "take_many must hide what it took"
    await sched.schedule("woken")  # a wakeup since the take: it stands
    await sched.cancel("cancelled")  # cancelled since: not reinstated
    await sched.finish_many(batch)
    left = await sched.take_many(LONG, 10)
    assert [d.workflow for d in left] == ["woken"], f"expected only the woken one queued, got {left!r}"


async def test_a_wakeup_for_later_than_the_hidden_time_survives_every_answer_path(wd_store: Store) -> None:
    # The wakeup's time is past the delivery's hidden time, so only a changed receipt can say it came.
    sched = scheduler(wd_store)
    await sched.schedule("opener")
    opener = await sched.take(LONG)
    assert opener is not None and opener.workflow == "opener"
    await sched.schedule("chained")
    chained = await sched.answer_and_take(opener, None, LONG)
    assert chained is not None and chained.workflow == "chained"
    await sched.schedule("batched")
    batch = await sched.take_many(LONG, 5)
    assert [d.workflow for d in batch] == ["batched"]
    later = await sched.now() + 2 * LONG
    for d in (*batch, chained):
        await sched.schedule(d.workflow, later)  # while the pass holds it
    await sched.finish_many(batch)
    assert await sched.answer_and_take(chained, None, LONG) is None
    left = await queued(sched)
    assert sorted(left) == ["batched", "chained"], f"an answer dropped a wakeup since its take: {left!r}"


async def test_a_wakeup_at_exactly_the_hidden_time_survives_the_answer(wd_store: Store) -> None:
    # The boundary of the test above: a wakeup for the very microsecond the delivery is hidden until.
    sched = scheduler(wd_store)
    await sched.schedule("held")
    d = await sched.take(LONG)
    assert d is not None
    hidden = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(receipt_time(d)))
    await sched.schedule("held", hidden)  # while the pass holds it
    await sched.wake_at(d, None)
    assert sorted(await queued(sched)) == ["held"], "the holder's answer dropped a wakeup since its take"


async def test_take_many_refuses_a_bad_limit(wd_store: Store) -> None:
    sched = scheduler(wd_store)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InvalidInput, match="limit"):
            await sched.take_many(LONG, bad)  # type: ignore[arg-type]


# -- calls made together go out together ---------------------------------------------------------


def one_connection_client(store: Store) -> Any:
    """A client whose pool holds a single connection: two commands in flight at once would fail
    with "Too many connections", so only calls sent as one pipeline can share it."""
    from redis.asyncio import Redis

    return Redis.from_url(store.extra["server"].url, max_connections=1)


async def test_concurrent_calls_share_one_pipeline_and_each_gets_its_own_reply(wd_store: Store) -> None:
    sched = scheduler(wd_store)
    client = one_connection_client(wd_store)
    try:
        mine: Sched = type(sched)(client, namespace=sched.namespace, prefix=sched.prefix)
        names = [f"p-{i:02d}" for i in range(20)]
        for n in names:
            await sched.schedule(n)
        got = await asyncio.gather(*(mine.take(LONG) for _ in names))
        assert sorted(d.workflow for d in got if d is not None) == names, got
        current = await queued(sched)
        for d in got:  # each receipt is the one its own reply carried
            assert d is not None and receipt_time(d) == current[d.workflow], d
        assert await asyncio.gather(*(mine.answer_and_take(d, None, LONG) for d in got if d)) == [None] * 20
        assert await queued(sched) == {}
    finally:
        await client.aclose()


@pytest.mark.parametrize("direct", [True, False], ids=["hiredis-packed", "redis-py-pipeline"])
async def test_both_ways_of_sending_calls_together_give_each_call_its_own_reply(
    wd_store: Store, direct: bool
) -> None:
    """The batch goes out packed by hiredis on a pooled connection (``direct``) or, where that is
    not offered, through redis-py's pipeline: each call its own reply or error, in either order of
    sending, and a script the server lost (NOSCRIPT) loaded again."""
    from redis.asyncio import Redis
    from redis.exceptions import ResponseError

    from without_durability_redis._scripts import Scripts

    script = "if ARGV[1] == 'bad' then return redis.error_reply('refused ' .. ARGV[1]) end return ARGV[1]"
    client = Redis.from_url(wd_store.extra["server"].url)
    try:
        scripts = Scripts(client, {"now": script}, coalesce=True)
        assert scripts._direct, "a pooled UTF-8 client with hiredis installed sends packed batches"
        scripts._direct = direct
        key = f"{wd_store.extra['prefix']}replies"
        args = [f"a-{i}" for i in range(10)] + ["bad"] + [f"b-{i}" for i in range(10)]
        for flushed in (True, False):
            if flushed:  # every call of this batch meets NOSCRIPT first
                await client.script_flush()
            got = await asyncio.gather(*(scripts.run("now", [key], [a]) for a in args), return_exceptions=True)
            assert isinstance(got[10], ResponseError) and "refused bad" in str(got[10]), got
            assert [text(g) for g in got[:10] + got[11:]] == args[:10] + args[11:], got
    finally:
        await client.aclose()


async def test_a_server_that_stops_answering_fails_the_batch_within_the_socket_timeout(wd_store: Store) -> None:
    """The batch's replies are read under one timer, the connection's socket timeout: a server busy
    for longer than that fails the calls as unreachable rather than holding them until it answers."""
    from redis.asyncio import Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from without_durability.errors import StoreUnavailable

    url = wd_store.extra["server"].url
    sched = scheduler(wd_store)
    client = Redis.from_url(url, socket_timeout=0.3, retry=Retry(NoBackoff(), 0))
    other = Redis.from_url(url)
    spin = ("local s = redis.call('TIME') local t0 = s[1] * 1e6 + s[2] "
            "while true do local n = redis.call('TIME') if n[1] * 1e6 + n[2] - t0 > 2e6 then break end end")
    try:
        mine: Sched = type(sched)(client, namespace=sched.namespace, prefix=sched.prefix)
        await sched.schedule("late")
        assert await mine.take(LONG) is not None  # the pooled connection is made and ready
        await sched.schedule("late-2")
        busy = asyncio.create_task(other.eval(spin, 0))
        await asyncio.sleep(0.2)  # the server is inside the script now
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=r"(?i)timeout"):
            await asyncio.gather(mine.take(LONG), mine.take(LONG))
        assert time.monotonic() - started < 1.5
        await busy
    finally:
        await client.aclose()
        await other.aclose()


async def test_only_a_pooled_utf8_client_gets_hiredis_packed_batches(wd_store: Store) -> None:
    """hiredis packs text as strict UTF-8, so a client encoding otherwise keeps redis-py's own
    packing; a single-connection client keeps its own lock (redis-py's path)."""
    from redis.asyncio import Redis

    url = wd_store.extra["server"].url
    sched = scheduler(wd_store)
    clients = {
        "pooled": Redis.from_url(url),
        "latin-1": Redis.from_url(url, encoding="latin-1"),
        "lenient": Redis.from_url(url, encoding_errors="replace"),
        "single": Redis.from_url(url, single_connection_client=True),
    }
    try:
        direct = {k: type(sched)(c, namespace=sched.namespace, prefix=sched.prefix)._scripts._direct
                  for k, c in clients.items()}
        assert direct == {"pooled": True, "latin-1": False, "lenient": False, "single": False}, direct
        single = type(sched)(clients["single"], namespace=sched.namespace, prefix=sched.prefix)
        await single.schedule("s")
        got = await asyncio.gather(single.take(LONG), single.take(LONG))
        assert [d.workflow if d else None for d in got] in (["s", None], [None, "s"]), got
    finally:
        for c in clients.values():
            await c.aclose()


async def test_a_script_flushed_from_the_server_is_loaded_again_for_calls_sent_together(
    wd_store: Store,
) -> None:
    sched = scheduler(wd_store)
    for n in ("x", "y", "z"):
        await sched.schedule(n)
    assert await sched.take(LONG) is not None  # the take script is loaded now
    await sched.client.script_flush()
    got = await asyncio.gather(sched.take(LONG), sched.take(LONG), sched.take(LONG))
    assert sorted(d.workflow for d in got if d is not None) == ["y", "z"], got


async def test_an_error_reaches_only_the_call_that_caused_it(wd_store: Store) -> None:
    from redis.exceptions import ResponseError

    from without_durability_redis._scripts import Scripts

    script = "if ARGV[1] == 'bad' then return redis.error_reply('refused ' .. ARGV[1]) end return ARGV[1]"
    client = one_connection_client(wd_store)
    try:
        scripts = Scripts(client, {"now": script}, coalesce=True)
        key = f"{wd_store.extra['prefix']}errors"
        got = await asyncio.gather(
            *(scripts.run("now", [key], [a]) for a in ("a", "bad", "b")), return_exceptions=True
        )
        assert [text(g) for g in (got[0], got[2])] == ["a", "b"], got
        assert isinstance(got[1], ResponseError) and "refused bad" in str(got[1]), got
    finally:
        await client.aclose()


async def test_an_unreachable_server_fails_every_call_sent_together() -> None:
    from redis.asyncio import Redis

    from without_durability.errors import StoreUnavailable
    from without_durability.testing.servers import free_port

    client = Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=1)
    try:
        scheds: list[Sched] = [RedisSetScheduler(client), RedisStreamScheduler(client)]
        got = await asyncio.gather(*(s.take(LONG) for s in scheds for _ in range(3)), return_exceptions=True)
        assert all(isinstance(g, StoreUnavailable) for g in got), got
    finally:
        await client.aclose()


async def test_workers_chaining_calls_each_get_their_own_delivery_and_give_connections_back(
    wd_store: Store,
) -> None:
    """Eight workers chaining ``answer_and_take``, as ``Worker`` does: some of a turn's calls are
    written early, on connections kept between batches. Every workflow is handed out exactly once,
    and once the workers stop, the kept connections are back in the pool."""
    from redis.asyncio import Redis

    sched = scheduler(wd_store)
    client = Redis.from_url(wd_store.extra["server"].url)
    try:
        mine: Sched = type(sched)(client, namespace=sched.namespace, prefix=sched.prefix)
        names = [f"c-{i:03d}" for i in range(400)]
        await asyncio.gather(*(sched.schedule(n) for n in names))
        taken: list[str] = []

        async def worker() -> None:
            d = await mine.take(LONG)
            while d is not None:
                taken.append(d.workflow)
                d = await mine.answer_and_take(d, None, LONG)

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(8))), 30)
        assert sorted(taken) == names, f"each workflow once: {len(taken)} taken, {len(set(taken))} distinct"
        assert await queued(sched) == {}  # (on another client: the loop turns meanwhile)
        in_use = len(client.connection_pool._in_use_connections)
        assert in_use == 0, f"kept connections go back to the pool once nothing is in flight: {in_use} in use"
    finally:
        await client.aclose()
