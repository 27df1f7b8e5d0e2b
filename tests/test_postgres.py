"""The Postgres store's own arguments, each shown against a real server on real parallel
connections: the row lock in record, one number behind append, migrate under a booting fleet, ids
that are parameters, jsonb equality, one commit per transition, the sweep, and the boundary.

Run with ``--wd-store postgres`` (a private server is started, or WD_POSTGRES_URL is used).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest

from without_durability import errors
from without_durability._values import Pass, Recorded
from without_durability.errors import (
    Contended,
    Fenced,
    InvalidInput,
    InvalidKey,
    InvalidValue,
    InvalidWorkflowId,
    StoreError,
    StoreUnavailable,
)
from without_durability.rules import lifecycle_writes
from without_durability.testing.harness import StoreUnderTest
from without_durability_postgres.kit import LEDGER_ADD, fresh_schema

psycopg = pytest.importorskip("psycopg")
psycopg_pool = pytest.importorskip("psycopg_pool")

from without_durability_postgres import (  # noqa: E402
    PostgresCheckpointer,
    PostgresDurable,
    PostgresScheduler,
    migrate,
    sweep,
)
from without_durability_postgres.checkpointer import CLAIM, RECORD  # noqa: E402

pytestmark = [pytest.mark.asyncio, pytest.mark.wd_store("postgres")]

Store = StoreUnderTest[Any]
LONG = timedelta(hours=1)
_ids = itertools.count()


def wf(label: str) -> str:
    return f"pg-{label}-{next(_ids)}"


def pool_of(store: Store) -> Any:
    return store.extra["pool"]


async def scalar(pool: Any, sql: str, params: Any = None) -> Any:
    async with pool.connection() as conn:
        row = await (await conn.execute(sql, params)).fetchone()
    return None if row is None else row[0]


async def until(check: Callable[[], Awaitable[bool]], what: str, within: float = 10.0) -> None:
    """Wait for ``check`` to hold, polling the server, or fail naming ``what``."""
    deadline = asyncio.get_running_loop().time() + within
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.02)


async def lock_waiters(pool: Any, table: str) -> int:
    """How many backends are waiting on a lock in a statement that names ``table``."""
    return int(
        await scalar(
            pool,
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database() AND query LIKE %s",
            (f"%{table}%",),
        )
    )


# -- tokens that coincide across workflows -------------------------------------------------


async def test_every_fenced_write_matches_its_own_workflow_when_tokens_coincide(wd_store: Store) -> None:
    """Claims draw tokens from one sequence, so two workflows' tokens differ while it only moves
    forward; a restore, or a sequence set back by hand, can make them coincide (a claim then mints
    held.token + 1). Every fenced statement must still match the workflow and not the token alone:
    a record, a renewal or a transact of one workflow must leave another's lapsed claim, holding
    the same token, lapsed; a release must leave another's live claim live."""
    pool, cp = pool_of(wd_store), wd_store.checkpointer
    for write in ("record", "renew", "transact", "release"):
        w, other = wf(f"coincide-{write}"), wf(f"coincide-{write}-other")
        held = await cp.claim(w, alive=LONG, budget=LONG)
        await cp.claim(other, alive=LONG, budget=LONG)
        lapse = "now() - interval '1 minute'" if write != "release" else "alive_until"
        async with pool.connection() as conn:  # the other's claim: the same token
            await conn.execute(
                f"UPDATE workflow_claim SET token = %s, alive_until = {lapse} WHERE workflow = %s",
                (held.token, other),
            )
        if write == "record":
            await cp.record(held, "step", 1)
        elif write == "renew":
            await cp.renew(held)
        elif write == "transact":
            await cp.transact(held, "step", wd_store.effects.ledger_add(w, 1))
        else:
            await cp.release(held)
        live = await scalar(
            pool, "SELECT alive_until > now() FROM workflow_claim WHERE workflow = %s", (other,)
        )
        assert live is (write == "release"), (
            f"a {write} of {w!r} changed the claim of {other!r}, which held the same token"
        )


async def test_every_token_raise_outranks_its_row_when_the_sequence_is_behind(wd_store: Store) -> None:
    """A restore, or a sequence set back by hand, can leave workflow_token_seq behind the tokens in
    the claim rows. Every statement that raises a token must still go above the row's own (hence
    GREATEST(token + 1, nextval)): a claim, a take that claims, and a discard's fence. Going back
    to the sequence would hand out a token a pass may still hold."""
    pool, cp, durable = pool_of(wd_store), wd_store.checkpointer, wd_store.durable
    ahead = 10**12

    async def put_ahead(workflow: str) -> int:
        async with pool.connection() as conn:
            await conn.execute("UPDATE workflow_claim SET token = %s WHERE workflow = %s", (ahead, workflow))
        return ahead

    w = wf("seq-behind-claim")
    await cp.release(await cp.claim(w, alive=LONG, budget=LONG))
    row = await put_ahead(w)
    assert (await cp.claim(w, alive=LONG, budget=LONG)).token > row, "a claim went back to the sequence"

    t = wf("seq-behind-take")
    await cp.release(await cp.claim(t, alive=LONG, budget=LONG))
    await durable.arrive(t, "go", 1)
    row = await put_ahead(t)
    taken = await durable.take_and_claim(LONG, alive=LONG, budget=LONG)
    assert taken is not None and taken[0].workflow == t and taken[1] is not None
    assert taken[1].token > row, "a take that claims went back to the sequence"

    d = wf("seq-behind-discard")
    held = await cp.claim(d, alive=LONG, budget=LONG)
    await put_ahead(d)
    await cp.discard(d)
    fence = await scalar(pool, "SELECT token FROM workflow_claim WHERE workflow = %s", (d,))
    assert fence is None or fence > ahead, f"a discard's fence went back to the sequence: {fence}"
    with pytest.raises(errors.Fenced):
        await cp.record(Pass(d, ahead), "late", 1)
    assert held.token < ahead


# -- the row lock in record -----------------------------------------------------------------


@pytest.mark.parametrize("claim_outcome", ["commit", "rollback"])
async def test_claim_committing_mid_record_refuses_the_stale_record(
    wd_store: Store, claim_outcome: str
) -> None:
    """A superseded pass's record that is already running when a newer claim commits must be
    refused: the fence locks the claim row, waits for the claim, and compares the newest token.
    (With rollback, the same record lands: what it waited for was the lock, not a guess.)"""
    cp, pool, w = wd_store.checkpointer, pool_of(wd_store), wf("rowlock")
    old = await cp.claim(w, alive=LONG, budget=LONG)
    await cp.release(old)  # lapsed, so a newer claim may take it
    async with pool.connection() as claimer:
        cur = await claimer.execute(CLAIM, {"workflow": w, "alive": LONG, "budget": LONG})
        newer = await cur.fetchone()
        assert newer is not None and newer[0] == old.token + 1
        record = asyncio.create_task(cp.record(old, "step", "stale"))

        async def record_is_waiting() -> bool:
            return record.done() or await lock_waiters(pool, "workflow_claim") > 0

        await until(record_is_waiting, "the stale record to block on the claim row")
        assert not record.done(), (
            f"the record did not wait for the claim in flight: it returned {record.result()!r} "
            "(the fence read the claim from its snapshot instead of locking the row)"
        )
        await (claimer.commit() if claim_outcome == "commit" else claimer.rollback())
    if claim_outcome == "commit":
        with pytest.raises(Fenced):
            await record
        assert await cp.load(w) == {}, "a record superseded mid-statement wrote"
    else:
        assert await record == Recorded("stale", True)
        assert await cp.load(w) == {"step": "stale"}


# -- one number behind append ---------------------------------------------------------------


async def test_sixteen_parallel_appends_lose_nothing_and_sort_in_load_order(
    wd_store: Store,
) -> None:
    async with fresh_schema(wd_store.extra["url"], min_size=16) as (pool, _):
        assert pool.get_stats()["pool_size"] >= 16, "the appends need 16 open connections"
        await _sixteen_appends(PostgresCheckpointer(pool=pool), pool, wf("append16"))


async def _sixteen_appends(cp: PostgresCheckpointer, pool: Any, w: str) -> None:
    start = asyncio.Event()

    async def one(i: int) -> str:
        await start.wait()
        return await cp.append(w, {"i": i})

    tasks = [asyncio.create_task(one(i)) for i in range(16)]
    await asyncio.sleep(0)
    start.set()
    keys = await asyncio.gather(*tasks)
    assert len(set(keys)) == 16, f"duplicate keys: {sorted(keys)}"
    loaded = await cp.load(w)
    assert sorted(loaded) == sorted(keys), f"lost appends: {set(keys) - set(loaded)}"
    assert list(loaded) == sorted(loaded), f"key order and load order disagree: {list(loaded)}"
    for i, key in enumerate(keys):
        assert loaded[key] == {"i": i}, f"append {i} under {key} holds {loaded[key]!r}"
    async with pool.connection() as conn:
        rows = await (
            await conn.execute("SELECT key, seq FROM workflow_checkpoint WHERE workflow = %s", (w,))
        ).fetchall()
    mismatched = [(k, s) for k, s in rows if int(k.removeprefix("inbox/")) != s]
    assert not mismatched, f"an inbox key's number is not its row's seq: {mismatched}"


# -- migrate under a booting fleet ----------------------------------------------------------

_MIGRATE_CHILD = textwrap.dedent("""
    import asyncio, sys
    from psycopg_pool import AsyncConnectionPool
    from without_durability_postgres import migrate

    async def main(url, schema):
        pool = AsyncConnectionPool(url, min_size=1, max_size=1, open=False,
                                   kwargs={"options": f"-c search_path={schema}"})
        await pool.open(wait=True)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        try:
            await migrate(pool)
        finally:
            await pool.close()
        print("migrated", flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


async def test_eight_processes_migrating_at_once_all_succeed(wd_store: Store) -> None:
    url = wd_store.extra["url"]
    schema = f"wd_boot_{next(_ids)}_{wd_store.extra['schema']}"
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        await admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        children = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _MIGRATE_CHILD,
                url,
                schema,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            for _ in range(8)
        ]
        for child in children:  # every process connected, then all go at once
            assert child.stdout is not None
            line = await asyncio.wait_for(child.stdout.readline(), 60)
            assert line.strip() == b"ready", f"child did not start: {line!r}"
        for child in children:
            assert child.stdin is not None
            child.stdin.write(b"go\n")
        outcomes = [await asyncio.wait_for(c.communicate(), 60) for c in children]
        failed = [
            (c.returncode, err.decode()[-600:])
            for c, (_, err) in zip(children, outcomes, strict=True)
            if c.returncode != 0
        ]
        assert not failed, f"{len(failed)} of 8 concurrent migrates failed: {failed}"
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            rows = await (
                await admin.execute(
                    "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relkind IN ('r', 'S') ORDER BY 1",
                    (schema,),
                )
            ).fetchall()
        assert [r[0] for r in rows] == [
            "workflow_checkpoint",
            "workflow_claim",
            "workflow_queue",
            "workflow_seq",
            "workflow_take_seq",
            "workflow_token_seq",
            "workflow_transact_guard",
        ]
    finally:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def test_migrate_again_is_a_no_op(wd_store: Store) -> None:
    cp, pool = wd_store.checkpointer, pool_of(wd_store)
    await cp.supply("kept", "k", 1)
    await migrate(pool)
    assert await cp.load("kept") == {"k": 1}


# -- ids are parameters ---------------------------------------------------------------------

HOSTILE = [
    "{wf}'; DROP TABLE workflow_claim; --",
    "{wf}'",
    "{wf}",
    "'; SELECT 1; \"",
    "a;b{c}d'e\"f\\g%s%(x)s",
]


async def test_hostile_workflow_ids_address_exactly_themselves(wd_store: Store) -> None:
    cp, sched = wd_store.checkpointer, wd_store.scheduler
    for i, w in enumerate(HOSTILE):
        held = await cp.claim(w, alive=LONG, budget=LONG)
        assert await cp.record(held, "step", i) == Recorded(i, True)
        key = await cp.append(w, f"m{i}")
        await wd_store.durable.arrive(w, "approval", {"n": i})
    for i, w in enumerate(HOSTILE):
        loaded = await cp.load(w)
        assert loaded["step"] == i and loaded["approval"] == {"n": i} and len(loaded) == 3, (
            f"id {w!r} loaded {loaded!r}"
        )
        with pytest.raises(Contended):
            await cp.claim(w, alive=LONG, budget=LONG)
    taken = set()
    while (d := await sched.take(LONG)) is not None:
        taken.add(d.workflow)
    assert taken == set(HOSTILE), f"queue held {taken!r}"
    for near in ("{wf}'; DROP TABLE workflow_claim; -", "{wf}''", "{WF}", "'; SELECT 1;"):
        assert await cp.load(near) == {}, f"{near!r} saw another id's records"
    await cp.discard(HOSTILE[0])
    assert await cp.load(HOSTILE[0]) == {}
    assert len(await cp.load(HOSTILE[1])) == 3, "discarding one hostile id touched another"
    assert key.startswith("inbox/")


# -- jsonb equality ---------------------------------------------------------------------------


class InsertionOrderCodec:
    """JSON text in the caller's key order with loose whitespace: deterministic per value, but two
    equal dicts built in different orders encode differently."""

    def encode(self, value: object) -> str:
        return json.dumps(value, allow_nan=False, separators=(", ", ": "))

    def decode(self, encoded: str) -> object:
        return json.loads(encoded)


async def test_jsonb_equality_agrees_across_key_order_and_whitespace(wd_store: Store) -> None:
    pool = pool_of(wd_store)
    cp = PostgresCheckpointer(pool=pool, codec=InsertionOrderCodec())
    w = wf("jsonb")
    first, second = {"b": 2, "a": [1, {"y": 0, "x": 1}]}, {"a": [1, {"x": 1, "y": 0}], "b": 2}
    assert InsertionOrderCodec().encode(first) != InsertionOrderCodec().encode(second)
    assert await cp.supply(w, "k", first) == Recorded(first, True)
    again = await cp.supply(w, "k", second)
    assert again == Recorded(first, True), f"key order alone made a different value: {again!r}"
    held = await cp.claim(w, alive=LONG, budget=LONG)
    assert (await cp.record(held, "k", second)).won
    assert not (await cp.record(held, "k", {"a": [1], "b": 2})).won, "a different value won"


# -- input the store cannot hold --------------------------------------------------------------


async def test_nul_is_refused_clearly_and_nothing_changes(wd_store: Store) -> None:
    cp, w = wd_store.checkpointer, wf("nul")
    held = await cp.claim(w, alive=LONG, budget=LONG)
    await cp.record(held, "kept", 1)
    with pytest.raises(InvalidWorkflowId, match="NUL"):
        await cp.supply("a\x00b", "k", 1)
    with pytest.raises(InvalidWorkflowId, match="NUL"):
        await cp.claim("a\x00b", alive=LONG, budget=LONG)
    with pytest.raises(InvalidWorkflowId, match="NUL"):
        await wd_store.scheduler.schedule("a\x00b")
    with pytest.raises(InvalidKey, match="NUL"):
        await cp.record(held, "k\x00", 1)
    for bad in ("a\x00b", {"k\x00": 1}, ["x", "\x00"]):
        with pytest.raises(InvalidValue, match=w):
            await cp.record(held, "v", bad)
        with pytest.raises(InvalidValue, match="NUL"):
            await cp.append(w, bad)
    # A literal backslash before u0000 is ordinary text, not the NUL escape.
    assert await cp.record(held, "text", "\\u0000") == Recorded("\\u0000", True)
    assert await cp.load(w) == {"kept": 1, "text": "\\u0000"}


class Base64Codec:
    def encode(self, value: object) -> str:
        import base64

        return base64.b64encode(json.dumps(value).encode()).decode()

    def decode(self, encoded: str) -> object:
        import base64

        return json.loads(base64.b64decode(encoded))


class SaysNotJson(Base64Codec):
    renders_json = False


async def test_a_codec_that_does_not_render_json_is_refused(wd_store: Store) -> None:
    pool = pool_of(wd_store)
    for codec in (Base64Codec(), SaysNotJson()):
        with pytest.raises(InvalidInput, match="JSON text"):
            PostgresCheckpointer(pool=pool, codec=codec)


class SometimesNotJson:
    """Passes the construction probe, then renders a value jsonb refuses."""

    def encode(self, value: object) -> str:
        return "not json" if value == "odd" else json.dumps(value)

    def decode(self, encoded: str) -> object:
        return json.loads(encoded)


async def test_a_non_json_encoding_is_refused_at_the_write(wd_store: Store) -> None:
    cp = PostgresCheckpointer(pool=pool_of(wd_store), codec=SometimesNotJson())
    w = wf("not-json")
    with pytest.raises(InvalidValue, match="jsonb") as caught:
        await cp.supply(w, "k", "odd")
    assert isinstance(caught.value.__cause__, psycopg.Error)
    assert await cp.load(w) == {}


# -- one commit per transition ------------------------------------------------------------------


async def test_durable_requires_one_pool(wd_store: Store) -> None:
    url = wd_store.extra["url"]
    other = psycopg_pool.AsyncConnectionPool(url, open=False, min_size=1, max_size=1)
    with pytest.raises(InvalidInput, match="one pool"):
        PostgresDurable(PostgresCheckpointer(pool=pool_of(wd_store)), PostgresScheduler(pool=other))


async def test_arrive_and_deliver_commit_both_halves_or_neither(wd_store: Store) -> None:
    pool, cp, w = pool_of(wd_store), wd_store.checkpointer, wf("one-commit")
    async with pool.connection() as conn:  # make the queue half fail for this id only
        await conn.execute(
            "CREATE FUNCTION wd_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.workflow LIKE 'pg-one-commit-%%' THEN RAISE EXCEPTION 'queue refused'; "
            "END IF; RETURN NEW; END $$"
        )
        await conn.execute(
            "CREATE TRIGGER wd_refuse BEFORE INSERT ON workflow_queue "
            "FOR EACH ROW EXECUTE FUNCTION wd_refuse()"
        )
    with pytest.raises(StoreError, match="queue refused"):
        await wd_store.durable.arrive(w, "approval", True)
    with pytest.raises(StoreError, match="queue refused"):
        await wd_store.durable.deliver(w, "message")
    assert await cp.load(w) == {}, "a transition whose schedule failed kept its record"
    assert await wd_store.scheduler.take(LONG) is None


# -- transact ----------------------------------------------------------------------------------


def ledger_add(name: str, amount: int, before_return: Callable[[], Awaitable[None]] | None = None):  # type: ignore[no-untyped-def]
    async def effect(cursor: Any) -> object:
        await cursor.execute(LEDGER_ADD, {"name": name, "amount": amount})
        row = await cursor.fetchone()
        if before_return is not None:
            await before_return()
        return int(row[0])

    return effect


async def test_transact_that_loses_the_race_rolls_back_and_reports_the_winner(
    wd_store: Store,
) -> None:
    cp, kit, w = wd_store.checkpointer, wd_store.effects, wf("transact-race")
    held = await cp.claim(w, alive=LONG, budget=LONG)
    entered, gate = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        entered.set()
        await gate.wait()

    slow = asyncio.create_task(cp.transact(held, "k", ledger_add(w + "/slow", 7, hold)))
    await entered.wait()  # the slow transact is mid-effect, its transaction open
    fast = await cp.transact(held, "k", kit.ledger_add(w + "/fast", 1))
    assert fast == Recorded(1, True)
    gate.set()
    assert await slow == Recorded(1, False), "the losing transact did not report the winner"
    assert await kit.ledger_read(w + "/slow") == 0, "the losing transact's effect was kept"
    assert await kit.ledger_read(w + "/fast") == 1


async def test_transact_leaves_the_claim_row_free_while_its_effect_runs(wd_store: Store) -> None:
    """The worker's renewal on another connection must not queue behind a long effect."""
    cp, w = wd_store.checkpointer, wf("renew-during")
    held = await cp.claim(w, alive=LONG, budget=LONG)
    entered, gate = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        entered.set()
        await gate.wait()

    task = asyncio.create_task(cp.transact(held, "k", ledger_add(w, 1, hold)))
    await entered.wait()
    try:
        await asyncio.wait_for(cp.renew(held), 5)
    finally:
        gate.set()
    assert (await task).won


async def test_slow_transact_renews_and_stamps_with_the_commit_time(wd_store: Store) -> None:
    """transact renews with clock_timestamp(), not the transaction's start, and written_at is
    when the record landed, not when the transaction began."""
    cp, pool, w = wd_store.checkpointer, pool_of(wd_store), wf("slow-transact")
    alive = timedelta(seconds=3)
    held = await cp.claim(w, alive=alive, budget=LONG)
    before = await wd_store.now()

    async def slow(cursor: Any) -> object:
        await cursor.execute("SELECT pg_sleep(1.5)")
        return "done"

    await cp.transact(held, "k", slow)
    left = await scalar(
        pool, "SELECT alive_until - clock_timestamp() FROM workflow_claim WHERE workflow = %s", (w,)
    )
    assert left > alive - timedelta(seconds=1), (
        f"a 1.5s transact left {left} of a {alive} window: it renewed from the transaction start"
    )
    (entry,) = await cp.history(w)
    assert entry.written_at - before >= timedelta(seconds=1.4), (
        f"written_at {entry.written_at} is not the commit time (transact began at ~{before})"
    )


async def test_effect_driver_errors_reach_the_caller_unwrapped(wd_store: Store) -> None:
    cp, w = wd_store.checkpointer, wf("effect-error")
    held = await cp.claim(w, alive=LONG, budget=LONG)

    async def broken(cursor: Any) -> object:
        await cursor.execute("SELECT * FROM no_such_table")
        return None

    with pytest.raises(psycopg.errors.UndefinedTable):
        await cp.transact(held, "k", broken)
    assert await cp.load(w) == {}


# -- the scheduler ------------------------------------------------------------------------------


async def test_take_steps_over_a_locked_row_instead_of_waiting(wd_store: Store) -> None:
    pool, sched = pool_of(wd_store), wd_store.scheduler
    first, second = wf("locked"), wf("free")
    now = await wd_store.now()
    await sched.schedule(first, now - timedelta(seconds=2))
    await sched.schedule(second, now - timedelta(seconds=1))
    async with pool.connection() as holder:
        await holder.execute("SELECT 1 FROM workflow_queue WHERE workflow = %s FOR UPDATE", (first,))
        got = await asyncio.wait_for(sched.take(LONG), 5)
        assert got is not None and got.workflow == second, f"take handed out {got!r}"
    got = await sched.take(LONG)
    assert got is not None and got.workflow == first


async def test_namespaces_are_separate_queues(wd_store: Store) -> None:
    pool, w = pool_of(wd_store), wf("ns")
    a, b = PostgresScheduler(pool=pool, namespace="a"), PostgresScheduler(pool=pool, namespace="b")
    await a.schedule(w)
    assert await b.take(LONG) is None
    got = await a.take(LONG)
    assert got is not None and got.workflow == w
    with pytest.raises(InvalidInput, match="namespace"):
        await b.wake_at(got, None)


@pytest.mark.parametrize("many", [False, True], ids=["take", "take_many"])
async def test_a_take_is_neither_held_up_by_nor_touches_another_namespace(
    wd_store: Store, many: bool
) -> None:
    # another namespace's entry due earlier must not stand in the way, and the same workflow queued
    # there must stay due for that namespace
    pool, w, first = pool_of(wd_store), wf("ns-order"), wf("ns-first")
    a, b = PostgresScheduler(pool=pool, namespace="a"), PostgresScheduler(pool=pool, namespace="b")
    now = await a.now()
    await b.schedule(first, now - timedelta(seconds=2))
    await b.schedule(w, now - timedelta(seconds=1))
    await a.schedule(w, now - timedelta(seconds=1))
    if many:
        got = [d.workflow for d in await a.take_many(LONG, 1)]
    else:
        one = await a.take(LONG)
        got = [] if one is None else [one.workflow]
    assert got == [w], f"namespace a's take handed out {got!r}"
    left = sorted(d.workflow for d in await b.take_many(LONG, 10))
    assert left == sorted([first, w]), f"namespace b's due entries after a's take: {left!r}"


async def test_a_cancel_in_one_namespace_leaves_the_other_alone(wd_store: Store) -> None:
    pool, w = pool_of(wd_store), wf("ns-cancel")
    a, b = PostgresScheduler(pool=pool, namespace="a"), PostgresScheduler(pool=pool, namespace="b")
    await a.schedule(w)
    await b.schedule(w)
    await a.cancel(w)
    assert await a.take(LONG) is None
    got = await b.take(LONG)
    assert got is not None and got.workflow == w, "a cancel in namespace a removed b's entry"


# -- the sweep -----------------------------------------------------------------------------------


async def test_sweep_collects_finished_workflows_and_never_orphans_records(
    wd_store: Store,
) -> None:
    cp, pool, durable = wd_store.checkpointer, pool_of(wd_store), wd_store.durable
    names = {k: wf(f"sweep-{k}") for k in ("done", "live", "queued", "young", "bare", "recent")}
    for kind, w in names.items():
        if kind != "bare":
            held = await cp.claim(w, alive=LONG, budget=LONG)
            await cp.record(held, "step", kind)
            with lifecycle_writes():  # every one finished: each is kept for another reason
                await cp.record(held, "wd/finished", kind)
            if kind != "live":
                await cp.release(held)
        else:
            held = await cp.claim(w, alive=LONG, budget=LONG)
            await cp.release(held)
    await durable.arrive(names["queued"], "approval", True)
    async with pool.connection() as conn:  # age the rows on the server, as two hours would
        await conn.execute(
            "UPDATE workflow_checkpoint SET written_at = written_at - interval '2 hours' "
            "WHERE workflow <> %s",
            (names["young"],),
        )
        await conn.execute(
            "UPDATE workflow_claim SET alive_until = alive_until - interval '3 hours', "
            "held_until = held_until - interval '3 hours' WHERE workflow <> ALL(%s)",
            ([names["live"], names["recent"]],),
        )
    recent_token = await scalar(
        pool, "SELECT token FROM workflow_claim WHERE workflow = %s", (names["recent"],)
    )

    swept = await sweep(pool, timedelta(hours=1))

    claims = {w for (w,) in await _rows(pool, "SELECT workflow FROM workflow_claim")}
    assert swept == 2, f"expected 'done' and 'recent' swept, got {swept}"
    assert await cp.load(names["done"]) == {} and names["done"] not in claims
    assert await cp.load(names["recent"]) == {}, "a finished workflow's records survived"
    assert names["recent"] in claims, "a claim row lapsed for less than the age was deleted"
    assert await cp.load(names["live"]) != {}, "a live claim's records were swept"
    assert await cp.load(names["queued"]) != {}, "a queued workflow's records were swept"
    assert await cp.load(names["young"]) != {}
    assert names["young"] in claims, "a claim row was deleted while its workflow has records"
    assert names["bare"] not in claims, "an old claim row with no records was kept"
    again = await cp.claim(names["recent"], alive=LONG, budget=LONG)
    assert again.token > recent_token, "the sweep did not raise the fence of what it discarded"


async def test_sweep_keeps_waiting_workflows_unless_abandoned_ones_are_asked_for(
    wd_store: Store,
) -> None:
    cp, pool = wd_store.checkpointer, pool_of(wd_store)
    kinds = ("waiting", "failed", "rearmed", "finished")
    names = {k: wf(f"sweep-life-{k}") for k in kinds}
    for kind, w in names.items():
        held = await cp.claim(w, alive=LONG, budget=LONG)
        await cp.record(held, "step", kind)  # "waiting": released, unqueued, awaiting an arrive
        with lifecycle_writes():
            if kind == "finished":
                await cp.record(held, "wd/finished", None)
            if kind in ("failed", "rearmed"):
                await cp.record(held, "wd/failed/0", {"attempts": 1})
            if kind == "rearmed":  # re-armed, then failed no more: open again
                await cp.record(held, "wd/rearmed/0", {})
        await cp.release(held)
    async with pool.connection() as conn:  # age every row on the server, as two hours would
        await conn.execute(
            "UPDATE workflow_checkpoint SET written_at = written_at - interval '2 hours' "
            "WHERE workflow = ANY(%s)",
            (list(names.values()),),
        )
    swept = await sweep(pool, timedelta(hours=1))
    kept = {k for k, w in names.items() if await cp.load(w) != {}}
    assert kept == {"waiting", "rearmed"}, f"sweep kept {sorted(kept)}, expected the two open ones"
    assert swept == 2, f"expected the finished and the failed workflow swept, got {swept}"
    assert await sweep(pool, timedelta(hours=1), abandoned_after=timedelta(hours=3)) == 0
    assert await sweep(pool, timedelta(hours=1), abandoned_after=timedelta(hours=1)) == 2
    with pytest.raises(InvalidInput):
        await sweep(pool, timedelta(hours=1), abandoned_after=timedelta(hours=-1))


async def _age(pool: Any, workflows: list[str], *, records: str = "2 hours", claims: str = "3 hours") -> None:
    """Move the workflows' records and claim deadlines into the past on the server, as time would."""
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_checkpoint SET written_at = written_at - %s::interval WHERE workflow = ANY(%s)",
            (records, workflows),
        )
        await conn.execute(
            "UPDATE workflow_claim SET alive_until = alive_until - %s::interval, "
            "held_until = held_until - %s::interval WHERE workflow = ANY(%s)",
            (claims, claims, workflows),
        )


async def test_a_sweep_beside_a_renewing_pass_never_hands_its_token_out_again(wd_store: Store) -> None:
    """A pass that overruns its budget while renewing (as the Worker's tick does), with no records
    and no queue row: the sweep may drop its lapsed claim row, but the next claim must mint a
    token above the pass's, and the overrunning pass must be fenced."""
    cp, pool, w = wd_store.checkpointer, pool_of(wd_store), wf("sweep-overrun")
    first = await cp.claim(w, alive=timedelta(seconds=0.3), budget=timedelta(seconds=0.6))
    deadline = asyncio.get_running_loop().time() + 1.0  # past budget + older_than
    while asyncio.get_running_loop().time() < deadline:
        await cp.renew(first)  # never silent
        await asyncio.sleep(0.1)
    await sweep(pool, timedelta(seconds=0.3))
    assert await scalar(pool, "SELECT count(*) FROM workflow_claim WHERE workflow = %s", (w,)) == 0, (
        "the sweep kept the lapsed claim row, so this test shows nothing"
    )
    second = await cp.claim(w, alive=LONG, budget=LONG)
    assert second.token > first.token, (
        f"the claim after the sweep got token {second.token}, not above the running pass's {first.token}"
    )
    await cp.record(second, "k", "second")
    with pytest.raises(Fenced):
        await cp.record(first, "k2", "first")
    assert await cp.load(w) == {"k": "second"}


async def test_input_over_the_servers_limits_is_refused_not_unreachable(wd_store: Store) -> None:
    """An id or key too long for the primary-key index, or a value nested deeper than jsonb's
    stack allows: the server refuses (SQLSTATE class 54, which psycopg files under
    OperationalError); the caller gets a refusal naming what was too large, never
    ``StoreUnavailable``, and nothing is stored."""
    cp = wd_store.checkpointer
    rng = random.Random(29)
    long_text = "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(2000))  # ~6 kB, incompressible
    with pytest.raises(InvalidWorkflowId, match="too long") as raised:
        await cp.claim(long_text, alive=LONG, budget=LONG)
    assert not isinstance(raised.value, StoreUnavailable) and "characters)" in str(raised.value)
    with pytest.raises(InvalidWorkflowId, match="too long"):
        await cp.append(long_text, "m")
    w = wf("limits")
    held = await cp.claim(w, alive=LONG, budget=LONG)
    with pytest.raises(InvalidKey, match="too long"):
        await cp.record(held, long_text, 1)
    deep = DeepForDeep()
    deep_cp = PostgresCheckpointer(pool=pool_of(wd_store), codec=deep)
    with pytest.raises(InvalidValue, match="SQLSTATE 54"):
        await deep_cp.record(held, "deep", "deep")
    with pytest.raises(InvalidValue, match="SQLSTATE 54"):
        await deep_cp.append(w, "deep")
    assert await cp.load(w) == {}, "a refused write left something behind"


class DeepForDeep:
    """A JSON codec that renders the string ``"deep"`` as arrays nested 20,000 deep: JSON text the
    construction checks accept and jsonb's parser refuses for its stack depth."""

    renders_json = True
    DEEP = "[" * 20_000 + "]" * 20_000

    def encode(self, value: object) -> str:
        return self.DEEP if value == "deep" else json.dumps(value)

    def decode(self, encoded: str) -> object:
        return "deep" if encoded.startswith("[[[[") else json.loads(encoded)


async def test_sweep_fences_what_it_collects_and_leaves_what_it_keeps_untouched(wd_store: Store) -> None:
    # every holder below has lapsed but none was superseded, so each may still write until a fence
    # goes up: the sweep must raise it for what it collects and for nothing else
    cp, pool = wd_store.checkpointer, pool_of(wd_store)
    names = {k: wf(f"sweep-touch-{k}") for k in ("collected", "mixed", "queued", "open")}
    passes = {}
    for kind, w in names.items():
        passes[kind] = await cp.claim(w, alive=LONG, budget=LONG)
        await cp.record(passes[kind], "old", kind)
        if kind != "open":
            with lifecycle_writes():
                await cp.record(passes[kind], "wd/finished", kind)
    await wd_store.scheduler.schedule(names["queued"])
    # lapsed for less than the age, so the claim rows stay and only a raised token fences a pass
    await _age(pool, list(names.values()), claims="90 minutes")
    for kind in ("mixed", "open"):  # an old record and a young one: the newest decides the age
        await cp.record(passes[kind], "young", kind)

    assert await sweep(pool, timedelta(hours=1), abandoned_after=timedelta(hours=1)) == 1

    with pytest.raises(Fenced):
        await cp.record(passes["collected"], "late", 1)
    for kind in ("mixed", "queued", "open"):
        recorded = await cp.record(passes[kind], "after", 1)
        assert recorded.won, f"the sweep fenced the {kind} workflow it kept"


async def test_sweep_steps_over_a_claim_row_someone_holds_locked(wd_store: Store) -> None:
    cp, pool = wd_store.checkpointer, pool_of(wd_store)
    w = wf("sweep-locked")
    await cp.release(await cp.claim(w, alive=LONG, budget=LONG))
    await _age(pool, [w])
    async with pool.connection() as holder:
        await holder.execute("SELECT 1 FROM workflow_claim WHERE workflow = %s FOR UPDATE", (w,))
        await asyncio.wait_for(sweep(pool, timedelta(hours=1)), 10)
    claims = {x for (x,) in await _rows(pool, "SELECT workflow FROM workflow_claim")}
    assert w in claims, "a claim row held locked by a writer was deleted under it"


async def test_a_swept_queued_workflow_without_records_never_sees_its_tokens_again(wd_store: Store) -> None:
    # The sweep keeps such a claim row, but since tokens come from workflow_token_seq a dropped one
    # would be harmless too (DROP_CLAIMS's queue test is listed equivalent); what must hold is that
    # the next claim outranks every pass before it.
    cp, pool = wd_store.checkpointer, pool_of(wd_store)
    w = wf("sweep-queued-bare")
    old = await cp.claim(w, alive=LONG, budget=LONG)
    await cp.release(old)
    await wd_store.scheduler.schedule(w)
    await _age(pool, [w])
    await sweep(pool, timedelta(hours=1))
    again = await cp.claim(w, alive=LONG, budget=LONG)
    assert again.token > old.token, "after the sweep a queued workflow's tokens restarted"


async def test_an_abandoned_age_shorter_than_the_age_sweeps_an_open_workflow_by_it(wd_store: Store) -> None:
    cp, pool = wd_store.checkpointer, pool_of(wd_store)
    w = wf("sweep-rearmed")
    held = await cp.claim(w, alive=LONG, budget=LONG)
    with lifecycle_writes():  # failed, then re-armed: open again
        await cp.record(held, "wd/failed/0", {"attempts": 1})
        await cp.record(held, "wd/rearmed/0", {})
    await cp.release(held)
    await _age(pool, [w])
    assert await sweep(pool, timedelta(hours=3), abandoned_after=timedelta(hours=1)) == 1
    assert await cp.load(w) == {}


async def test_sweep_rechecks_each_workflow_under_its_claim_row_lock(wd_store: Store) -> None:
    # found idle, then, while the sweep waits for the claim row: one gets a young record, one a
    # queue row, one a new live claim. Each must be kept, decided on what is committed by then.
    cp, pool = wd_store.checkpointer, pool_of(wd_store)
    names = {k: wf(f"sweep-race-{k}") for k in ("recorded", "queued", "claimed")}
    passes = {}
    for kind, w in names.items():
        passes[kind] = await cp.claim(w, alive=LONG, budget=LONG)
        with lifecycle_writes():
            await cp.record(passes[kind], "wd/finished", kind)
    await _age(pool, list(names.values()))
    async with pool.connection() as holder:
        await holder.execute(
            "SELECT 1 FROM workflow_claim WHERE workflow = ANY(%s) FOR UPDATE", (list(names.values()),)
        )
        swept = asyncio.create_task(sweep(pool, timedelta(hours=1)))
        await until(lambda: _waiting(pool), "the sweep to wait for a claim row")
        await holder.execute(
            RECORD,
            {"workflow": names["recorded"], "token": passes["recorded"].token, "key": "young", "value": "1"},
        )
        await holder.execute(
            "INSERT INTO workflow_queue (namespace, workflow, visibility) VALUES (%s, %s, now())",
            (wd_store.scheduler.namespace, names["queued"]),
        )
        row = await (
            await holder.execute(CLAIM, {"workflow": names["claimed"], "alive": LONG, "budget": LONG})
        ).fetchone()
        assert row is not None
    assert await asyncio.wait_for(swept, 10) == 0
    for kind, w in names.items():
        assert await cp.load(w) != {}, f"the sweep deleted the records of the {kind} workflow"
    assert (await cp.record(Pass(names["claimed"], int(row[0])), "next", 1)).won, "the new claim was fenced"


async def _waiting(pool: Any) -> bool:
    return await lock_waiters(pool, "workflow_claim") > 0


async def _rows(pool: Any, sql: str) -> list[tuple[Any, ...]]:
    async with pool.connection() as conn:
        return list(await (await conn.execute(sql)).fetchall())


# -- the boundary --------------------------------------------------------------------------------


async def test_unreachable_server_is_one_clear_error_with_the_password_masked() -> None:
    from without_durability.testing.servers import free_port

    port = free_port()
    dsn = f"postgresql://walter:sekret@127.0.0.1:{port}/nowhere"
    pool = psycopg_pool.AsyncConnectionPool(dsn, open=False, min_size=1, max_size=1, timeout=1.0)
    await pool.open(wait=False)
    try:
        with pytest.raises(StoreUnavailable) as caught:
            await PostgresCheckpointer(pool=pool).load("w")
    finally:
        await pool.close()
    message = str(caught.value)
    assert "sekret" not in message, f"the password leaked: {message}"
    assert "***" in message and str(port) in message and "walter" in message, message
    assert "refused" in message, f"the reason the server could not be reached is missing: {message}"
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)


async def test_driver_errors_are_wrapped_with_the_cause(wd_store: Store) -> None:
    url = wd_store.extra["url"]
    async with fresh_schema(url, max_size=2) as (pool, _):
        async with pool.connection() as conn:
            await conn.execute("DROP TABLE workflow_claim")
        with pytest.raises(StoreError, match="claiming") as caught:
            await PostgresCheckpointer(pool=pool).claim("w", alive=LONG, budget=LONG)
    assert not isinstance(caught.value, StoreUnavailable)
    assert isinstance(caught.value.__cause__, psycopg.errors.UndefinedTable)


async def test_server_keeps_its_durability_settings(wd_store: Store) -> None:
    pool = pool_of(wd_store)
    assert await scalar(pool, "SHOW fsync") == "on"
    assert await scalar(pool, "SHOW synchronous_commit") == "on"


async def test_fenced_pass_record_via_missing_claim_row(wd_store: Store) -> None:
    cp, w = wd_store.checkpointer, wf("no-row")
    with pytest.raises(Fenced):
        await cp.renew(Pass(w, 1))
    await cp.release(Pass(w, 1))  # silent
    assert errors.Fenced is Fenced


async def test_numbers_keep_their_type_and_scale(wd_store: Store) -> None:
    cp, w = wd_store.checkpointer, wf("numbers")
    values = {"int": 1, "float": 1.0, "small": 1e-07, "scaled": 123.45, "big": 2**70, "neg": -2.5}
    for key, value in values.items():
        assert await cp.supply(w, key, value) == Recorded(value, True)
    loaded = await cp.load(w)
    assert loaded == values and [type(v) for v in loaded.values()] == [type(v) for v in values.values()], (
        f"numbers changed through jsonb: {loaded!r}"
    )
    one = await cp.supply(w, "int", 1.0)
    assert one == Recorded(1, False), f"1.0 over a stored 1 reported {one!r}"
    for huge in (1e16, 1.5e300, -2.5e20):
        with pytest.raises(InvalidValue, match="integer"):
            await cp.supply(w, "huge", huge)
    assert await cp.supply(w, "text", "1e+16") == Recorded("1e+16", True)


async def test_a_killed_server_is_store_unavailable_then_the_store_recovers(
    wd_store: Store,
) -> None:
    server = wd_store.extra["server"]
    if server.source != "local":
        pytest.skip("only a private server can be killed")
    cp, w = wd_store.checkpointer, wf("restart")
    await cp.supply(w, "k", "committed")
    await asyncio.to_thread(server.restart, kill=True)
    seen: list[BaseException] = []

    async def recovered() -> bool:
        try:
            return await cp.load(w) == {"k": "committed"}
        except StoreError as exc:
            seen.append(exc)
            return False

    await until(recovered, "the store to answer again after the server restarted", within=60)
    assert seen, "the pool's connections to the killed server did not fail"
    for exc in seen:
        assert isinstance(exc, StoreUnavailable), f"expected StoreUnavailable, got {exc!r}"
        assert isinstance(exc.__cause__, psycopg.OperationalError), repr(exc.__cause__)


async def test_discard_forgets_a_record_that_commits_while_discard_waits(wd_store: Store) -> None:
    """discard raises the fence before it deletes, so a record holding the claim row when discard
    starts is waited for and then deleted, never left behind a discard that returned."""
    from without_durability_postgres.checkpointer import RECORD

    cp, pool, w = wd_store.checkpointer, pool_of(wd_store), wf("discard-wait")
    held = await cp.claim(w, alive=LONG, budget=LONG)
    async with pool.connection() as writer:
        params = {"workflow": w, "token": held.token, "key": "late", "value": '"x"'}
        assert await (await writer.execute(RECORD, params)).fetchone() is not None
        discard = asyncio.create_task(cp.discard(w))

        async def discard_is_waiting() -> bool:
            return discard.done() or await lock_waiters(pool, "workflow_claim") > 0

        await until(discard_is_waiting, "discard to wait for the record holding the claim row")
        assert not discard.done(), "discard did not wait for the record in flight"
        await writer.commit()
    await discard
    assert await cp.load(w) == {}, "a record committed while discard waited survived it"
    with pytest.raises(Fenced):
        await cp.record(held, "after", 1)


async def test_times_are_utc_whatever_the_session_time_zone(wd_store: Store) -> None:
    from datetime import UTC

    url, schema = wd_store.extra["url"], wd_store.extra["schema"]
    pool = psycopg_pool.AsyncConnectionPool(
        url,
        open=False,
        min_size=1,
        max_size=2,
        kwargs={"options": f"-c search_path={schema} -c TimeZone=Asia/Kathmandu"},
    )
    await pool.open(wait=True)
    try:
        cp, sched = PostgresCheckpointer(pool=pool), PostgresScheduler(pool=pool)
        w = wf("tz")
        await cp.supply(w, "k", 1)
        (entry,) = await cp.history(w)
        now = await sched.now()
        assert entry.written_at.tzinfo is UTC and now.tzinfo is UTC, (entry, now)
        assert timedelta(0) <= now - entry.written_at < timedelta(seconds=30)
    finally:
        await pool.close()


async def test_an_exhausted_pool_is_not_called_an_unreachable_server(wd_store: Store) -> None:
    url, schema = wd_store.extra["url"], wd_store.extra["schema"]
    pool = psycopg_pool.AsyncConnectionPool(
        url,
        open=False,
        min_size=1,
        max_size=1,
        timeout=0.5,
        kwargs={"options": f"-c search_path={schema}"},
    )
    await pool.open(wait=True)
    try:
        async with pool.connection():  # the only connection, held
            with pytest.raises(StoreError, match="came free") as caught:
                await PostgresCheckpointer(pool=pool).load(wf("busy"))
    finally:
        await pool.close()
    assert not isinstance(caught.value, StoreUnavailable), str(caught.value)
    assert isinstance(caught.value.__cause__, psycopg_pool.PoolTimeout)


@asynccontextmanager
async def one_pooled(store: Store, *, autocommit: bool = False) -> AsyncIterator[Any]:
    """A pool of one connection on the store's schema, so every call takes the one inspected."""
    kwargs: dict[str, Any] = {"options": f"-c search_path={store.extra['schema']}"}
    if autocommit:
        kwargs["autocommit"] = True
    pool = psycopg_pool.AsyncConnectionPool(
        store.extra["url"], open=False, min_size=1, max_size=1, timeout=30, kwargs=kwargs
    )
    await pool.open(wait=True)
    try:
        yield pool
    finally:
        await pool.close()


async def pooled_state(pool: Any) -> tuple[bool, Any, int]:
    """The pool's one connection as the pool hands it out: autocommit, status, backend pid."""
    async with pool.connection() as conn:
        return conn.autocommit, conn.info.transaction_status, conn.info.backend_pid


async def held_turn(store: Store, workflow: str) -> Any:
    """A connection holding ``workflow``'s turn (the lock every append takes) in an open
    transaction, so an append to it waits on the server until the connection rolls back."""
    from without_durability_postgres.checkpointer import ORDER_LOCK

    conn = await psycopg.AsyncConnection.connect(
        store.extra["url"], options=f"-c search_path={store.extra['schema']}"
    )
    await conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (ORDER_LOCK, workflow))
    return conn


async def waiting_append_pid(store: Store) -> int | None:
    return await scalar(  # type: ignore[no-any-return]
        pool_of(store),
        "SELECT pid FROM pg_stat_activity WHERE wait_event = 'advisory' "
        "AND datname = current_database() AND query LIKE '%workflow_seq%'",
    )


class _DividesByZero(PostgresCheckpointer):
    APPEND = "SELECT 1 / 0 AS key, %(workflow)s, %(value)s"


@pytest.mark.parametrize("autocommit", [False, True], ids=["pool-default", "pool-autocommit"])
async def test_one_statement_calls_hand_the_connection_back_as_the_pool_gave_it(
    wd_store: Store, autocommit: bool
) -> None:
    idle = psycopg.pq.TransactionStatus.IDLE
    async with one_pooled(wd_store, autocommit=autocommit) as pool:
        cp, sched, w = PostgresCheckpointer(pool=pool), PostgresScheduler(pool), wf("as-it-came")
        pid = (await pooled_state(pool))[2]
        await cp.append(w, 1)
        assert await pooled_state(pool) == (autocommit, idle, pid), "after an append"
        await sched.schedule(w)
        assert await sched.take(LONG) is not None
        assert await pooled_state(pool) == (autocommit, idle, pid), "after a schedule and a take"
        with pytest.raises(StoreError, match="appending") as caught:
            await _DividesByZero(pool=pool).append(w, 2)
        assert isinstance(caught.value.__cause__, psycopg.errors.DivisionByZero), repr(caught.value.__cause__)
        assert await pooled_state(pool) == (autocommit, idle, pid), "after a statement that failed"
        assert list((await cp.load(w)).values()) == [1]


@asynccontextmanager
async def append_waiting_on_a_held_turn(
    wd_store: Store, pool: Any, cp: PostgresCheckpointer, w: str, value: str
) -> AsyncIterator[tuple[asyncio.Future[str], int]]:
    """An append to ``w`` on the one pooled connection, waiting at the server for ``w``'s turn,
    which another session holds until the block ends; yields the append's task and backend pid."""
    pid = (await pooled_state(pool))[2]
    holder = await held_turn(wd_store, w)
    try:
        task = asyncio.ensure_future(cp.append(w, value))

        async def waiting() -> bool:
            return await waiting_append_pid(wd_store) == pid

        await until(waiting, "the append to wait for the held turn")
        yield task, pid
    finally:
        await holder.close()


async def test_an_append_cancelled_while_it_waits_leaves_the_connection_as_it_came(wd_store: Store) -> None:
    w = wf("cancelled")
    async with one_pooled(wd_store) as pool:
        cp = PostgresCheckpointer(pool=pool)
        async with append_waiting_on_a_held_turn(wd_store, pool, cp, w, "never") as (task, _):
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        got = await pooled_state(pool)
        assert got[:2] == (False, psycopg.pq.TransactionStatus.IDLE), f"handed back as {got}"
        await cp.append(w, "after")
        assert list((await cp.load(w)).values()) == ["after"], "the cancelled append landed"


async def test_a_connection_lost_mid_append_is_store_unavailable_and_never_reused(wd_store: Store) -> None:
    w = wf("lost")
    async with one_pooled(wd_store) as pool:
        cp = PostgresCheckpointer(pool=pool)
        async with append_waiting_on_a_held_turn(wd_store, pool, cp, w, "lost") as (task, pid):
            assert await scalar(pool_of(wd_store), "SELECT pg_terminate_backend(%s)", (pid,)) is True
            with pytest.raises(StoreUnavailable, match="appending") as caught:
                await task
        assert isinstance(caught.value.__cause__, psycopg.OperationalError), repr(caught.value.__cause__)
        await cp.append(w, "after")
        autocommit, status, new_pid = await pooled_state(pool)
        assert new_pid != pid, "the pool handed the lost connection out again"
        assert (autocommit, status) == (False, psycopg.pq.TransactionStatus.IDLE)
        assert list((await cp.load(w)).values()) == ["after"]


# -- an effect that ends its transaction ----------------------------------------------------------

SUPERSEDE_NOW = """
UPDATE workflow_claim SET token = token + 1, alive_until = LEAST(alive_until, now())
 WHERE workflow = %(workflow)s
"""


def _ending(
    *statements: str, then_raise: bool = False, swallow: bool = False, supersede: bool = False
) -> Any:
    """An effect that adds 1 to the ledger (and, asked to, supersedes its pass from another
    connection), then runs ``statements``, any of which may end its transaction."""

    def make(pool: Any, w: str) -> Any:
        async def effect(cursor: Any) -> object:
            await cursor.execute(LEDGER_ADD, {"name": w, "amount": 1})
            if supersede:
                async with pool.connection() as other:
                    await other.execute(SUPERSEDE_NOW, {"workflow": w})
            for statement in statements:
                try:
                    await cursor.execute(statement)
                except Exception:
                    if not swallow:
                        raise
            if then_raise:
                raise RuntimeError("the effect failed after ending its transaction")
            return 1

        return effect

    return make


ENDINGS = {
    "commit then raise": _ending("COMMIT", then_raise=True),
    "commit swallowed, more, return": _ending(
        "COMMIT", "INSERT INTO wd_ledger VALUES ('after', 1)", swallow=True
    ),
    "rollback then return": _ending("ROLLBACK"),
    "rollback, more, return": _ending("ROLLBACK", "INSERT INTO wd_ledger VALUES ('after', 1)"),
    "commit while superseded": _ending("COMMIT", supersede=True),
    "commit and chain": _ending("COMMIT AND CHAIN"),
    "two statements in one string": _ending("SELECT 1; COMMIT; BEGIN"),
    "end then raise": _ending("END", then_raise=True, swallow=True),
    "rollback, write, commit": _ending(
        "ROLLBACK", "INSERT INTO wd_ledger VALUES ('after', 1)", "COMMIT", swallow=True
    ),
}


@pytest.mark.parametrize("label", list(ENDINGS))
async def test_an_effect_that_ends_its_transaction_lands_nothing(wd_store: Store, label: str) -> None:
    cp, pool, w = wd_store.checkpointer, pool_of(wd_store), wf("ends")
    held = await cp.claim(w, alive=LONG, budget=LONG)
    with pytest.raises(StoreError, match=rf"{w!r}, key 'k'.*end"):
        await cp.transact(held, "k", ENDINGS[label](pool, w))
    kept = await scalar(pool, "SELECT count(*) FROM wd_ledger")
    assert kept == 0, f"{label}: {kept} ledger row(s) landed without their record"
    assert await cp.load(w) == {}, f"{label}: recorded though its effect ended the transaction"
    open_guards = await scalar(pool, "SELECT count(*) FROM workflow_transact_guard")
    assert open_guards == 0, f"{label}: {open_guards} guard row(s) left behind"
    if label != "commit while superseded":
        ok = await cp.transact(held, "k", wd_store.effects.ledger_add(w, 2))
        assert ok == Recorded(2, True), f"{label}: the next transact got {ok!r}"
