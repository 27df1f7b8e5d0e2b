"""Mutants of the Memory store (its kit names this module in ``mutant_modules``)."""

from __future__ import annotations

from typing import Any

from without_durability._values import Recorded
from without_durability.clock import epoch_micros
from without_durability.memory import MemoryCheckpointer, _Stored
from without_durability.rules import lifecycle_writes

from ..testing.mutants import Mutant, swap
from . import LEASE_CLOCK_KILLERS


class SkipsCodec(MemoryCheckpointer):
    """Holds values as given instead of their encodings, so a tuple comes back a tuple in tests and
    a list in production: the double lies."""

    def _put(self, workflow: str, key: str, encoded: Any) -> Recorded:
        value = self.codec.decode(encoded)
        if isinstance(value, list):  # what the caller handed in before encoding, near enough
            value = tuple(value)
        records = self._records.setdefault(workflow, {})
        stored = records.setdefault(key, _Stored(value, self._now()))
        return Recorded(stored.encoded, stored.encoded == value)

    async def load(self, workflow: str) -> dict[str, object]:
        return {k: s.encoded for k, s in self._records.get(workflow, {}).items()}


class WonByDecodedValue(MemoryCheckpointer):
    """Works out ``won`` by comparing decoded values, as a caller would: a tuple that won outright is
    reported lost, because it decodes as a list."""

    def _put(self, workflow: str, key: str, encoded: Any) -> Recorded:
        got = super()._put(workflow, key, encoded)
        return Recorded(got.value, got.value == self._offered)

    async def record(self, pass_: Any, key: str, value: object) -> Recorded:
        self._offered = value
        return await super().record(pass_, key, value)

    async def supply(self, workflow: str, key: str, value: object) -> Recorded:
        self._offered = value
        return await super().supply(workflow, key, value)


class LeasesOnWallClock(MemoryCheckpointer):
    """Measures claim deadlines on the wall clock, so a step of it lapses a live pass early (or
    keeps a dead one holding)."""

    def _lease_now(self) -> int:
        return epoch_micros(self._now())


MUTANTS = [
    Mutant(
        "memory-leases-on-wall-clock",
        "memory",
        "lease-clock",
        "claim deadlines on the wall clock, which a step (NTP, a resumed VM) moves",
        (*LEASE_CLOCK_KILLERS, "sim:lease-stall:fencing"),
        swap("checkpointer", LeasesOnWallClock),
        unseen_by_chaos="Memory lives in one process: wd-chaos runs stores that many processes share",
    ),
    Mutant(
        "memory-skips-codec",
        "memory",
        "codec",
        "the Memory store keeps values by identity instead of through its codec",
        (
            "test_first_writer_wins_with_won_from_encodings",
            "test_store_agrees_with_reference_model",
            "sim:lease-stall:liveness",
        ),
        swap("checkpointer", SkipsCodec),
        unseen_by_chaos="Memory lives in one process: wd-chaos runs stores that many processes share",
    ),
    Mutant(
        "memory-won-by-decoded-value",
        "memory",
        "first-writer-wins",
        "record reports won by comparing decoded values, so a tuple that won reads as lost",
        ("test_first_writer_wins_with_won_from_encodings", "sim:lease-stall:first-writer-wins"),
        swap("checkpointer", WonByDecodedValue),
        unseen_by_chaos="Memory lives in one process: wd-chaos runs stores that many processes share",
    ),
]


# -- lifecycle (issue 14) -------------------------------------------------------------------


class SupplyTakesReservedKeys(MemoryCheckpointer):
    """supply lets a caller write ``wd/`` keys, so anyone outside a pass can forge a finished or
    failed workflow."""

    async def supply(self, workflow: str, key: str, value: object) -> Recorded:
        with lifecycle_writes():
            return await super().supply(workflow, key, value)


MUTANTS.append(
    Mutant(
        "memory-supply-takes-reserved-keys",
        "memory",
        "reserved-keys",
        "supply accepts wd/ lifecycle keys from callers",
        ("test_reserved_keys_are_refused_to_record_supply_and_arrive", "sim:lease-stall:misuse"),
        swap("checkpointer", SupplyTakesReservedKeys),
        unseen_by_chaos="Memory lives in one process: wd-chaos runs stores that many processes share (on those, lease-stall's forging writers see this)",
    )
)
