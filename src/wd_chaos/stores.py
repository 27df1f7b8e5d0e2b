"""Open a store's Durable from a store spec, in any process of a run (workers, writers, the
controller), through the store's kit (``without_durability.testing.kit``), and break it the way a
catalogue mutant says.

A spec is a small JSON-ready dict so it can be handed to worker processes on their command line: the
kit's own ``worker_spec`` (where the store is, a per-run namespace) plus ``store`` (the kit's name),
``namespace``, ``wall_offset`` and optionally ``mutant`` (a catalogue entry of that store), ``ttl``
and ``prepare``. Nothing here names a store.
"""

from __future__ import annotations

from typing import Any

from without_durability.testing.kit import WALL_OFFSET, Opened, Spec, find_kit, resolve, stepped_clock

__all__ = ["WALL_OFFSET", "Opened", "Spec", "find_mutant", "open_store", "prepare", "stepped_clock", "store_clocks"]


def _kit_name(spec: Spec) -> str:
    # ``kind`` is what runs recorded before kits (sqlite, postgres, redis)
    return str(spec.get("store") or spec.get("kind"))


async def open_store(spec: Spec) -> Opened:
    """Open the store ``spec`` names (and, with ``mutant``, break it the way that catalogue entry
    says; a generated mutant in ``WD_MUTANT_EDIT`` is put in place in this process first)."""
    from .mutate.patch import apply_from_env

    apply_from_env()
    kit = find_kit(_kit_name(spec))
    opened = await kit.open_worker(spec)
    if spec.get("mutant"):
        opened.durable = find_mutant(str(spec["mutant"]), kit.name).wrap(opened.durable)
    return opened


def find_mutant(name: str, store: str) -> Any:
    """The catalogue entry ``name`` (every installed kit's mutants, plus the modules
    ``WD_MUTANT_MODULES`` names), checked to break ``store`` (a kit name or alias)."""
    from .mutants import catalogue, modules_from_env

    # A run needs the mutant, not its killers checked (that imports the conformance suite).
    found = {m.name: m for m in catalogue(modules_from_env(), check=False)}
    if name not in found:
        raise ValueError(f"no mutant {name!r}; the catalogue has {sorted(found)}")
    mutant = found[name]
    kit = resolve(store)
    if mutant.store != kit:
        raise ValueError(f"mutant {name!r} breaks the {mutant.store} store, not {kit}")
    return mutant


def store_clocks(spec: Spec, checkpointer: Any) -> dict[str, str]:
    """Which clocks the store's decisions ran on, as the checkers need them (the kit's
    ``clocks``): ``store_clock`` ``"local"`` or ``"remote"``, ``lease_clock`` ``"monotonic"`` or
    ``"wall"``."""
    return find_kit(_kit_name(spec)).clocks(spec, checkpointer)


async def prepare(spec: Spec) -> None:
    """Create what a run needs in the store before any worker starts (schema, ledger)."""
    opened = await open_store({**spec, "prepare": True})
    await opened.close()
