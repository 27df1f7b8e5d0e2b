"""Open a store's Durable from a store spec, in any process of a run (workers, writers, the
controller), through the store's kit (``without_durability.testing.kit``), wrapped as its caller
says (a catalogue mutant's wrap: ``wd_chaos.mutation.catalogue.mutant_wrap``).

A spec is a small JSON-ready dict so it can be handed to worker processes on their command line: the
kit's own ``worker_spec`` (where the store is, a per-run namespace) plus ``store`` (the kit's name),
``namespace``, ``wall_offset`` and optionally ``mutant`` (a catalogue entry of that store), ``ttl``
and ``prepare``. Nothing here names a store or knows a mutant: this module is below both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from without_durability.testing.kit import WALL_OFFSET, Opened, Spec, find_kit, stepped_clock

__all__ = ["WALL_OFFSET", "Opened", "Spec", "open_store", "prepare", "stepped_clock", "store_clocks"]


def _kit_name(spec: Spec) -> str:
    # ``kind`` is what runs recorded before kits (sqlite, postgres, redis)
    return str(spec.get("store") or spec.get("kind"))


async def open_store(spec: Spec, wrap: Callable[[Any], Any] | None = None) -> Opened:
    """Open the store ``spec`` names, its Durable passed through ``wrap`` when given (the caller
    breaks it the way the spec's catalogue mutant says, and puts a generated mutant in place in
    its process first: ``mutant_wrap(spec)``)."""
    kit = find_kit(_kit_name(spec))
    opened = await kit.open_worker(spec)
    if wrap is not None:
        opened.durable = wrap(opened.durable)
    return opened


def store_clocks(spec: Spec, checkpointer: Any) -> dict[str, str]:
    """Which clocks the store's decisions ran on, as the checkers need them (the kit's
    ``clocks``): ``store_clock`` ``"local"`` or ``"remote"``, ``lease_clock`` ``"monotonic"`` or
    ``"wall"``."""
    return find_kit(_kit_name(spec)).clocks(spec, checkpointer)


async def prepare(spec: Spec, wrap: Callable[[Any], Any] | None = None) -> None:
    """Create what a run needs in the store before any worker starts (schema, ledger), opened as
    ``open_store`` opens it."""
    opened = await open_store({**spec, "prepare": True}, wrap)
    await opened.close()
