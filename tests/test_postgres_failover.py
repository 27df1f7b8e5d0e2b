"""Fast failover on Postgres (``without_durability_postgres.failover``), against a real server: a
SIGKILLed worker's claim and delivery are taken over within the server's detection, not the
lease; a live holder's are not; a holder cut off from the server but still running is fenced.

Run with ``--wd-store postgres``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest

from without_durability.errors import Contended, Fenced
from without_durability.testing.harness import StoreUnderTest

psycopg = pytest.importorskip("psycopg")
psycopg_pool = pytest.importorskip("psycopg_pool")

from without_durability_postgres import (  # noqa: E402
    PostgresCheckpointer,
    PostgresDurable,
    PostgresScheduler,
    PostgresWakeup,
)
from without_durability_postgres.failover import PRESENCE_LOCK  # noqa: E402

pytestmark = [pytest.mark.asyncio, pytest.mark.wd_store("postgres")]

LONG = timedelta(hours=1)
DETECTION = 5.0  # seconds: a SIGKILLed client's session ends within milliseconds; this is slack


@asynccontextmanager
async def worker_side(store: StoreUnderTest[Any], presence: bool = True) -> AsyncIterator[tuple[Any, Any]]:
    """(durable, wakeup) of one more worker on the test's schema, with its own pool and presence."""
    pool: Any = psycopg_pool.AsyncConnectionPool(
        store.extra["url"], open=False, min_size=1, max_size=3,
        kwargs={"options": f"-c search_path={store.extra['schema']}"},
    )  # fmt: skip
    await pool.open(wait=True)
    try:
        async with PostgresWakeup(pool, namespace="default", presence=presence) as wakeup:
            durable = PostgresDurable(
                PostgresCheckpointer(pool, failover=wakeup if presence else None),
                PostgresScheduler(pool, reap_dead=presence),
            )
            yield durable, wakeup
    finally:
        await pool.close()


HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    from datetime import timedelta
    from psycopg_pool import AsyncConnectionPool
    from without_durability_postgres import (
        PostgresCheckpointer, PostgresDurable, PostgresScheduler, PostgresWakeup)

    async def main():
        pool = AsyncConnectionPool(sys.argv[1], open=False, min_size=1, max_size=2,
                                   kwargs={"options": f"-c search_path={sys.argv[2]}"})
        await pool.open(wait=True)
        async with PostgresWakeup(pool, presence=True) as wakeup:
            durable = PostgresDurable(PostgresCheckpointer(pool, failover=wakeup),
                                      PostgresScheduler(pool, reap_dead=True))
            hour = timedelta(hours=1)
            taken = await durable.take_and_claim(hour, alive=hour, budget=hour)
            assert taken is not None and taken[1] is not None, taken
            print(taken[0].workflow, taken[1].token, wakeup.owner, flush=True)
            await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


async def test_a_sigkilled_holders_claim_and_delivery_are_taken_over_within_detection(
    wd_store: StoreUnderTest[Any],
) -> None:
    """A worker process takes and claims a workflow with an hour's lease and visibility, then is
    SIGKILLed: another worker's take hands the delivery out again and its claim succeeds with a
    higher token within seconds. While the holder lives, neither happens (so the test can fail)."""
    async with worker_side(wd_store) as (durable, _):
        await durable.arrive("ff-kill", "go", 1)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", HOLDER, wd_store.extra["url"], wd_store.extra["schema"],
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            workflow, token, owner = line.decode().split()
            assert workflow == "ff-kill" and owner != "None", line
            # alive: its presence lock is held, so nothing is taken over
            assert await durable.take_and_claim(LONG, alive=LONG, budget=LONG) is None
            with pytest.raises(Contended):
                await durable.checkpointer.claim("ff-kill", alive=LONG, budget=LONG)
            os.kill(proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            await proc.wait()
            while True:
                taken = await durable.take_and_claim(LONG, alive=LONG, budget=LONG)
                if taken is not None:
                    break
                assert time.monotonic() - killed < DETECTION, (
                    "the dead holder's delivery was not handed out again"
                )
                await asyncio.sleep(0.02)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        delivery, pass_, records = taken
        assert delivery.workflow == "ff-kill" and pass_ is not None
        assert pass_.token > int(token), "the takeover must fence the dead pass with a higher token"
        assert records == {"go": 1}


async def test_the_plain_claim_and_take_take_over_a_dead_owner(wd_store: StoreUnderTest[Any]) -> None:
    """The three calls (take, then claim) too: a holder whose presence session ended (closed here,
    as a process exit would) loses its claim and its hidden delivery as soon as the server has
    ended that session (its backend exits a moment after the client closes the socket)."""
    async with worker_side(wd_store) as (mine, _):
        await mine.arrive("ff-plain", "go", 1)
        async with worker_side(wd_store) as (theirs, _):
            delivery = await theirs.scheduler.take(LONG)
            assert delivery is not None and delivery.workflow == "ff-plain"
            old = await theirs.checkpointer.claim("ff-plain", alive=LONG, budget=LONG)
            assert await mine.scheduler.take(LONG) is None
            with pytest.raises(Contended):
                await mine.checkpointer.claim("ff-plain", alive=LONG, budget=LONG)
        closed = time.monotonic()  # the holder's pool and presence are closed now
        while (again := await mine.scheduler.take(LONG)) is None:
            assert time.monotonic() - closed < DETECTION, (
                "the closed holder's delivery was not handed out again"
            )
            await asyncio.sleep(0.02)
        assert again.workflow == "ff-plain"
        new = await mine.checkpointer.claim("ff-plain", alive=LONG, budget=LONG)
        assert new.token > old.token


async def test_a_holder_cut_off_but_alive_is_fenced(wd_store: StoreUnderTest[Any]) -> None:
    """The holder's presence session is ended by the server (as when its connection is cut) while
    its process runs on: its claim is taken over, and every write of its pass is refused."""
    async with worker_side(wd_store) as (theirs, their_wakeup), worker_side(wd_store) as (mine, _):
        old = await theirs.checkpointer.claim("ff-cut", alive=LONG, budget=LONG)
        await theirs.checkpointer.record(old, "before", 1)
        with pytest.raises(Contended):  # its presence is held: no takeover
            await mine.checkpointer.claim("ff-cut", alive=LONG, budget=LONG)
        async with mine.pool.connection() as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (their_wakeup.backend_pid,))
        deadline = time.monotonic() + DETECTION
        while True:
            try:
                new = await mine.checkpointer.claim("ff-cut", alive=LONG, budget=LONG)
                break
            except Contended:
                assert time.monotonic() < deadline, "the cut-off holder's claim was not taken over"
                await asyncio.sleep(0.02)
        assert new.token > old.token
        with pytest.raises(Fenced):
            await theirs.checkpointer.record(old, "after", 2)
        with pytest.raises(Fenced):
            await theirs.checkpointer.renew(old)

        async def effect(cursor: Any) -> object:
            await cursor.execute("SELECT 1")
            return "ran"

        with pytest.raises(Fenced):
            await theirs.checkpointer.transact(old, "effect", effect)
        assert await mine.checkpointer.load("ff-cut") == {"before": 1}
        await mine.checkpointer.record(new, "after", 3)
        assert await mine.checkpointer.load("ff-cut") == {"before": 1, "after": 3}


async def test_without_a_presence_claims_keep_their_lease(wd_store: StoreUnderTest[Any]) -> None:
    """A claim made with no presence (owner None, as while the listener reconnects, or without
    failover) is protected by its lease alone, whoever is gone."""
    async with worker_side(wd_store) as (mine, _):
        async with worker_side(wd_store, presence=False) as (theirs, _):
            await theirs.checkpointer.claim("ff-lease", alive=LONG, budget=LONG)
        with pytest.raises(Contended):
            await mine.checkpointer.claim("ff-lease", alive=LONG, budget=LONG)


@pytest.mark.parametrize("seconds", [1, 25 * 24 * 3600])
async def test_a_presence_timeout_the_server_would_refuse_is_refused_up_front(seconds: int) -> None:
    """Under 2 s detection would flap; past a day (the server refuses tcp_user_timeout past about
    24 days) the listener could never take its presence: both are named when the listener is made,
    not met later as an unreachable server."""
    from psycopg_pool import AsyncConnectionPool

    from without_durability.errors import InvalidInput

    pool: AsyncConnectionPool[Any] = AsyncConnectionPool("postgresql://nowhere/x", open=False)
    with pytest.raises(InvalidInput, match="presence_timeout must be a timedelta from 2 s to 1 day"):
        PostgresWakeup(pool, presence=True, presence_timeout=timedelta(seconds=seconds))


async def test_the_suites_store_claims_as_its_fast_failover_setting_says(wd_store: StoreUnderTest[Any]) -> None:
    """The suite's store records its presence as a claim's owner exactly when it was opened with
    fast failover (``WD_POSTGRES_FAST_FAILOVER=1``, the CI leg that runs the suite again on the
    ``*_OWNED`` statements); without it, claims have no owner. So neither leg runs the other's."""
    from without_durability_postgres.kit import fast_failover_wanted

    durable = wd_store.durable
    await durable.arrive("ff-suite", "go", 1)
    taken = await durable.checkpointer.claim("ff-suite", alive=LONG, budget=LONG)
    async with wd_store.extra["pool"].connection() as conn:
        cur = await conn.execute("SELECT owner FROM workflow_claim WHERE workflow = 'ff-suite'")
        row = await cur.fetchone()
    assert row is not None and taken.token > 0
    if fast_failover_wanted():
        assert row[0] is not None, "fast failover on, yet the suite's claim recorded no owner"
    else:
        assert row[0] is None, f"fast failover off, yet the suite's claim recorded owner {row[0]}"


# -- mixed fleets: a claim made without fast failover carries no owner --------------------------


async def _plain_claim(durable: Any, workflow: str, how: str) -> Any:
    """B's claim of ``workflow`` without fast failover: ``claim`` (CLAIM), or ``take_and_claim``
    (TAKE_AND_CLAIM) of the delivery an ``arrive`` just made due."""
    if how == "claim":
        return await durable.checkpointer.claim(workflow, alive=LONG, budget=LONG)
    await durable.arrive(workflow, f"due-{workflow}", 1)
    taken = await durable.take_and_claim(LONG, alive=LONG, budget=LONG)
    assert taken is not None and taken[0].workflow == workflow and taken[1] is not None, taken
    return taken[1]


@pytest.mark.parametrize("how", ["claim", "take_and_claim"])
async def test_a_plain_claim_does_not_inherit_the_last_fast_failover_holders_owner(
    wd_store: StoreUnderTest[Any], how: str
) -> None:
    """Issue #45's sequence. A (fast failover) claims, records and releases; B (no fast failover)
    claims the row with an hour's lease; A's presence ends. B is alive and well inside its lease,
    so C (fast failover) gets Contended, C's reaping take hands nothing out, and B writes on."""
    workflow = f"mixed-{how}"
    async with worker_side(wd_store) as (c, _), worker_side(wd_store, presence=False) as (b, _):
        async with worker_side(wd_store) as (a, a_wakeup):
            assert a_wakeup.owner is not None
            first = await a.checkpointer.claim(workflow, alive=LONG, budget=LONG)
            await a.checkpointer.record(first, "a", 1)
            await a.checkpointer.release(first)
            held = await _plain_claim(b, workflow, how)
            async with c.pool.connection() as conn:
                cur = await conn.execute("SELECT token, owner FROM workflow_claim WHERE workflow = %s", (workflow,))
                row = await cur.fetchone()
            assert row == (held.token, None), (
                f"B's plain claim left the row as (token, owner) = {row}, want ({held.token}, None):"
                f" {a_wakeup.owner} is A's presence id, left behind by A's released claim"
            )
            a_owner = a_wakeup.owner
        # A's pool and presence are closed; wait until the server has let A's presence lock go
        ended = time.monotonic()
        async with c.pool.connection() as admin:
            while True:
                async with admin.transaction():
                    cur = await admin.execute(
                        "SELECT pg_try_advisory_xact_lock(%s, %s)", (PRESENCE_LOCK, a_owner)
                    )
                    free = await cur.fetchone()
                if free is not None and free[0]:
                    break
                assert time.monotonic() - ended < DETECTION, "A's presence lock was not let go"
                await asyncio.sleep(0.02)
        if how == "take_and_claim":  # B's delivery is hidden by B's live take: a reap must not show it
            assert await c.scheduler.take(LONG) is None, "C's reaping take handed out B's delivery"
        with pytest.raises(Contended):
            await c.checkpointer.claim(workflow, alive=LONG, budget=LONG)
        await b.checkpointer.record(held, "b", 2)  # not Fenced: B's pass is the live one
        await b.checkpointer.renew(held)
        assert await b.checkpointer.load(workflow) == {"a": 1, "b": 2} | (
            {f"due-{workflow}": 1} if how == "take_and_claim" else {}
        )


async def test_a_reaping_take_leaves_a_plain_workers_live_claim_alone(wd_store: StoreUnderTest[Any]) -> None:
    """A claim with no owner is a plain worker's: its lease, not a presence, says whether it is
    alive. B (no fast failover) takes a delivery and claims it for an hour; C's takes reap (fast
    failover). C's take must hand nothing out and B must write on: a reap that read "no owner" as
    "owner gone" would lapse every plain worker's live pass in a mixed fleet."""
    workflow = "mixed-ownerless"
    async with worker_side(wd_store) as (c, c_wakeup), worker_side(wd_store, presence=False) as (b, _):
        assert c_wakeup.owner is not None
        held = await _plain_claim(b, workflow, "take_and_claim")
        assert await c.scheduler.take(LONG) is None, "C's reaping take handed out B's live delivery"
        with pytest.raises(Contended):
            await c.checkpointer.claim(workflow, alive=LONG, budget=LONG)
        await b.checkpointer.record(held, "b", 1)  # not Fenced: B's pass is the live one


async def _until_gone(durable: Any, owner: int) -> None:
    """Wait until the server has ended ``owner``'s presence session (its lock can be taken)."""
    deadline = time.monotonic() + DETECTION
    while True:
        async with durable.pool.connection() as conn:  # an xact lock: gone with this transaction
            cur = await conn.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", (PRESENCE_LOCK, owner))
            row = await cur.fetchone()
        if row is not None and row[0]:
            return
        assert time.monotonic() < deadline, "the closed holder's presence session did not end"
        await asyncio.sleep(0.02)


async def test_a_reap_frees_the_dead_owners_hidden_rows_and_nothing_else(wd_store: StoreUnderTest[Any]) -> None:
    """REAP makes visible now the queue rows, in its own namespace, of the workflows whose claim
    owner is gone, and only those: a live owner's hidden row stays hidden, the same workflow's row
    in another namespace stays hidden, and a row of the dead owner's that was already due keeps
    its time (so the earlier wakeup is still handed out first)."""
    async with worker_side(wd_store) as (mine, _):
        other = PostgresScheduler(mine.pool, namespace="other")
        await mine.scheduler.schedule("live-w")
        live = await mine.take_and_claim(LONG, alive=LONG, budget=LONG)
        assert live is not None and live[0].workflow == "live-w" and live[1] is not None
        await other.schedule("dead-w")
        assert (hidden := await other.take(LONG)) is not None and hidden.workflow == "dead-w"
        async with worker_side(wd_store) as (theirs, their_wakeup):
            owner = their_wakeup.owner
            assert owner is not None
            await theirs.scheduler.schedule("dead-w")
            dead = await theirs.take_and_claim(LONG, alive=LONG, budget=LONG)
            assert dead is not None and dead[0].workflow == "dead-w" and dead[1] is not None
            await theirs.checkpointer.claim("dead-due", alive=LONG, budget=LONG)
            now = await mine.scheduler.now()
            await mine.scheduler.schedule("dead-due", now - timedelta(seconds=20))
            await mine.scheduler.schedule("plain-due", now - timedelta(seconds=10))
        await _until_gone(mine, owner)
        got = []
        while (d := await mine.scheduler.take(LONG)) is not None:
            got.append(d.workflow)
        assert got == ["dead-due", "plain-due", "dead-w"], (
            f"after the reap, takes handed out {got}: expected the dead owner's due row first (its time "
            "kept), then the other due row, then its hidden row made visible, and not the live owner's"
        )
        assert await other.take(LONG) is None, "the reap made another namespace's hidden row visible"


async def test_a_reap_skips_a_dead_owners_claim_row_another_transaction_holds(
    wd_store: StoreUnderTest[Any],
) -> None:
    """Reaps never wait on a claim row a transaction in flight holds (a renewal, a record, another
    reap): the take that reaps hands out what it can at once."""
    async with worker_side(wd_store) as (mine, _):
        async with worker_side(wd_store) as (theirs, their_wakeup):
            owner = their_wakeup.owner
            assert owner is not None
            await theirs.checkpointer.claim("held-w", alive=LONG, budget=LONG)
        await _until_gone(mine, owner)
        await mine.scheduler.schedule("due-w")
        holder = await psycopg.AsyncConnection.connect(
            wd_store.extra["url"], options=f"-c search_path={wd_store.extra['schema']}"
        )
        try:
            await holder.execute("SELECT 1 FROM workflow_claim WHERE workflow = 'held-w' FOR UPDATE")
            async with asyncio.timeout(5):  # a reap waiting on the held row fails here
                got = await mine.scheduler.take(LONG)
            assert got is not None and got.workflow == "due-w"
        finally:
            await holder.close()
