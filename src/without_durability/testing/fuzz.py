"""Fuzzing the public API: Hypothesis draws the arguments a caller could pass (ids and keys of any
text, lone surrogates and NUL included, values of any shape and depth, durations and times out to
their extremes, passes no store minted) and calls every method with them.

What must hold for every call: it returns, or it raises one of the library's own errors
(``WithoutDurabilityError``, or ``Fenced``/``Contended``), never a raw ``OverflowError``,
``UnicodeEncodeError``, ``RecursionError`` or driver error; and a call refused with ``InvalidInput``
leaves every stored record as it was.
"""

from __future__ import annotations

import asyncio
import reprlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .._values import Delivery, Pass
from ..errors import Contended, Fenced, InvalidInput, WithoutDurabilityError
from .harness import StoreFactory, StoreUnderTest

VICTIMS = ("fz-a", "fz-b")
"""The valid workflows calls are aimed at, whose records must not change on a refusal."""

_CHAR = st.one_of(st.characters(), st.characters(categories=["Cs"]), st.sampled_from("\x00{}/:"))
TEXT = st.text(_CHAR, max_size=12)
IDS = st.one_of(
    st.sampled_from(VICTIMS),
    TEXT,
    st.text(_CHAR, min_size=200, max_size=400),
    st.sampled_from(["", "inbox/1", "{x}", "a" * 300]),
    st.integers(),
    st.none(),
    st.binary(max_size=4),
)
KEYS = st.one_of(st.sampled_from(["k", "inbox/00000000000000000001", "inbox/"]), TEXT, st.none(), st.integers())


def _nested(depth: int) -> object:
    value: object = "bottom"
    for _ in range(depth):
        value = [value]
    return value


_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(),
    TEXT,
    st.binary(max_size=4),
    st.just(object()),
)
VALUES = st.one_of(
    st.recursive(
        _LEAVES,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(TEXT, inner, max_size=3),
            st.tuples(inner, inner),
            st.frozensets(st.integers(), max_size=2),
        ),
        max_leaves=8,
    ),
    st.integers(min_value=900, max_value=6000).map(_nested),
)
DURATIONS = st.one_of(
    st.timedeltas(),
    st.sampled_from([timedelta.max, timedelta.min, timedelta(0), timedelta(microseconds=1)]),
    st.timedeltas(min_value=timedelta(days=365 * 99), max_value=timedelta(days=365 * 400)),
    st.integers(),
    st.none(),
)
TIMES = st.one_of(
    st.none(),
    st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=-12))])),
    st.datetimes(),
    st.sampled_from([datetime.max.replace(tzinfo=UTC), datetime.min.replace(tzinfo=UTC)]),
    st.integers(),
)
TOKENS = st.one_of(st.integers(), st.integers(min_value=2**62, max_value=2**70), st.booleans(), TEXT)

Call = Callable[[StoreUnderTest[Any], Pass], Awaitable[object]]


def _calls() -> st.SearchStrategy[tuple[str, Call]]:
    """A labelled call on the store: one public method with drawn arguments."""

    def on(label: str, make: Callable[..., Call], *args: st.SearchStrategy[Any]) -> Any:
        # reprlib: bounded depth, so a deeply nested value cannot overflow the label itself
        return st.tuples(*args).map(lambda drawn: (label + reprlib.repr(drawn), make(*drawn)))

    return st.one_of(
        on("claim", lambda w, a, b: lambda s, p: s.checkpointer.claim(w, alive=a, budget=b), IDS, DURATIONS, DURATIONS),
        on("record", lambda k, v: lambda s, p: s.checkpointer.record(p, k, v), KEYS, VALUES),
        on("record-forged", lambda w, t, k: lambda s, p: s.checkpointer.record(Pass(w, t), k, 1), IDS, TOKENS, KEYS),
        on("renew-forged", lambda w, t: lambda s, p: s.checkpointer.renew(Pass(w, t)), IDS, TOKENS),
        on("release-forged", lambda w, t: lambda s, p: s.checkpointer.release(Pass(w, t)), IDS, TOKENS),
        on("discard", lambda w: lambda s, p: s.checkpointer.discard(w), IDS),
        on("durable-discard", lambda w: lambda s, p: s.durable.discard(w), IDS),
        on("supply", lambda w, k, v: lambda s, p: s.checkpointer.supply(w, k, v), IDS, KEYS, VALUES),
        on("append", lambda w, v: lambda s, p: s.checkpointer.append(w, v), IDS, VALUES),
        on("load", lambda w: lambda s, p: s.checkpointer.load(w), IDS),
        on("history", lambda w: lambda s, p: s.checkpointer.history(w), IDS),
        on("arrive", lambda w, k, v: lambda s, p: s.durable.arrive(w, k, v), IDS, KEYS, VALUES),
        on("deliver", lambda w, v: lambda s, p: s.durable.deliver(w, v), IDS, VALUES),
        on("schedule", lambda w, at: lambda s, p: s.scheduler.schedule(w, at), IDS, TIMES),
        on("take", lambda d: lambda s, p: s.scheduler.take(d), DURATIONS),
        on(
            "wake_at-forged",
            lambda w, at: lambda s, p: s.scheduler.wake_at(Delivery(w, object()), at),
            IDS,
            TIMES,
        ),
        on("cancel", lambda w: lambda s, p: s.scheduler.cancel(w), IDS),
    )


async def _snapshot(store: StoreUnderTest[Any]) -> dict[str, list[Any]]:
    return {w: await store.checkpointer.history(w) for w in VICTIMS}


def check_fuzzed_inputs(factory: StoreFactory, server: Any, *, examples: int | None = None) -> None:
    """Run the fuzz against one fresh store of ``factory``: every drawn call returns or raises a
    library error, and an ``InvalidInput`` refusal leaves the victims' records as they were."""
    loop = asyncio.new_event_loop()
    opened = factory.open(server)
    store: StoreUnderTest[Any] = loop.run_until_complete(opened.__aenter__())
    try:
        holder = loop.run_until_complete(
            store.checkpointer.claim(VICTIMS[0], alive=timedelta(hours=1), budget=timedelta(hours=1))
        )
        real = store.clock.real

        @settings(
            max_examples=examples or (100 if real else 300),
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(call=_calls())
        def check(call: tuple[str, Call]) -> None:
            label, make = call

            async def one() -> None:
                before = await _snapshot(store)
                try:
                    await make(store, holder)
                except (WithoutDurabilityError, Fenced, Contended) as exc:
                    if isinstance(exc, InvalidInput):
                        after = await _snapshot(store)
                        assert after == before, f"{label}: refused ({exc}) but the store changed"
                except BaseException as exc:
                    raise AssertionError(
                        f"{label} raised {type(exc).__name__}: {exc}; expected a return or one of "
                        "the library's errors"
                    ) from exc

            loop.run_until_complete(one())

        check()
    finally:
        loop.run_until_complete(opened.__aexit__(None, None, None))
        loop.close()
