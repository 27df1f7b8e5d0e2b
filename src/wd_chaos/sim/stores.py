"""The stores a simulated run holds, each behind the few things the simulator asks of it beyond the
store's own interfaces: the in-store ledger effect and its rows, a look at a workflow's records that
takes no step (whether a cancelled call landed), what a reboot does to the store, and the teardown.

- ``memory``: the Memory store object; a reboot keeps it (its records stand for a file's).
- ``sqlite``: the real SQLite store on a file in a temporary folder, its statements steps of the
  loop (``without_durability.sqlite.stepped``). A reboot opens the same file again on a new
  connection, which the processes started after it use (the ones before it have crashed, or are
  clients that keep their own connection); the records and claims of before are the file's.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from without_durability.testing.kit import find_kit

from .wire import SimDurable, SimHistory, SimRecorder, World

LedgerEffect = Callable[[Any], object]

SIM_LEDGER = "sim_ledger"
"""The simulated run's own ledger table in the SQLite file (the sim creates it; the harness
reaches the store only through its kit, never its modules)."""

CREATE_LEDGER = (
    f"CREATE TABLE IF NOT EXISTS {SIM_LEDGER} (row INTEGER PRIMARY KEY, "
    "workflow TEXT NOT NULL, key TEXT NOT NULL, token INTEGER NOT NULL)"
)

PEEK = "SELECT count(*), coalesce(sum(key = :key), 0) FROM checkpoint WHERE workflow = :workflow"


class MemorySim:
    """The Memory store in a simulated run (see the module docstring)."""

    name = "memory"

    def __init__(self, world: World, mutant: Any) -> None:
        durable = find_kit("memory").simulated(world.wall, world.lease_micros)
        self.durable: Any = mutant.wrap(durable) if mutant is not None else durable

    def recorder(self, world: World, hist: SimHistory, *, faults: bool) -> SimRecorder:
        """A process's recorder over the store as it stands now."""
        return SimRecorder(world, SimDurable(world, self.durable), hist, faults=faults)

    def ledger_effect(self, workflow: str, key: str, token: int) -> LedgerEffect:
        """A ``transact`` effect that appends one ledger row in the store's own state."""

        def effect(state: dict[str, Any]) -> object:
            rows = state.setdefault("chaos_ledger", [])
            row = len(rows) + 1
            rows.append({"row": row, "workflow": workflow, "key": key, "token": token})
            return {"row": row, "token": token}

        return effect

    def ledger_rows(self) -> list[dict[str, Any]]:
        """Every ledger row, in order."""
        return [dict(r) for r in self.durable.checkpointer.state.get("chaos_ledger", [])]

    def holds(self, workflow: str, key: str) -> bool:
        """Whether ``workflow`` holds a record of ``key`` (no step)."""
        return key in self.durable.checkpointer._records.get(workflow, {})

    def reboot(self) -> None:
        """The machine rebooted: the Memory store's records stand for a file's, kept as they are."""

    def close(self) -> None:
        """Nothing to release."""


class _PeekingRecorder(SimRecorder):
    """A recorder that looks at the store's records through ``peek`` (no step) rather than the
    Memory store's dictionary."""

    def __init__(
        self,
        world: World,
        durable: SimDurable,
        hist: SimHistory,
        *,
        faults: bool,
        peek: Callable[[str, str | None], tuple[int, bool]],
    ) -> None:
        super().__init__(world, durable, hist, faults=faults)
        self.peek = peek

    def _mark(self, mine: tuple[str, str | None]) -> tuple[int, bool]:
        return self.peek(*mine)


class SqliteSim:
    """The real SQLite store in a simulated run (see the module docstring)."""

    name = "sqlite"

    def __init__(self, world: World, mutant: Any) -> None:
        self.world = world
        self.mutant = mutant
        self.kit: Any = find_kit("sqlite")
        first = self.kit.simulated(world.wall, world.lease_micros)
        self.conns = [first.conn]
        self.path = first.conn.path
        first.conn._write_now(lambda cur: cur.execute(CREATE_LEDGER))
        self.durable: Any = self._wrap(first)

    def _wrap(self, durable: Any) -> Any:
        return self.mutant.wrap(durable) if self.mutant is not None else durable

    def recorder(self, world: World, hist: SimHistory, *, faults: bool) -> SimRecorder:
        """A process's recorder over the store as it stands now (the connection of this boot)."""
        return _PeekingRecorder(world, SimDurable(world, self.durable), hist, faults=faults, peek=self.peek)

    def peek(self, workflow: str, key: str | None) -> tuple[int, bool]:
        """How many records ``workflow`` holds and whether it holds ``key``, read at once (no
        step) on the newest connection."""
        conn = self.conns[-1]
        row = conn._read_now(lambda cur: cur.execute(PEEK, {"workflow": workflow, "key": key}).fetchone())
        return int(row[0]), key is not None and bool(row[1])

    def ledger_effect(self, workflow: str, key: str, token: int) -> LedgerEffect:
        """A ``transact`` effect that inserts one ledger row in the open transaction."""

        def effect(cur: sqlite3.Cursor) -> object:
            cur.execute(
                f"INSERT INTO {SIM_LEDGER} (workflow, key, token) VALUES (?, ?, ?)",
                (workflow, key, token),
            )
            return {"row": cur.lastrowid, "token": token}

        return effect

    def ledger_rows(self) -> list[dict[str, Any]]:
        """Every ledger row, in order."""

        def job(cur: sqlite3.Cursor) -> list[dict[str, Any]]:
            rows = cur.execute(f"SELECT row, workflow, key, token FROM {SIM_LEDGER} ORDER BY row")
            return [{"row": r, "workflow": w, "key": k, "token": t} for r, w, k, t in rows]

        result: list[dict[str, Any]] = self.conns[-1]._read_now(job)
        return result

    def holds(self, workflow: str, key: str) -> bool:
        """Whether ``workflow`` holds a record of ``key`` (no step)."""
        return self.peek(workflow, key)[1]

    def reboot(self) -> None:
        """The machine rebooted: open the same file again on a new connection (the store's own
        open: the schema check, WAL), for the processes started from now on."""
        durable = self.kit.simulated(self.world.wall, self.world.lease_micros, path=self.path)
        self.conns.append(durable.conn)
        self.durable = self._wrap(durable)

    def close(self) -> None:
        """Close every connection, the first last (it owns the temporary folder)."""
        for conn in reversed(self.conns):
            conn.close_now()


SIM_STORE_TYPES: dict[str, type[MemorySim] | type[SqliteSim]] = {
    "memory": MemorySim,
    "sqlite": SqliteSim,
}
"""The store a simulated run holds, by the kit name ``wd-chaos sim --store`` takes."""


def open_sim_store(name: str, world: World, mutant: Any) -> MemorySim | SqliteSim:
    """The store ``name`` for one simulated run on ``world``'s clocks, ``mutant`` (a catalogue
    entry, or None) applied to it."""
    try:
        kind = SIM_STORE_TYPES[name]
    except KeyError:
        raise ValueError(
            f"wd-chaos sim simulates the {', '.join(SIM_STORE_TYPES)} store(s), not {name!r}"
        ) from None
    return kind(world, mutant)
