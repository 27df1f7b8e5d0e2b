"""Rules every store applies the same way: ids, keys, durations, value sizes, inbox key names.

Stores call these before touching anything, so bad input is refused with a message that names the
workflow, the key and the rule, and nothing already stored is lost.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import TypeVar

from .codec import CheckpointCodec
from .errors import InvalidInput, InvalidKey, InvalidValue, InvalidWorkflowId

INBOX_PREFIX = "inbox/"
"""Keys under this prefix are named by ``append``; ``record`` and ``supply`` refuse them."""

RESERVED_PREFIX = "wd/"
"""Keys under this prefix hold the library's own lifecycle records (``wd/finished``,
``wd/failed/<n>``, ...; see ``without_durability.lifecycle``); ``record`` and ``supply`` refuse them
from callers, so a body cannot forge a terminal state. ``load`` shows them like any record."""

_LIFECYCLE_WRITES: ContextVar[bool] = ContextVar("wd_lifecycle_writes", default=False)


@contextlib.contextmanager
def lifecycle_writes() -> Iterator[None]:
    """Inside this block (this task only), ``check_key`` lets ``wd/`` keys through: how the Worker
    and ``rearm`` write lifecycle records through any store's ordinary ``record``/``supply``."""
    token = _LIFECYCLE_WRITES.set(True)
    try:
        yield
    finally:
        _LIFECYCLE_WRITES.reset(token)


INBOX_DIGITS = 20
"""Inbox keys carry a number zero-padded to this width (enough for any 64-bit counter), so they
sort as strings in the order of the number."""

MAX_VALUE_BYTES = 16 * 1024 * 1024
"""The default limit on one encoded value; every store takes ``max_value_bytes`` to change it."""


MAX_DURATION = timedelta(days=365 * 100)
"""The longest lease window, budget or take visibility any store accepts: a century. Every store
can count it exactly in microseconds and add it to now without leaving its time range (Redis does
its arithmetic in doubles, SQLite in 64-bit integers), so a longer one is refused, not wrapped."""

MAX_TOKEN = 2**63 - 1
"""The largest fencing token a store can hold (a 64-bit integer). Stores mint tokens; a ``Pass``
carrying anything else was not handed out by one and is refused."""


def _check_utf8(what: str, text: str) -> str | None:
    """Why ``text`` cannot be stored as UTF-8 (a lone surrogate), or None."""
    if text.isascii():  # a flag CPython keeps on the string: no scan, and no surrogate possible
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"{what} {text!r} is not valid Unicode text: {exc.reason} at index {exc.start} "
            f"({text[exc.start]!r}), which no store can hold as UTF-8; if it came from bytes, "
            "decode them with errors='replace', or choose another"
        )
    return None


def inbox_key(number: int) -> str:
    """The inbox key for ``number``: ``inbox/`` and the number zero-padded to ``INBOX_DIGITS``."""
    if number < 0 or number >= 10**INBOX_DIGITS:
        raise ValueError(f"inbox number {number} does not fit {INBOX_DIGITS} digits")
    return f"{INBOX_PREFIX}{number:0{INBOX_DIGITS}d}"


def check_workflow(workflow: object) -> str:
    """Refuse a workflow id that is not a non-empty string."""
    if not isinstance(workflow, str) or not workflow:
        raise InvalidWorkflowId(f"workflow id must be a non-empty string, got {workflow!r}")
    if (why := _check_utf8("workflow id", workflow)) is not None:
        raise InvalidWorkflowId(why)
    return workflow


def check_key(workflow: str, key: object, *, inbox_allowed: bool = False) -> str:
    """Refuse a key that is not a non-empty string, or that is under ``inbox/`` (append names those)
    or ``wd/`` (lifecycle records; allowed only inside ``lifecycle_writes``)."""
    if not isinstance(key, str) or not key:
        raise InvalidKey(f"workflow {workflow!r}: key must be a non-empty string, got {key!r}")
    if (why := _check_utf8("key", key)) is not None:
        raise InvalidKey(f"workflow {workflow!r}: {why}")
    if not inbox_allowed and key.startswith(INBOX_PREFIX):
        raise InvalidKey(
            f"workflow {workflow!r}: key {key!r} starts with {INBOX_PREFIX!r}, which is reserved for "
            "keys the store names in append(); use append() to add a message, or another key"
        )
    if key.startswith(RESERVED_PREFIX) and not _LIFECYCLE_WRITES.get():
        raise InvalidKey(
            f"workflow {workflow!r}: key {key!r} starts with {RESERVED_PREFIX!r}, which is reserved "
            "for the workflow's lifecycle records (finished, failed, attempts) that the Worker "
            "writes; choose another key"
        )
    return key


def check_lease(workflow: str, alive: timedelta, budget: timedelta) -> None:
    """Refuse a claim whose liveness window or budget is not a positive ``timedelta``."""
    for name, value in (("alive", alive), ("budget", budget)):
        if not isinstance(value, timedelta) or value <= timedelta(0):
            raise InvalidInput(
                f"workflow {workflow!r}: claim {name} must be a positive timedelta, got {value!r}"
            )
        if value > MAX_DURATION:
            raise InvalidInput(
                f"workflow {workflow!r}: claim {name} {value} is longer than {MAX_DURATION.days} "
                "days (a century), the longest any store can count; choose a shorter one"
            )


def check_visibility(visibility: timedelta) -> None:
    """Refuse a take whose visibility is not a positive ``timedelta``."""
    if not isinstance(visibility, timedelta) or visibility <= timedelta(0):
        raise InvalidInput(f"take visibility must be a positive timedelta, got {visibility!r}")
    if visibility > MAX_DURATION:
        raise InvalidInput(
            f"take visibility {visibility} is longer than {MAX_DURATION.days} days (a century), "
            "the longest any store can count; to take a workflow off the queue, answer its "
            "delivery with wake_at(delivery, None)"
        )


def check_pass(pass_: object) -> None:
    """Refuse a pass no store could have minted: not a ``Pass``, an invalid workflow id, or a
    token that is not an integer from 1 to ``MAX_TOKEN``."""
    from ._values import Pass

    if not isinstance(pass_, Pass):
        raise InvalidInput(f"expected a Pass from claim(), got {pass_!r}")
    check_workflow(pass_.workflow)
    token = pass_.token
    if isinstance(token, bool) or not isinstance(token, int) or not 0 < token <= MAX_TOKEN:
        raise InvalidInput(
            f"workflow {pass_.workflow!r}: pass token {token!r} was not minted by a store (tokens "
            f"are integers from 1 to {MAX_TOKEN}); use the Pass that claim() returned"
        )


def check_time(what: str, at: datetime | None) -> None:
    """Refuse a naive datetime: every time here is timezone-aware."""
    if at is not None and (not isinstance(at, datetime) or at.tzinfo is None):
        raise InvalidInput(f"{what} must be a timezone-aware datetime (or None), got {at!r}")


E = TypeVar("E")


MAX_DEPTH = 500
"""The deepest nesting of lists and dicts a value may have. Fixed here rather than left to the
interpreter: how deep ``json`` can encode and decode differs between Python versions (3.11 refuses
1,000 levels, 3.13 encodes 8,000), and a value one worker's Python recorded must load on every
other's."""


def _deeper_than(value: object, most: int) -> bool:
    """Whether ``value`` nests lists, tuples and dicts more than ``most`` levels deep."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > most:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _too_deep(encoded: object, value: object) -> bool:
    """Whether ``value`` is nested deeper than ``MAX_DEPTH``; only walked when its encoding has
    that many opening brackets at all (a count at C speed), so ordinary values cost nothing."""
    if isinstance(encoded, str):
        opened = encoded.count("[") + encoded.count("{")
    elif isinstance(encoded, bytes | bytearray):
        opened = encoded.count(b"[") + encoded.count(b"{")
    else:
        opened = MAX_DEPTH + 1  # an encoding we cannot count in: walk the value
    return opened > MAX_DEPTH and _deeper_than(value, MAX_DEPTH)


def _nested_too_deep(workflow: str, key: str, value: object) -> InvalidValue:
    return InvalidValue(
        f"workflow {workflow!r}, key {key!r}: the {type(value).__name__} value is nested more "
        f"than {MAX_DEPTH} levels deep, the limit on every Python version (rules.MAX_DEPTH); "
        "flatten it, or store it elsewhere and record a reference to it"
    )


def encode_value(codec: CheckpointCodec[E], workflow: str, key: str, value: object, max_bytes: int) -> E:
    """Encode ``value`` for ``workflow``/``key``, refusing what the codec cannot carry, what is
    nested deeper than ``MAX_DEPTH``, or what is larger than ``max_bytes`` with an
    ``InvalidValue`` that names both."""
    try:
        encoded = codec.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidValue(
            f"workflow {workflow!r}, key {key!r}: the codec cannot encode {type(value).__name__} "
            f"value ({exc}); record values the codec carries (JsonCodec: JSON types only)"
        ) from exc
    except RecursionError as exc:
        raise _nested_too_deep(workflow, key, value) from exc
    if _too_deep(encoded, value):
        raise _nested_too_deep(workflow, key, value)
    if isinstance(encoded, str) and encoded.isascii():
        size = len(encoded)  # one byte a character, and no lone surrogate: no copy to count
    elif isinstance(encoded, str):
        try:
            size = len(encoded.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise InvalidValue(
                f"workflow {workflow!r}, key {key!r}: the encoded value is not valid UTF-8 text "
                f"({exc.reason} at {exc.start}); a lone surrogate cannot be stored"
            ) from exc
    elif isinstance(encoded, bytes | bytearray):
        size = len(encoded)
    else:
        size = 0
    if size > max_bytes:
        raise InvalidValue(
            f"workflow {workflow!r}, key {key!r}: encoded value is {size} bytes, over the store's "
            f"limit of {max_bytes}; store large payloads elsewhere and record a reference"
        )
    return encoded
