"""What the SQLite store promises beyond the conformance suite: several OS processes on one file, a
SIGKILL inside a transact, files it must refuse, VACUUM, and SqliteDurable's one commit."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import sys
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from without_durability import (
    Contended,
    Fenced,
    InvalidInput,
    Recorded,
    SchemaMismatch,
    SplitDurable,
    SqliteCheckpointer,
    SqliteConnection,
    SqliteDurable,
    SqliteScheduler,
    StoreError,
    StoreUnavailable,
    sqlite_connect,
)
from without_durability.kits.sqlite import LEDGER_ADD, create_ledger, sqlite_effects
from without_durability.sqlite import SCHEMA_VERSION
from without_durability.testing.harness import StoreUnderTest

pytestmark = pytest.mark.asyncio

WORKER = Path(__file__).with_name("sqlite_worker.py")
LONG = timedelta(hours=1)
DEADLINE = 60.0  # seconds any one wait on a worker may take before the test fails
SEQS = "SELECT seq, key FROM checkpoint"
QUEUE_DOWN = "SELECT RAISE(ABORT, 'queue is down')"


@pytest.fixture
async def durable(tmp_path: Path) -> AsyncIterator[SqliteDurable]:
    store = await SqliteDurable.open(tmp_path / "store.db")
    yield store
    await store.close()


async def spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(WORKER),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


async def read_line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), DEADLINE)
    assert line, f"worker {proc.pid} exited (status {proc.returncode}) without answering"
    return line.decode().strip()


# -- several processes on one file ---------------------------------------------------------------


async def test_processes_racing_on_one_file(tmp_path: Path) -> None:
    path, workers, rounds, per_round = tmp_path / "race.db", 4, 5, 12
    # The workers start on a file that does not exist yet, so they also race to create the schema.
    procs = [await spawn("race", str(path), str(i)) for i in range(workers)]
    results: list[dict[str, Any]] = []
    scheduled: list[str] = []
    setup: SqliteDurable | None = None
    try:
        for proc in procs:
            assert await read_line(proc) == "ready"
        setup = await SqliteDurable.open(path)
        await create_ledger(setup.conn)
        shared = await setup.checkpointer.claim("shared", alive=LONG, budget=LONG)
        for rnd in range(rounds):
            for j in range(per_round):
                scheduled.append(f"job-{rnd}-{j}")
                await setup.scheduler.schedule(scheduled[-1])
            for proc in procs:  # every worker starts the round at once
                assert proc.stdin is not None
                proc.stdin.write(f"round {rnd} {shared.token}\n".encode())
                await proc.stdin.drain()
            results += [json.loads(await read_line(proc)) for proc in procs]
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"quit\n")
            await proc.stdin.drain()
            assert await asyncio.wait_for(proc.wait(), DEADLINE) == 0
        inbox = await setup.checkpointer.load("inbox")
        ledger = await sqlite_effects(setup.conn).ledger_read("shared")
        transacted = await setup.checkpointer.load("shared")
        steps = {rnd: await setup.checkpointer.load(f"claim-{rnd}") for rnd in range(rounds)}
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if setup is not None:
            await setup.close()

    for rnd in range(rounds):
        mine = [r for r in results if r["round"] == rnd]
        winners = [r for r in mine if r["token"] is not None]
        assert len(winners) == 1, f"round {rnd}: expected one claim winner, got {winners}"
        assert winners[0]["token"] == 1, f"round {rnd}: first claim minted token {winners[0]}"
        stored = steps[rnd]["step"]
        step_winners = [r["worker"] for r in mine if r["step"][1]]
        assert step_winners == [stored], f"round {rnd}: step won by {step_winners}, holds {stored}"
        assert all(r["step"][0] == stored for r in mine), f"round {rnd}: {mine}"
        movers = [r["worker"] for r in mine if r["moved"][1]]
        assert len(movers) == 1, f"round {rnd}: transact won by {movers}, expected one"
        assert transacted[f"t{rnd}"] == rnd + 1 and all(r["moved"][0] == rnd + 1 for r in mine)
    assert ledger == rounds, f"the shared ledger moved {ledger} times for {rounds} transact keys"

    keys = [k for r in results for k in r["keys"]]
    assert len(keys) == workers * rounds * 10
    assert len(set(keys)) == len(keys), f"duplicate append keys: {Counter(keys).most_common(3)}"
    assert sorted(inbox) == sorted(keys), f"appends lost: {sorted(set(keys) - set(inbox))[:5]}"
    assert list(inbox) == sorted(inbox), "load order disagrees with append key order"
    for r in results:  # each worker's own appends were sequential, so their keys increase
        assert r["keys"] == sorted(r["keys"]), f"worker {r['worker']} keys out of order"
        for i, key in enumerate(r["keys"]):
            assert inbox[key] == {"w": r["worker"], "r": r["round"], "i": i}

    taken = Counter(w for r in results for w in r["taken"])
    assert sorted(taken) == sorted(scheduled), f"missing takes: {set(scheduled) - set(taken)}"
    assert max(taken.values()) == 1, f"delivered twice: {[w for w, n in taken.items() if n > 1]}"


async def test_sigkill_inside_transact_rolls_the_effect_back(tmp_path: Path) -> None:
    path = tmp_path / "kill.db"
    proc = await spawn("hang", str(path))
    try:
        assert await read_line(proc) == "inside"
        # The effect's transaction really is open: the write lock is held by the worker.
        with pytest.raises(StoreUnavailable, match="busy_timeout"):
            held = await SqliteDurable.open(path, busy_timeout=timedelta(milliseconds=50))
            try:
                await held.checkpointer.supply("victim", "probe", 1)
            finally:
                await held.close()
        proc.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(proc.wait(), DEADLINE) == -signal.SIGKILL
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    after = await SqliteDurable.open(path, busy_timeout=timedelta(seconds=5))
    try:
        kit = sqlite_effects(after.conn)
        assert await kit.ledger_read("victim") == 0, "the killed transact's effect survived"
        assert await after.checkpointer.load("victim") == {}, "the killed transact recorded"
        # The claim committed before the transact began, so it is there; discard frees it.
        await after.checkpointer.discard("victim")
        again = await after.checkpointer.claim("victim", alive=LONG, budget=LONG)
        assert again.token == 3, f"claim 1, discard raised to 2, this claim 3; got {again.token}"
        done = await after.checkpointer.transact(again, "reserve", kit.ledger_add("victim", 1))
        assert done == Recorded(1, True) and await kit.ledger_read("victim") == 1
    finally:
        await after.close()


# -- files it must refuse --------------------------------------------------------------------------


async def test_missing_folder_is_refused_and_not_created(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "store.db"
    with pytest.raises(InvalidInput, match="does not exist") as caught:
        await SqliteDurable.open(path)
    assert str(path) in str(caught.value)
    assert not path.parent.exists()


async def test_a_file_that_is_not_a_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    content = b"these are someone's notes, not a database\n" * 200
    path.write_bytes(content)
    with pytest.raises(InvalidInput, match="not an SQLite database") as caught:
        await SqliteDurable.open(path)
    assert str(path) in str(caught.value)
    assert path.read_bytes() == content, "the store changed a file it refused"


async def test_another_schema_version_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = await SqliteDurable.open(path)
    await store.checkpointer.supply("w", "k", "kept")
    await store.close()
    future = SCHEMA_VERSION + 1
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version = {future}")
    raw.close()
    with pytest.raises(SchemaMismatch, match=f"schema version {future}") as caught:
        SqliteConnection(path)
    assert str(path) in str(caught.value)
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == future
    assert raw.execute("SELECT value FROM checkpoint").fetchall() == [('"kept"',)]
    raw.close()


async def test_a_version_2_file_is_upgraded_to_number_its_takes(tmp_path: Path) -> None:
    """A version 2 file (no take numbers) is upgraded in place: its queued and hidden rows are kept,
    each take then draws a number, and two takes hidden until the same instant get different
    receipts, so the first holder's late answer leaves the second's delivery alone."""
    path = tmp_path / "v2.db"
    async with await SqliteDurable.open(path) as store:
        await store.scheduler.schedule("queued")
        await store.scheduler.schedule("held")
        got = await store.scheduler.take(LONG)
        assert got is not None
    raw = sqlite3.connect(path)
    raw.execute("ALTER TABLE queue DROP COLUMN took")  # what version 2 wrote
    raw.execute("DROP TABLE take_count")
    raw.execute("PRAGMA user_version = 2")
    raw.commit()
    raw.close()
    async with await SqliteDurable.open(path) as store:
        assert await store.scheduler.take(LONG) is not None, "the queued row was lost by the upgrade"
        assert await store.scheduler.take(LONG) is None, "the upgrade made the hidden row visible"
        await store.scheduler.wake_at(got, None)  # handed out before the upgrade: answers nothing
        await store.scheduler.schedule("again")
        first = await store.scheduler.take(timedelta(seconds=30))
        assert first is not None and first.workflow == "again"
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert raw.execute("SELECT n FROM take_count").fetchone()[0] == 2, "the takes were not numbered"
    raw.close()


async def test_another_applications_database_is_refused_untouched(tmp_path: Path) -> None:
    versioned, clashing = tmp_path / "app.db", tmp_path / "clash.db"
    raw = sqlite3.connect(versioned)
    raw.execute("PRAGMA user_version = 7")
    raw.close()
    with pytest.raises(SchemaMismatch, match="another application"):
        await SqliteDurable.open(versioned)
    raw = sqlite3.connect(clashing)
    raw.execute("CREATE TABLE queue (job TEXT)")
    raw.execute("INSERT INTO queue VALUES ('theirs')")
    raw.commit()
    raw.close()
    with pytest.raises(SchemaMismatch, match="queue"):
        await SqliteDurable.open(clashing)
    raw = sqlite3.connect(clashing)
    assert raw.execute("SELECT * FROM queue").fetchall() == [("theirs",)]
    assert raw.execute("PRAGMA user_version").fetchone()[0] == 0
    raw.close()


async def test_an_applications_own_tables_may_share_the_file(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, paid INTEGER)")
    raw.execute("INSERT INTO orders VALUES (1, 0)")
    raw.commit()
    raw.close()
    store = await SqliteDurable.open(path)
    try:
        held = await store.checkpointer.claim("order-1", alive=LONG, budget=LONG)

        def pay(cur: sqlite3.Cursor) -> object:
            cur.execute("UPDATE orders SET paid = 1 WHERE id = 1")
            return "paid"

        assert await store.checkpointer.transact(held, "pay", pay) == Recorded("paid", True)
        paid = await store.conn.read(lambda c: c.execute("SELECT paid FROM orders").fetchone()[0])
        assert paid == 1
    finally:
        await store.close()
    reopened = await SqliteDurable.open(path)  # a second open finds its own schema and keeps it
    assert await reopened.checkpointer.load("order-1") == {"pay": "paid"}
    await reopened.close()


# -- VACUUM, the event loop, the busy timeout ------------------------------------------------------


async def test_vacuum_keeps_seq_and_load_order(tmp_path: Path) -> None:
    path = tmp_path / "vacuum.db"
    store = await SqliteDurable.open(path)
    c = store.checkpointer
    for i in range(30):  # interleave workflows, then discard some, leaving gaps in seq
        await c.supply(f"w{i % 3}", f"k{i}", i)
        await c.append(f"w{i % 3}", i)
    await c.discard("w1")
    before = {w: await c.history(w) for w in ("w0", "w2")}
    seqs = await store.conn.read(lambda cur: cur.execute(SEQS).fetchall())
    await store.close()
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("VACUUM")
    raw.close()
    store = await SqliteDurable.open(path)
    c = store.checkpointer
    try:
        after = {w: await c.history(w) for w in ("w0", "w2")}
        assert after == before, "VACUUM changed history"
        again = await store.conn.read(lambda cur: cur.execute(SEQS).fetchall())
        assert sorted(again) == sorted(seqs), "VACUUM renumbered seq"
        newest = await c.append("w0", "after")
        assert int(newest.removeprefix("inbox/")) > max(seq for seq, _ in seqs)
        keys = [k for k in await c.load("w0") if k.startswith("inbox/")]
        assert keys == sorted(keys) and keys[-1] == newest, f"inbox order after VACUUM: {keys}"
    finally:
        await store.close()


async def test_a_held_write_lock_does_not_block_the_event_loop(durable: SqliteDurable) -> None:
    raw = sqlite3.connect(durable.conn.path, isolation_level=None)
    raw.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    try:
        pending = asyncio.ensure_future(durable.checkpointer.supply("w", "k", 1))
        ticks = 0
        while ticks < 20:  # the loop keeps running while the supply waits on the lock
            await asyncio.sleep(0.005)
            ticks += 1
        assert not pending.done(), "the supply did not wait for the write lock"
    finally:
        raw.execute("ROLLBACK")
        raw.close()
    assert await asyncio.wait_for(pending, DEADLINE) == Recorded(1, True)


async def test_a_lock_held_past_busy_timeout_is_store_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    store = await SqliteDurable.open(path, busy_timeout=timedelta(milliseconds=50))
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreUnavailable, match=str(path)) as caught:
            await store.checkpointer.supply("w", "k", 1)
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    finally:
        raw.execute("ROLLBACK")
        raw.close()
    assert await store.checkpointer.supply("w", "k", 1) == Recorded(1, True)
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.checkpointer.load("w")


# -- SqliteDurable ---------------------------------------------------------------------------------


async def test_durable_refuses_two_connections(tmp_path: Path) -> None:
    path = tmp_path / "two.db"
    one, two = await sqlite_connect(path), await sqlite_connect(path)
    try:
        with pytest.raises(InvalidInput, match="one SqliteConnection"):
            SqliteDurable(SqliteCheckpointer(one), SqliteScheduler(two))
        SqliteDurable(SqliteCheckpointer(one), SqliteScheduler(one))
    finally:
        await one.close()
        await two.close()


async def test_arrive_and_deliver_are_one_commit(durable: SqliteDurable) -> None:
    # Make the queue half fail: a one-commit transition must take the record back with it.
    await durable.conn.write(
        lambda cur: cur.execute(f"CREATE TRIGGER refuse BEFORE INSERT ON queue BEGIN {QUEUE_DOWN}; END")
    )
    with pytest.raises(StoreError, match="queue is down"):
        await durable.arrive("w", "approval", "yes")
    with pytest.raises(StoreError, match="queue is down"):
        await durable.deliver("w", "hello")
    assert await durable.checkpointer.load("w") == {}, "half a transition was committed"
    # The same failure under SplitDurable leaves the record: the test tells the two apart.
    split = SplitDurable(durable.checkpointer, durable.scheduler)
    with pytest.raises(StoreError):
        await split.arrive("w", "approval", "yes")
    assert await durable.checkpointer.load("w") == {"approval": "yes"}


async def test_durable_discard_is_one_commit(durable: SqliteDurable) -> None:
    held = await durable.checkpointer.claim("w", alive=LONG, budget=LONG)
    await durable.arrive("w", "a", 1)
    await durable.conn.write(
        lambda cur: cur.execute(f"CREATE TRIGGER refuse BEFORE DELETE ON queue BEGIN {QUEUE_DOWN}; END")
    )
    with pytest.raises(StoreError, match="queue is down"):
        await durable.discard("w")
    kept = await durable.checkpointer.load("w")
    assert kept == {"a": 1}, f"discard forgot records but kept the queue: {kept}"
    await durable.checkpointer.renew(held)  # the fence did not move either


async def test_effect_errors_pass_through_and_a_committing_effect_is_refused(
    durable: SqliteDurable,
) -> None:
    await create_ledger(durable.conn)
    held = await durable.checkpointer.claim("w", alive=LONG, budget=LONG)

    def broken(cur: sqlite3.Cursor) -> object:
        cur.execute("SELECT * FROM no_such_table")
        return None

    with pytest.raises(sqlite3.OperationalError, match="no_such_table"):
        await durable.checkpointer.transact(held, "k", broken)

    add = sqlite_effects(durable.conn).ledger_add("w", 1)

    def committing(cur: sqlite3.Cursor) -> object:
        result = add(cur)
        cur.execute("COMMIT")
        return result

    with pytest.raises(StoreError, match="must not COMMIT"):
        await durable.checkpointer.transact(held, "k", committing)
    assert await durable.checkpointer.load("w") == {}, "a transact whose effect committed recorded"


def _ended_by(*statements: str, then_raise: bool = False, swallow: bool = False) -> Any:
    """An effect that adds 1 to the ledger and then runs ``statements`` (each may end the
    transaction), swallowing their errors when asked, and raising at the end when asked."""

    def effect(cur: sqlite3.Cursor) -> object:
        cur.execute(LEDGER_ADD, ("w", 1))
        for statement in statements:
            try:
                cur.execute(statement)
            except sqlite3.Error:
                if not swallow:
                    raise
        if then_raise:
            raise RuntimeError("the effect failed after ending the transaction")
        return 1

    return effect


@pytest.mark.wd_store("sqlite")
@pytest.mark.parametrize(
    ("label", "effect"),
    [
        ("commit, begin, raise", _ended_by("COMMIT", "BEGIN IMMEDIATE", then_raise=True)),
        ("commit, begin, return", _ended_by("COMMIT", "BEGIN IMMEDIATE")),
        ("rollback, begin, return", _ended_by("ROLLBACK", "BEGIN IMMEDIATE")),
        ("rollback, return", _ended_by("ROLLBACK")),
        ("end swallowed, return", _ended_by("END", swallow=True)),
        # two refusals: the error names the first
        ("commit, begin swallowed, raise", _ended_by("COMMIT", "BEGIN", swallow=True, then_raise=True)),
        ("commit, begin swallowed, return", _ended_by("COMMIT", "BEGIN", swallow=True)),
        ("executescript commit", None),
        # the guard's own savepoint: releasing or rolling back to it would end what it guards
        ("release the guard", _ended_by("RELEASE wd_transact_effect")),
        ("rollback to the guard", _ended_by("ROLLBACK TO wd_transact_effect", swallow=True)),
        # the guard's name is reserved: a savepoint so named would be the one the guard releases
        ("a savepoint named as the guard", _ended_by("SAVEPOINT wd_transact_effect")),
        ("a table named as the guard", _ended_by("CREATE TABLE wd_transact_effect (x)")),
    ],
)
async def test_an_effect_that_ends_the_transaction_lands_nothing(
    wd_store: StoreUnderTest[Any], label: str, effect: Any
) -> None:
    cp = wd_store.checkpointer
    await create_ledger(wd_store.durable.conn)  # type: ignore[attr-defined]
    held = await cp.claim("w", alive=LONG, budget=LONG)
    if effect is None:

        def effect(cur: sqlite3.Cursor) -> object:
            cur.execute(LEDGER_ADD, ("w", 1))
            cur.executescript("SELECT 1;")  # sqlite3 commits a pending transaction first
            return 1

    with pytest.raises(StoreError, match=r"'w'.*'k'.*end") as refused:
        await cp.transact(held, "k", effect)
    if label.startswith("commit, begin"):
        assert "(COMMIT)" in str(refused.value), f"{label}: not the first thing refused: {refused.value}"
    total = await wd_store.effects.ledger_read("w")
    assert total == 0, f"{label}: the effect's write landed without its record (ledger {total})"
    assert await cp.load("w") == {}, f"{label}: recorded though the effect ended it"
    ok = await cp.transact(held, "k", wd_store.effects.ledger_add("w", 2))
    assert ok == Recorded(2, True), f"{label}: the store was left unusable: {ok!r}"


@pytest.mark.wd_store("sqlite")
async def test_an_effect_that_removes_the_guard_and_commits_is_still_refused(
    wd_store: StoreUnderTest[Any],
) -> None:
    """The savepoint is the guard's second check: an effect that replaced the authorizer and then
    committed gets a ``StoreError`` (the savepoint is gone), and its result is never recorded."""
    cp = wd_store.checkpointer
    held = await cp.claim("w", alive=LONG, budget=LONG)

    def effect(cur: sqlite3.Cursor) -> object:
        cur.connection.set_authorizer(None)  # the first check removed
        cur.execute("COMMIT")
        return 1

    with pytest.raises(StoreError, match=r"'w'.*'k'.*savepoint is gone"):
        await cp.transact(held, "k", effect)
    assert await cp.load("w") == {}, "recorded though the effect ended the transaction"


@pytest.mark.wd_store("sqlite")
async def test_an_effect_may_use_savepoints_of_its_own(wd_store: StoreUnderTest[Any]) -> None:
    """The guard refuses only what could end its transaction: an effect's own savepoints, rolled
    back to and released, work, and only what the effect kept is recorded with it."""
    cp = wd_store.checkpointer
    await create_ledger(wd_store.durable.conn)  # type: ignore[attr-defined]
    held = await cp.claim("w", alive=LONG, budget=LONG)

    def effect(cur: sqlite3.Cursor) -> object:
        cur.execute(LEDGER_ADD, ("w", 1))
        # names sorting before and after the guard's, so no ordering of names stands in for it
        for name in ("a_mine", "z_mine"):
            cur.execute(f"SAVEPOINT {name}")
            cur.execute(LEDGER_ADD, ("w", 10))
            cur.execute(f"ROLLBACK TO {name}")  # undoes the 10, keeps the savepoint open
            cur.execute(f"RELEASE {name}")
        return "kept"

    assert await cp.transact(held, "k", effect) == Recorded("kept", True)
    assert await wd_store.effects.ledger_read("w") == 1, "the effect's own rollback was not kept"
    assert await cp.load("w") == {"k": "kept"}


@pytest.mark.wd_store("sqlite")
async def test_liveness_and_the_budget_count_exactly_from_an_uneven_instant(
    wd_store: StoreUnderTest[Any],
) -> None:
    """A claim's deadlines are its instant plus its spans to the microsecond. The suite's manual
    clock starts on a round instant (2030-01-01) whose low bits are zero, where a deadline that
    or-ed the spans' bits into the instant instead of adding them came out the same; from this
    uneven instant it comes out 1.6 s (liveness) and 0.64 s (budget) early."""
    cp, clock = wd_store.checkpointer, wd_store.clock
    await clock.advance(timedelta(microseconds=1_234_567))
    held = await cp.claim("w", alive=timedelta(seconds=2), budget=timedelta(seconds=3))
    await clock.advance(timedelta(seconds=1.5))
    with pytest.raises(Contended):  # alive until 2 s
        await cp.claim("w", alive=LONG, budget=LONG)
    await cp.renew(held)  # alive until 3.5 s, cut to the budget's 3 s
    await clock.advance(timedelta(seconds=1.2))
    with pytest.raises(Contended):  # 2.7 s: inside the budget
        await cp.claim("w", alive=LONG, budget=LONG)
    await clock.advance(timedelta(seconds=0.5))
    taken = await cp.claim("w", alive=LONG, budget=LONG)  # 3.2 s: the budget is spent
    assert taken.token == held.token + 1


async def test_the_checkpointers_options_are_keyword_only(durable: SqliteDurable) -> None:
    """A codec, a clock or a lease's spans passed by position are refused, not taken for another."""
    with pytest.raises(TypeError):
        SqliteCheckpointer(durable.conn, None)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        await durable.checkpointer.claim("w", LONG, LONG)  # type: ignore[call-arg]


# -- namespaces ----------------------------------------------------------------------------------


async def test_namespaces_share_one_file_and_nothing_else(tmp_path: Path) -> None:
    """Two schedulers on one file, one workflow queued in each: every step in one namespace (take,
    hide, answer, wake, cancel) leaves the other's entry alone. Takes happen at one instant of a
    manual clock, so both receipts carry the same time and only the namespace tells them apart."""
    from without_durability.clock import ManualClock

    conn = await sqlite_connect(tmp_path / "ns.db")
    clock = ManualClock()
    a, b = SqliteScheduler(conn, clock=clock, namespace="a"), SqliteScheduler(conn, clock=clock, namespace="b")
    try:
        await b.schedule("only-b")
        assert await a.take(LONG) is None, "a took b's workflow"
        only_b = await b.take(LONG)
        assert only_b is not None
        await b.wake_at(only_b, None)
        for w in ("done", "again", "cancel"):
            await a.schedule(w)
            await b.schedule(w)
            got_a, got_b = await a.take(LONG), await b.take(LONG)
            assert got_a is not None and got_a.workflow == w
            assert got_b is not None and got_b.workflow == w, f"{w}: a's take hid b's entry"
            if w == "cancel":
                await a.cancel(w)
            else:
                await a.wake_at(got_a, None if w == "done" else clock() + 3 * LONG)
            clock.advance(2 * LONG)
            again = await b.take(LONG)
            assert again is not None and again.workflow == w, f"{w}: a's answer changed b's entry"
            await b.wake_at(again, None)
    finally:
        await conn.close()


async def test_a_superseded_pass_never_calls_its_transact_effect(durable: SqliteDurable) -> None:
    """The fence is checked before the effect: a superseded pass's effect is not even called (the
    check after it would roll its writes back, but not anything else the effect did), whether or
    not another workflow holds a claim with the same token."""
    cp = durable.checkpointer
    old = await cp.claim("w", alive=LONG, budget=LONG)
    await cp.discard("w")
    await cp.claim("w", alive=LONG, budget=LONG)
    other = await cp.claim("v", alive=LONG, budget=LONG)
    assert other.token == old.token  # a claim row elsewhere carries the stale pass's token
    calls: list[str] = []

    def effect(cur: sqlite3.Cursor) -> object:
        calls.append("called")
        return 1

    with pytest.raises(Fenced):
        await cp.transact(old, "k", effect)
    assert calls == [], "the effect of a superseded pass was called"
