"""What a store hands the conformance suite: the store itself, a clock the suite can move, and a kit of
effects in the store's own language.

A store plugs in through its ``StoreKit`` (``kit.py``), registered by entry point, or by registering a
``StoreFactory`` whose ``open`` yields a fresh ``StoreUnderTest`` and cleans up after it. The suite is written once against this shape and run against every store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, Protocol

from typing_extensions import TypeVar

from .._values import Pass
from ..clock import ManualClock
from ..protocols import Checkpointer, Durable, Scheduler

E = TypeVar("E", default=Any)


class TestClock(Protocol):
    """Time as the suite sees it. ``advance`` moves the store's clock: a fake clock jumps, a server's
    clock is waited out for real. ``real`` says which, so timings can allow for the round trips."""

    real: bool

    async def advance(self, by: timedelta) -> None:
        """Let ``by`` pass on the store's clock."""
        ...


class ManualTestClock:
    """A ``TestClock`` over a ``ManualClock`` shared with the store (a store deciding by its own process's clock)."""

    real = False

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock

    async def advance(self, by: timedelta) -> None:
        """Jump the shared clock."""
        self.clock.advance(by)


class RealTestClock:
    """A ``TestClock`` for a store whose clock is a server's: ``advance`` sleeps."""

    real = True

    async def advance(self, by: timedelta) -> None:
        """Wait ``by`` out."""
        await asyncio.sleep(by.total_seconds())


class EffectFailed(Exception):
    """Raised by ``EffectKit.failing`` effects after they performed their inner effect."""


@dataclass(frozen=True)
class EffectKit(Generic[E]):
    """Transact effects in the store's own language, for the exactly-once tests.

    - ``ledger_add(name, amount)``: an effect that adds ``amount`` to the ledger entry ``name`` kept in
      the store's own data, and returns the new total (an int).
    - ``ledger_read(name)``: the entry's current total, read outside any transact (0 if never moved).
    - ``superseding(pass_, inner)``: an effect that performs ``inner`` and then, before returning,
      makes a claim newer than ``pass_`` exist (from another connection where the store allows one,
      otherwise by its own write to the claim), so the store must refuse the record and roll back.
    - ``failing(inner)``: an effect that performs ``inner`` and then raises ``EffectFailed``.
    """

    ledger_add: Callable[[str, int], E]
    ledger_read: Callable[[str], Awaitable[int]]
    superseding: Callable[[Pass, E], E]
    failing: Callable[[E], E]


@dataclass
class StoreUnderTest(Generic[E]):
    """One fresh store for one test: a ``Durable`` and what the suite needs around it.

    ``concurrent`` says whether operations from many tasks really overlap in the store (a pool of
    connections) or run one at a time; the suite's concurrency tests hold either way.
    """

    name: str
    durable: Durable[E]
    clock: TestClock
    effects: EffectKit[E]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def checkpointer(self) -> Checkpointer[E]:
        """The store's checkpointer."""
        return self.durable.checkpointer

    @property
    def scheduler(self) -> Scheduler:
        """The store's scheduler."""
        return self.durable.scheduler

    async def now(self) -> datetime:
        """The store's clock."""
        return await self.durable.scheduler.now()


@dataclass(frozen=True)
class StoreFactory:
    """How the suite gets a store.

    ``server`` is entered once per test session (start a private server, or note where one is) and
    its value is handed to ``open``, which yields a fresh, empty store for one test and cleans up.
    ``unavailable`` says why the store cannot run here (None when it can), without starting anything.
    """

    name: str
    open: Callable[[Any], AbstractAsyncContextManager[StoreUnderTest[Any]]]
    server: Callable[[], AbstractContextManager[Any]] = nullcontext
    unavailable: Callable[[], str | None] = lambda: None
    description: str = ""
    kind: str = ""
    """The store this factory is an instance of, for ``@pytest.mark.wd_store(...)`` filters; empty
    means the factory's own name. A mutant of a store has that store's kind, so the store's own
    tests run against it too."""
    server_key: object = None
    """Factories with the same key share one session server (None: keyed by ``server`` itself)."""

    @property
    def store_kind(self) -> str:
        """``kind`` if set, else ``name``."""
        return self.kind or self.name


_REGISTRY: dict[str, StoreFactory] = {}


def register(factory: StoreFactory) -> StoreFactory:
    """Add ``factory`` to the registry the ``--wd-store`` option chooses from (replacing one of the
    same name). Call it from a conftest or a plugin module."""
    _REGISTRY[factory.name] = factory
    return factory


def registered() -> dict[str, StoreFactory]:
    """Every factory by name: each installed store kit's (entry-point group
    ``without_durability.stores``), then those passed to ``register`` (which win on a clash)."""
    from .kit import kits

    return {**{name: kit.factory() for name, kit in kits().items()}, **_REGISTRY}
