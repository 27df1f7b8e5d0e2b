"""What a value becomes in the store."""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

from .errors import InvalidInput

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


# json.dumps with these arguments builds this encoder on every call; it keeps no state between calls.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


_SCAN = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # typeshed: the decoder is what it takes


class JsonCodec:
    """The default codec: JSON text with sorted keys and compact separators (so ``encode`` is
    deterministic). NaN and infinities are refused, since they are not JSON. A tuple decodes as a
    list: that is the codec changing a value, which every store reports honestly."""

    renders_json = True

    def encode(self, value: object) -> str:
        """Encode ``value`` as canonical JSON text."""
        return _CANONICAL.encode(value)

    def decode(self, encoded: str) -> object:
        """Decode JSON text."""
        # json.loads's own scanner, called directly for text as encode writes it (no surrounding
        # whitespace): what json.loads returns, without its checks and two whitespace matches
        # (a store decodes every record of every load); anything else takes json.loads itself
        try:
            value, end = _SCAN(encoded, 0)
        except (StopIteration, TypeError, ValueError):
            return json.loads(encoded)
        return value if end == len(encoded) else json.loads(encoded)


SAMPLE_VALUES: tuple[object, ...] = (
    None,
    True,
    False,
    0,
    -7,
    2**53 + 1,
    1.5,
    -0.1,
    1e-7,
    "",
    "text",
    "ünïcødé ✓ 𝄞",
    [],
    [1, "two", None, [3.5]],
    {},
    {"b": 1, "a": [True, {"c": "d"}]},
)
"""What ``verify_codec`` tries by default: the JSON shapes a workflow records. A codec that refuses
one of them (``TypeError``/``ValueError``) is not judged on it."""


def _same(a: object, b: object) -> bool:
    """Equal, and of the same types all the way down (``1 == 1.0 == True`` is not a round trip)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    if isinstance(a, list | tuple):
        assert isinstance(b, list | tuple)
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def verify_codec(codec: CheckpointCodec[Any], samples: Iterable[object] = SAMPLE_VALUES) -> None:
    """Check the two rules of ``CheckpointCodec`` on ``samples``, or raise ``InvalidInput`` naming
    the first value that breaks one: ``decode(encode(x))`` must give ``x`` back (equal, and of the
    same types), and ``encode`` must give the same encoding twice. Samples the codec refuses to
    encode (``TypeError``/``ValueError``) are skipped: a codec may carry only its own types.

    Every store runs it over ``SAMPLE_VALUES`` when it is built, so a codec that changes values is
    refused before anything is stored. Call it yourself at startup with values shaped like the ones
    your workflows record, to hold your codec to them too."""
    name = type(codec).__name__
    for value in samples:
        try:
            encoded = codec.encode(value)
        except (TypeError, ValueError):
            continue
        again = codec.encode(value)
        if again != encoded:
            raise InvalidInput(
                f"codec {name} is not deterministic: {value!r} encoded as {encoded!r}, then as "
                f"{again!r}; record decides races by comparing encodings, so encode must be a "
                "pure function of the value"
            )
        try:
            back = codec.decode(encoded)
        except Exception as exc:
            raise InvalidInput(
                f"codec {name} cannot decode its own encoding of {value!r} ({encoded!r}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not _same(back, value):
            raise InvalidInput(
                f"codec {name} does not round-trip {value!r}: it comes back as {back!r}; a "
                "resumed pass would see a different value than the pass that recorded it. Fix the "
                "codec so decode(encode(x)) == x (same types) for the values workflows record"
            )
