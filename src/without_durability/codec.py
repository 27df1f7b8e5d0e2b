"""What a value becomes in the store."""

from __future__ import annotations

import json
from typing import Protocol, TypeVar

Encoded = TypeVar("Encoded")


class CheckpointCodec(Protocol[Encoded]):
    """Turns recorded values into what a store holds, and back.

    A codec must satisfy two rules every store relies on: ``decode(encode(x)) == x`` for the values a
    workflow records (or a resumed pass sees something the first pass did not), and ``encode`` must be
    deterministic, because ``record`` decides a race by comparing encodings.
    """

    def encode(self, value: object) -> Encoded:
        """Encode ``value``; raise ``TypeError`` or ``ValueError`` for values it cannot carry."""
        ...

    def decode(self, encoded: Encoded) -> object:
        """Decode what ``encode`` produced."""
        ...


class JsonCodec:
    """The default codec: JSON text with sorted keys and compact separators (so ``encode`` is
    deterministic). NaN and infinities are refused, since they are not JSON. A tuple decodes as a
    list: that is the codec changing a value, which every store reports honestly."""

    renders_json = True

    def encode(self, value: object) -> str:
        """Encode ``value`` as canonical JSON text."""
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

    def decode(self, encoded: str) -> object:
        """Decode JSON text."""
        return json.loads(encoded)
