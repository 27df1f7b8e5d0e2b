"""PostgresCheckpointer.append's group commit: appends made concurrently share one transaction, and
each caller still gets its own key or its own error.

Run with ``--wd-store postgres``.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import psycopg
import pytest

from without_durability.errors import InvalidValue, InvalidWorkflowId, StoreUnavailable
from without_durability.testing.harness import StoreUnderTest
from without_durability_postgres import PostgresCheckpointer
from without_durability_postgres._appends import SENDERS
from without_durability_postgres.checkpointer import ORDER_LOCK
from without_durability_postgres.kit import fresh_schema

pytestmark = [pytest.mark.asyncio, pytest.mark.wd_store("postgres")]

Store = StoreUnderTest[Any]


async def transactions(pool: Any) -> tuple[int, int]:
    """(rows, distinct inserting transactions) of the checkpoint table."""
    async with pool.connection() as conn:
        row = await (await conn.execute("SELECT count(*), count(DISTINCT xmin::text) FROM workflow_checkpoint")).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def test_concurrent_appends_share_commits_and_each_gets_its_own_key(wd_store: Store) -> None:
    async with fresh_schema(wd_store.extra["url"], min_size=2, max_size=4) as (pool, _):
        cp = PostgresCheckpointer(pool=pool)
        calls = [(f"w{i % 5}", {"n": i}) for i in range(40)]
        keys = await asyncio.gather(*(cp.append(w, v) for w, v in calls))
        assert len(set(keys)) == 40, "two appends were handed one key"
        for w in {w for w, _ in calls}:
            loaded = await cp.load(w)
            assert loaded == {k: v for (w2, v), k in zip(calls, keys, strict=True) if w2 == w}
            assert list(loaded) == sorted(loaded), "a workflow's keys are not in load order"
        rows, commits = await transactions(pool)
        assert rows == 40 and commits < 40, f"{commits} transactions for 40 concurrent appends: none shared"


async def test_without_batching_each_append_commits_alone(wd_store: Store) -> None:
    async with fresh_schema(wd_store.extra["url"], min_size=2, max_size=4) as (pool, _):
        cp = PostgresCheckpointer(pool=pool, batch_appends=False)
        await asyncio.gather(*(cp.append(f"w{i % 3}", i) for i in range(12)))
        assert await transactions(pool) == (12, 12)


class NotJsonForSeven:
    """A codec the construction checks accept whose encoding of 7 the server refuses as jsonb."""

    renders_json = True

    def encode(self, value: object) -> str:
        return "{not json" if value == 7 and type(value) is int else json.dumps(value)

    def decode(self, encoded: str) -> object:
        return 7 if encoded == "{not json" else json.loads(encoded)


async def test_a_value_the_server_refuses_fails_only_its_own_call(wd_store: Store) -> None:
    async with fresh_schema(wd_store.extra["url"], min_size=2, max_size=4) as (pool, _):
        cp = PostgresCheckpointer(pool=pool, codec=NotJsonForSeven())
        got = await asyncio.gather(*(cp.append(f"w{i % 2}", i) for i in range(12)), return_exceptions=True)
        failed = [i for i, g in enumerate(got) if isinstance(g, BaseException)]
        assert failed == [7], got
        assert isinstance(got[7], InvalidValue) and "'w1'" in str(got[7]), repr(got[7])
        loads = [await cp.load(w) for w in ("w0", "w1")]
        landed = sorted(int(str(v)) for loaded in loads for v in loaded.values())
        assert landed == [i for i in range(12) if i != 7], "the batch's other appends were lost with it"


async def test_a_caller_cancelled_before_its_batch_went_out_appends_nothing(wd_store: Store) -> None:
    url = wd_store.extra["url"]
    async with fresh_schema(url, min_size=SENDERS + 2, max_size=SENDERS + 2) as (pool, schema):
        cp = PostgresCheckpointer(pool=pool)
        holder = await psycopg.AsyncConnection.connect(url, options=f"-c search_path={schema}")
        try:
            await holder.execute("SELECT pg_advisory_xact_lock(%s, hashtext('held'))", (ORDER_LOCK,))
            # one sent alone and one per sender, each waiting at the server for the held turn
            busy = []
            for i in range(SENDERS + 1):
                busy.append(asyncio.ensure_future(cp.append("held", i)))
                for _ in range(50):  # until a sender has taken it (the first is sent at once)
                    await asyncio.sleep(0.02)
                    if not cp._appends._waiting:
                        break
            late = asyncio.ensure_future(cp.append("other", "never"))  # waits: every sender is busy
            await asyncio.sleep(0.05)
            assert not late.done() and cp._appends._waiting, "the late append did not wait for a sender"
            late.cancel()
            with pytest.raises(asyncio.CancelledError):
                await late
        finally:
            await holder.rollback()
            await holder.close()
        assert len(set(await asyncio.gather(*busy))) == SENDERS + 1
        assert await cp.load("other") == {}, "the append cancelled while it waited was sent anyway"
        assert sorted(int(str(v)) for v in (await cp.load("held")).values()) == list(range(SENDERS + 1))


@pytest.mark.parametrize("late", [1, 2], ids=["one-waiting", "a-batch-waiting"])
async def test_callers_that_time_out_while_their_batch_waits_for_a_connection_append_nothing(
    wd_store: Store, late: int
) -> None:
    """Every pooled connection is busy: one append goes out alone and waits for a connection, and
    ``late`` more, each under ``asyncio.wait_for``, wait in a sender for one too. They time out;
    once the connections come back, what the sender holds must not be sent (a caller that retries
    after its timeout would otherwise append twice)."""
    async with fresh_schema(wd_store.extra["url"], min_size=2, max_size=2) as (pool, _):
        cp = PostgresCheckpointer(pool=pool)
        held = [await pool.getconn(), await pool.getconn()]
        try:
            first = asyncio.ensure_future(cp.append("first", "sent"))
            await asyncio.sleep(0.05)
            assert cp._appends._alone_now == 1, "the first append was not sent alone"
            timed = [asyncio.ensure_future(asyncio.wait_for(cp.append(f"late{i}", "never"), 0.5)) for i in range(late)]
            got = await asyncio.gather(*timed, return_exceptions=True)
            assert all(isinstance(g, TimeoutError) for g in got), got
            assert cp._appends._senders, "no sender was waiting for a connection: this shows nothing"
        finally:
            for conn in held:
                await pool.putconn(conn)
        assert await asyncio.wait_for(first, 10)
        for _ in range(1000):  # until the sender has had its connection and ended
            if not cp._appends._senders:
                break
            await asyncio.sleep(0.01)
        for i in range(late):
            assert await cp.load(f"late{i}") == {}, f"late{i}: an append whose caller timed out was committed"
        assert list((await cp.load("first")).values()) == ["sent"]


class DeepForNine:
    """A codec whose encoding of 9 is JSON nested 20,000 deep: the server refuses it (SQLSTATE
    54001, which psycopg files under OperationalError)."""

    renders_json = True

    def encode(self, value: object) -> str:
        return "[" * 20_000 + "]" * 20_000 if value == 9 and type(value) is int else json.dumps(value)

    def decode(self, encoded: str) -> object:
        return 9 if encoded.startswith("[[[[") else json.loads(encoded)


async def test_input_over_the_servers_limits_fails_only_its_own_call_as_a_refusal(wd_store: Store) -> None:
    """A value too deep and an id too long for the index, appended among valid ones: each fails
    its own call with a refusal (never ``StoreUnavailable``), and every other append lands."""
    async with fresh_schema(wd_store.extra["url"], min_size=2, max_size=4) as (pool, _):
        cp = PostgresCheckpointer(pool=pool, codec=DeepForNine())
        rng = random.Random(29)
        too_long = "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(2000))
        calls = [(f"w{i % 2}", i) for i in range(12)] + [(too_long, 100)]
        got = await asyncio.gather(*(cp.append(w, v) for w, v in calls), return_exceptions=True)
        failed = {calls[i][1]: g for i, g in enumerate(got) if isinstance(g, BaseException)}
        assert set(failed) == {9, 100}, got
        assert isinstance(failed[9], InvalidValue) and not isinstance(failed[9], StoreUnavailable), repr(failed[9])
        assert isinstance(failed[100], InvalidWorkflowId), repr(failed[100])
        loads = [await cp.load(w) for w in ("w0", "w1")]
        landed = sorted(int(str(v)) for loaded in loads for v in loaded.values())
        assert landed == [i for i in range(12) if i != 9], "the batch's other appends were lost with it"


async def test_a_batch_cut_off_leaves_each_caller_unknowing_and_spares_the_one_sent_alone(wd_store: Store) -> None:
    url = wd_store.extra["url"]
    async with fresh_schema(url, min_size=3, max_size=4) as (pool, schema):
        cp = PostgresCheckpointer(pool=pool)
        holder = await psycopg.AsyncConnection.connect(url, autocommit=True, options=f"-c search_path={schema}")
        try:
            async with holder.transaction():
                await holder.execute("SELECT pg_advisory_xact_lock(%s, hashtext('held'))", (ORDER_LOCK,))
                waiting = "SELECT pid FROM pg_stat_activity WHERE wait_event = 'advisory' AND pid <> pg_backend_pid()"

                async def waiters(n: int) -> list[int]:
                    pids: list[int] = []
                    for _ in range(200):
                        pids = [r[0] for r in await (await holder.execute(waiting)).fetchall()]
                        if len(pids) == n:
                            break
                        await asyncio.sleep(0.02)
                    assert len(pids) == n, f"{n} appends were not waiting for the held turn: {pids}"
                    return pids

                alone = asyncio.ensure_future(cp.append("held", "alone"))  # sent at once, alone
                (lone,) = await waiters(1)
                batch = [asyncio.ensure_future(cp.append(w, v)) for w, v in (("held", "b1"), ("other", "b2"))]
                cut = [pid for pid in await waiters(2) if pid != lone]
                await holder.execute("SELECT pg_terminate_backend(%s)", (cut[0],))
                got = await asyncio.gather(*batch, return_exceptions=True)
        finally:
            await holder.close()
        for (w, _), g in zip((("held", "b1"), ("other", "b2")), got, strict=True):
            assert isinstance(g, StoreUnavailable) and f"{w!r}" in str(g), repr(g)
        assert got[0] is not got[1], "two callers were handed one exception object"
        assert await alone is not None  # the one sent alone is untouched, and lands once the turn frees
        assert list((await cp.load("held")).values()) == ["alone"]
        assert await cp.load("other") == {}, "the cut-off batch committed"


async def test_bursts_from_many_callers_all_land_once_and_none_is_left_waiting(wd_store: Store) -> None:
    """Senders start and stop as bursts come and go; an append made as the last sender finds
    nothing left to send must start a sender of its own, never wait on one that is ending."""
    rng = random.Random(5)
    async with fresh_schema(wd_store.extra["url"], min_size=3, max_size=6) as (pool, _):
        cp = PostgresCheckpointer(pool=pool)
        made: list[tuple[str, str, int]] = []

        async def caller(c: int) -> None:
            for i in range(25):
                if rng.random() < 0.3:
                    await asyncio.sleep(rng.choice([0, 0, 0.001, 0.005]))
                w = f"w{rng.randrange(8)}"
                made.append((w, await cp.append(w, c * 100 + i), c * 100 + i))

        async with asyncio.timeout(60):  # an append left waiting hangs here, not at the suite's timeout
            await asyncio.gather(*(caller(c) for c in range(12)))
        assert len(made) == 300 and len({key for _, key, _ in made}) == 300
        for w in {w for w, _, _ in made}:
            assert await cp.load(w) == {key: v for w2, key, v in made if w2 == w}
        assert not cp._appends._senders and not cp._appends._waiting, "a sender or an append outlived its callers"


async def test_an_append_made_as_both_senders_end_starts_a_sender_of_its_own(wd_store: Store) -> None:
    """Both senders finish in one turn of the loop, and a caller they answered appends again at
    once: that append must be sent, not left waiting on senders that are ending."""
    async with fresh_schema(wd_store.extra["url"], min_size=1, max_size=2) as (pool, _):
        cp = PostgresCheckpointer(pool=pool)
        gates: dict[str, asyncio.Event] = {w: asyncio.Event() for w in ("a1", "a2", "a3")}
        real = cp._append_alone

        async def gated(workflow: str, encoded: str, **how: Any) -> str:
            key = await real(workflow, encoded, **how)
            if workflow in gates:  # answered, but held here, so both senders can end in one turn
                await gates[workflow].wait()
            return key

        cp._append_alone = gated  # type: ignore[method-assign]
        first = asyncio.ensure_future(cp.append("a1", 1))  # sent alone, from its own task
        await asyncio.sleep(0)

        async def again() -> str:
            await cp.append("a2", 2)  # the first sender's
            return await cp.append("a4", 4)  # made in the turn both senders end

        second = asyncio.ensure_future(again())
        for _ in range(200):  # until the first sender holds a2, alone, at its gate
            await asyncio.sleep(0.005)
            if not cp._appends._waiting:
                break
        third = asyncio.ensure_future(cp.append("a3", 3))  # the second sender's
        for _ in range(200):
            await asyncio.sleep(0.005)
            if not cp._appends._waiting:
                break
        await asyncio.sleep(0.2)  # both appends answered by the server, held at their gates
        assert len(cp._appends._senders) == SENDERS, "the test needs both senders busy"
        gates["a2"].set()
        gates["a3"].set()
        async with asyncio.timeout(10):
            await asyncio.gather(second, third)
        gates["a1"].set()
        await first
        assert await cp.load("a4") != {}
