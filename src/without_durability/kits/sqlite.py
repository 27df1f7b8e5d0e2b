"""The SQLite store's kit: for the suite, a fresh file per test, a manual clock the suite moves, and
ledger effects written in SQL against the open transaction's cursor; for wd-chaos, one file in the
run's folder that every worker process opens, on the system clock a ``wall-step`` fault moves;
for wd-chaos sim, the real store with its statements as steps of the simulator's loop.

The ledger tables are test data, not product schema: the kit creates them in each file.
"""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from .._values import Pass
from ..clock import ManualClock, monotonic_micros, system_clock
from ..sqlite import (
    SqliteCheckpointer,
    SqliteConnection,
    SqliteDurable,
    SqliteEffect,
    SqliteScheduler,
    sqlite_connect,
)
from ..sqlite.stepped import SteppedSqliteConnection
from ..testing.harness import EffectFailed, EffectKit, ManualTestClock, StoreUnderTest
from ..testing.kit import WALL_OFFSET, MutatePlan, Opened, Spec, StoreKit, stepped_clock
from ..testing.simulated import SimulatedStore, Wrap

LEDGER_TABLE = "wd_test_ledger"

CREATE_LEDGER = f"""
CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} (
    name TEXT PRIMARY KEY,
    total INTEGER NOT NULL
) WITHOUT ROWID
"""

LEDGER_ADD = f"""
INSERT INTO {LEDGER_TABLE} (name, total) VALUES (?, ?)
ON CONFLICT (name) DO UPDATE SET total = {LEDGER_TABLE}.total + excluded.total
RETURNING total
"""

LEDGER_READ = f"SELECT total FROM {LEDGER_TABLE} WHERE name = ?"


async def create_ledger(conn: SqliteConnection) -> None:
    """Create the test ledger table in ``conn``'s file (harmless if it exists)."""
    await conn.write(lambda cur: cur.execute(CREATE_LEDGER))


def sqlite_effects(conn: SqliteConnection) -> EffectKit[SqliteEffect]:
    """Ledger effects in SQL over the transaction's cursor (the ledger table must exist)."""

    def ledger_add(name: str, amount: int) -> SqliteEffect:
        def effect(cur: sqlite3.Cursor) -> object:
            return int(cur.execute(LEDGER_ADD, (name, amount)).fetchone()[0])

        return effect

    async def ledger_read(name: str) -> int:
        def job(cur: sqlite3.Cursor) -> int:
            row = cur.execute(LEDGER_READ, (name,)).fetchone()
            return 0 if row is None else int(row[0])

        return await conn.read(job)

    def superseding(pass_: Pass, inner: SqliteEffect) -> SqliteEffect:
        def effect(cur: sqlite3.Cursor) -> object:
            result = inner(cur)
            # Inside one IMMEDIATE transaction nobody else can claim, so the newer claim is made
            # through the same cursor; the store must notice it when it re-checks the fence.
            cur.execute(
                "UPDATE claim SET token = token + 1 WHERE workflow = ? AND token = ?",
                (pass_.workflow, pass_.token),
            )
            return result

        return effect

    def failing(inner: SqliteEffect) -> SqliteEffect:
        def effect(cur: sqlite3.Cursor) -> object:
            inner(cur)
            raise EffectFailed("effect failed after performing its write")

        return effect

    return EffectKit(ledger_add, ledger_read, superseding, failing)


@asynccontextmanager
async def open_sqlite(_server: object) -> AsyncIterator[StoreUnderTest[SqliteEffect]]:
    """A fresh SQLite store in a new temporary file, on a manual clock."""
    clock = ManualClock()
    with tempfile.TemporaryDirectory(prefix="wd-sqlite-") as folder:
        path = Path(folder) / "store.db"
        durable = await SqliteDurable.open(path, clock=clock)
        try:
            await create_ledger(durable.conn)
            yield StoreUnderTest(
                "sqlite",
                durable,
                ManualTestClock(clock),
                sqlite_effects(durable.conn),
                extra={"path": path},
            )
        finally:
            await durable.close()


# -- wd-chaos: one file shared by the run's processes ---------------------------------------------

CHAOS_LEDGER = "chaos_ledger"


async def open_sqlite_worker(spec: Spec) -> Opened:
    """Open the run's SQLite file ``spec["path"]`` with the chaos ledger (``synchronous=NORMAL``
    when ``spec["relaxed"]``)."""
    conn = await sqlite_connect(spec["path"])
    if spec.get("relaxed"):  # a power-loss-relaxed run: the WAL is fsynced at checkpoints only
        await conn._submit(lambda: conn._require().execute("PRAGMA synchronous=NORMAL"))
    # the wall clock a wall-step fault moves; claim deadlines stay on the monotonic clock, as the
    # store's own default puts them
    clock = stepped_clock(spec["wall_offset"]) if spec.get("wall_offset") else system_clock
    durable = SqliteDurable(
        SqliteCheckpointer(conn, clock=clock, lease_clock=monotonic_micros),
        SqliteScheduler(conn, clock=clock, namespace=spec.get("namespace", "default")),
    )
    if spec.get("prepare"):
        await conn.write(
            lambda cur: cur.execute(
                f"CREATE TABLE IF NOT EXISTS {CHAOS_LEDGER} (row INTEGER PRIMARY KEY, "
                "workflow TEXT NOT NULL, key TEXT NOT NULL, token INTEGER NOT NULL)"
            )
        )

    def ledger_effect(
        workflow: str, key: str, token: int, failpoint: Callable[[], None]
    ) -> Callable[[sqlite3.Cursor], object]:
        def effect(cur: sqlite3.Cursor) -> object:
            cur.execute(
                f"INSERT INTO {CHAOS_LEDGER} (workflow, key, token) VALUES (?, ?, ?)",
                (workflow, key, token),
            )
            row = cur.lastrowid
            failpoint()  # a kill here dies with the transaction open: the row must roll back
            return {"row": row, "token": token}

        return effect

    async def read_ledger(workflows: list[str]) -> list[dict[str, Any]]:
        def job(cur: sqlite3.Cursor) -> list[dict[str, Any]]:
            rows = cur.execute(f"SELECT row, workflow, key, token FROM {CHAOS_LEDGER} ORDER BY row")
            return [{"row": r, "workflow": w, "key": k, "token": t} for r, w, k, t in rows]

        wanted = set(workflows)
        return [r for r in await conn.read(job) if r["workflow"] in wanted]

    async def read_queue() -> dict[str, int]:
        namespace = durable.scheduler.namespace

        def job(cur: sqlite3.Cursor) -> dict[str, int]:
            rows = cur.execute("SELECT workflow, count(*) FROM queue WHERE namespace = ? GROUP BY workflow", (namespace,))
            return {str(w): int(n) for w, n in rows}

        return await conn.read(job)

    return Opened(durable, durable.close, ledger_effect, read_ledger, read_queue=read_queue)


class SqliteKit(StoreKit):
    """SQLite: no server; every process of a run opens the same file."""

    name = "sqlite"
    description = "one SQLite file in WAL mode (stdlib sqlite3)"
    provides = frozenset({"workers", "power-loss", "simulated"})
    default = True  # no server to start: a first run works on a bare machine
    mutant_modules = ("without_durability.kits.sqlite_mutants",)
    mutate_plan = MutatePlan(
        statements=("without_durability.sqlite",),  # the store's module (or package) of statements
        equivalents="without_durability.kits:sqlite_equivalent.toml",
        tests=("tests/test_lease_clock.py", "tests/test_conformance.py", "tests/test_sqlite.py"),
        scenarios=("lease-stall", "kill-between-effect-and-record"),
        # the claim, renewal, fence and budget decisions (wd-chaos mutate --python)
        python=("src/without_durability/sqlite/checkpointer.py",),
    )

    def open(self, server: object) -> Any:
        """A fresh store in a new temporary file, on a manual clock."""
        return open_sqlite(server)

    def worker_spec(self, server: Any, run_dir: Path, tag: str) -> Spec:
        """The run's file, and the offset file a ``wall-step`` fault writes (its clock follows it)."""
        return {"path": str(run_dir / "store.db"), "wall_offset": str(run_dir / WALL_OFFSET)}

    async def open_worker(self, spec: Spec) -> Opened:
        """Open the run's file (see ``open_sqlite_worker``)."""
        return await open_sqlite_worker(spec)

    def open_simulated(
        self, clock: Callable[[], datetime], lease_clock: Callable[[], int], wrap: Wrap | None = None
    ) -> SqliteSimulated:
        """The real SQLite store on the simulator's clocks (see ``SqliteSimulated``)."""
        return SqliteSimulated(clock, lease_clock, wrap)


# -- wd-chaos sim: the real store, its statements steps of the simulator's loop --------------------

SIM_LEDGER = "sim_ledger"
"""A simulated run's ledger table in its SQLite file."""

PEEK = "SELECT count(*), coalesce(sum(key = :key), 0) FROM checkpoint WHERE workflow = :workflow"


def simulated_durable(
    clock: Callable[[], datetime], lease_clock: Callable[[], int], path: Path | None = None
) -> SqliteDurable:
    """The real SQLite store on the given clocks over a ``SteppedSqliteConnection`` (each batch of
    statements one step of the running loop, no thread): on the file ``path``, or on a new file in
    a new temporary folder that closing the connection removes. Commits skip the fsync: a
    simulated reboot keeps what the OS was handed, and no simulated run loses power."""
    if path is None:
        conn = SteppedSqliteConnection.temporary(synchronous="OFF")
    else:
        conn = SteppedSqliteConnection(path, synchronous="OFF")
    return SqliteDurable(
        SqliteCheckpointer(conn, clock=clock, lease_clock=lease_clock),
        SqliteScheduler(conn, clock=clock),
    )


class SqliteSimulated(SimulatedStore):
    """The real SQLite store in a simulated run, on a file in a temporary folder. A reboot opens
    the same file again on a new connection (the store's own open: the schema check, WAL), which
    the processes started after it use (those of before have crashed, or keep their own); the
    records and claims of before are the file's."""

    def __init__(
        self, clock: Callable[[], datetime], lease_clock: Callable[[], int], wrap: Wrap | None = None
    ) -> None:
        self.clock = clock
        self.lease_clock = lease_clock
        self.wrap = wrap
        first = simulated_durable(clock, lease_clock)
        self.conns: list[SteppedSqliteConnection] = [first.conn]  # type: ignore[list-item]
        self.path = first.conn.path
        self.conns[0]._write_now(
            lambda cur: cur.execute(
                f"CREATE TABLE IF NOT EXISTS {SIM_LEDGER} (row INTEGER PRIMARY KEY, "
                "workflow TEXT NOT NULL, key TEXT NOT NULL, token INTEGER NOT NULL)"
            )
        )
        self.durable: Any = self._wrapped(first)

    def _wrapped(self, durable: SqliteDurable) -> Any:
        return self.wrap(durable) if self.wrap is not None else durable

    def ledger_effect(self, workflow: str, key: str, token: int) -> SqliteEffect:
        """An effect that inserts one ledger row in the open transaction."""

        def effect(cur: sqlite3.Cursor) -> object:
            cur.execute(
                f"INSERT INTO {SIM_LEDGER} (workflow, key, token) VALUES (?, ?, ?)", (workflow, key, token)
            )
            return {"row": cur.lastrowid, "token": token}

        return effect

    def ledger_rows(self) -> list[dict[str, Any]]:
        """Every ledger row, in order, read at once on the newest connection."""

        def job(cur: sqlite3.Cursor) -> list[dict[str, Any]]:
            rows = cur.execute(f"SELECT row, workflow, key, token FROM {SIM_LEDGER} ORDER BY row")
            return [{"row": r, "workflow": w, "key": k, "token": t} for r, w, k, t in rows]

        return self.conns[-1]._read_now(job)

    def peek(self, workflow: str, key: str | None) -> tuple[int, bool]:
        """The workflow's records in the file, read at once (no step) on the newest connection."""
        row = self.conns[-1]._read_now(
            lambda cur: cur.execute(PEEK, {"workflow": workflow, "key": key}).fetchone()
        )
        return int(row[0]), key is not None and bool(row[1])

    def scheduler_in(self, namespace: str) -> Any:
        """The store's scheduler in ``namespace``, on the newest connection to the run's file (the
        same queue table, another namespace), the mutant's ``wrap`` applied to a durable around it."""
        conn = self.conns[-1]
        # a durable, not the scheduler alone: the mutant's wrap takes a whole durable
        checkpointer = SqliteCheckpointer(conn, clock=self.clock, lease_clock=self.lease_clock)
        durable = SqliteDurable(checkpointer, SqliteScheduler(conn, clock=self.clock, namespace=namespace))
        return self._wrapped(durable).scheduler

    def reboot(self) -> None:
        """Open the same file again on a new connection, for the processes started from now on."""
        durable = simulated_durable(self.clock, self.lease_clock, self.path)
        self.conns.append(durable.conn)  # type: ignore[arg-type]
        self.durable = self._wrapped(durable)

    def close(self) -> None:
        """Close every connection, the first last (it owns the temporary folder)."""
        for conn in reversed(self.conns):
            conn.close_now()


KIT = SqliteKit()
