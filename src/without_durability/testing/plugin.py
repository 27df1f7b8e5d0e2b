"""The conformance suite's pytest plugin: the ``--wd-store`` option and the fixtures that hand each
test a fresh store.

``--wd-store NAME`` (repeatable) picks stores from the registry: every installed ``StoreKit``
(entry-point group ``without_durability.stores``) and every factory passed to ``register``. Without it, every registered store
whose server can be had runs, and the header says which were left out and why. A store named
explicitly whose server cannot be reached or started is an error, never a silent skip.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from .harness import StoreFactory, StoreUnderTest, registered
from .kit import ENTRY_POINT_GROUP, KitError, broken_kits, resolve
from .workflow import WorkflowKit

_SELECTED: pytest.StashKey[list[str]] = pytest.StashKey()
_LEFT_OUT: pytest.StashKey[dict[str, str]] = pytest.StashKey()
_EXPLICIT: pytest.StashKey[bool] = pytest.StashKey()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("without-durability")
    group.addoption(
        "--wd-store",
        action="append",
        default=[],
        metavar="NAME",
        help="run the store conformance suite against NAME (repeatable; 'all' requires every "
        "registered store; default: every registered store whose server can be had); --wd-chaos "
        "runs its scenarios on the same stores",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "wd_store(names): limit a test to the named stores (and factories of their kind)"
    )
    names: list[str] = [n for opt in config.getoption("--wd-store") or [] for n in opt.split(",")]
    factories = registered()
    if "all" in names:  # every registered store, each required to run
        names = list(factories)
    names = [_canonical(n, factories) for n in names]
    unknown = [n for n in names if n not in factories]
    if unknown:
        broken = "".join(f"; {name} failed to load: {why}" for name, why in broken_kits().items())
        raise pytest.UsageError(
            f"--wd-store: unknown store(s) {unknown}; registered: {sorted(factories)}{broken} "
            f"(a store registers itself under the entry-point group {ENTRY_POINT_GROUP})"
        )
    left_out: dict[str, str] = {}
    if names:
        for name in names:
            reason = factories[name].unavailable()
            if reason:
                raise pytest.UsageError(f"--wd-store {name}: its server cannot be had: {reason}")
        selected = names
    else:
        selected = []
        for name, factory in factories.items():
            reason = factory.unavailable()
            if reason:
                left_out[name] = reason
            else:
                selected.append(name)
    config.stash[_SELECTED] = selected
    config.stash[_LEFT_OUT] = left_out
    config.stash[_EXPLICIT] = bool(names)


def _canonical(name: str, factories: dict[str, StoreFactory]) -> str:
    """``name``, or the kit it is an alias of."""
    if name in factories:
        return name
    try:
        return resolve(name)
    except KitError:
        return name


def pytest_report_header(config: pytest.Config) -> list[str]:
    selected: list[str] = config.stash.get(_SELECTED, [])
    lines = [f"wd-store: {', '.join(selected) or '(none)'}"]
    for name, reason in config.stash.get(_LEFT_OUT, {}).items():
        lines.append(f"wd-store left out: {name}: {reason}")
    return lines


def selected_stores(config: pytest.Config) -> list[str]:
    """The store names this session runs the suite against."""
    selected: list[str] = config.stash.get(_SELECTED, [])
    return list(selected)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "wd_store" not in metafunc.fixturenames and "wd_factory" not in metafunc.fixturenames:
        return
    names = selected_stores(metafunc.config)
    marker = metafunc.definition.get_closest_marker("wd_store")
    if marker is not None:
        allowed = set(
            marker.args[0] if marker.args and isinstance(marker.args[0], (list, tuple)) else marker.args
        )
        factories = registered()
        names = [n for n in names if factories[n].store_kind in allowed]
    metafunc.parametrize("_wd_store_name", names, ids=names, indirect=False)


class _Servers:
    """Session-wide servers, started the first time a store needs one and stopped at exit."""

    def __init__(self) -> None:
        self.stack = contextlib.ExitStack()
        self.started: dict[object, Any] = {}
        self.failed: dict[object, BaseException] = {}

    def get(self, factory: StoreFactory) -> Any:
        # Keyed by the server recipe, so factories that share one (a store and its mutants) share
        # one server.
        key = factory.server_key if factory.server_key is not None else factory.server
        if key in self.failed:
            raise self.failed[key]
        if key not in self.started:
            try:
                self.started[key] = self.stack.enter_context(factory.server())
            except Exception as exc:
                self.failed[key] = exc
                raise
        return self.started[key]


@pytest.fixture(scope="session")
def _wd_servers() -> Iterator[_Servers]:
    servers = _Servers()
    with servers.stack:
        yield servers


@pytest.fixture
def wd_factory(_wd_store_name: str, _wd_servers: _Servers) -> tuple[StoreFactory, Any]:
    """The selected store's factory and its session server (for tests that open stores themselves,
    such as the model test, which opens one per example on its own event loop)."""
    factory = registered()[_wd_store_name]
    return factory, _wd_servers.get(factory)


@pytest_asyncio.fixture
async def wd_store(wd_factory: tuple[StoreFactory, Any]) -> AsyncIterator[StoreUnderTest[Any]]:
    """A fresh store of the selected kind for one test, cleaned up after it."""
    factory, server = wd_factory
    async with factory.open(server) as store:
        yield store


@pytest.fixture
def wd_workflow() -> WorkflowKit:
    """A workflow author's kit for one test: ``await wd_workflow.check(body, inputs=...)`` crashes
    ``body`` at every step on the Memory store (time skips) and returns a ``WorkflowReport``;
    ``wd_workflow.ledger`` counts the effects; ``check_upgrade(new, old)`` replays an old version's
    in-flight runs on a new one."""
    return WorkflowKit()
