"""A pytest plugin registering every mutant as a store for the conformance suite (``-p
wd_chaos.mutants.plugin``). Mutant factories share their real store's server and open a fresh real
store, then apply the mutant's ``wrap``; while a check runs on a mutant, the mutant class also replaces
the real one in every loaded module, so a store the check builds itself is the mutant too.
``WD_MUTANT_MODULES`` (comma-separated) adds catalogues."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from without_durability.testing.harness import StoreFactory, StoreUnderTest, register, registered

from . import MUTANT_ENV, Mutant, catalogue, modules_from_env, replaced

_MUTANTS: dict[str, Mutant] = {}


def mutant_factory(mutant: Mutant, base: StoreFactory) -> StoreFactory:
    """The conformance factory for ``mutant``, derived from its real store's ``base`` factory."""

    @asynccontextmanager
    async def open_mutant(server: Any) -> AsyncIterator[StoreUnderTest[Any]]:
        async with base.open(server) as sut:
            sut.durable = mutant.wrap(sut.durable)
            sut.name = mutant.name
            yield sut

    return StoreFactory(
        mutant.name,
        open_mutant,
        base.server,
        base.unavailable,
        mutant.description,
        base.store_kind,
        server_key=base.server_key,
    )


def register_all() -> list[Mutant]:
    """Register a factory for every mutant whose real store is registered; return those mutants."""
    stores = registered()
    mutants = [m for m in catalogue(modules_from_env()) if m.store in stores]
    for mutant in mutants:
        register(mutant_factory(mutant, stores[mutant.store]))
        _MUTANTS[mutant.name] = mutant
    return mutants


@pytest.fixture(autouse=True)
def _wd_mutant_everywhere(request: Any) -> Iterator[None]:
    """On a mutant's parameter, the mutant class stands in for the real one for the whole check."""
    callspec = getattr(request.node, "callspec", None)
    mutant = _MUTANTS.get(callspec.params.get("_wd_store_name", "")) if callspec is not None else None
    if mutant is None:
        yield
        return
    before = os.environ.get(MUTANT_ENV)
    os.environ[MUTANT_ENV] = mutant.name  # a process the check starts installs it too
    try:
        with replaced(mutant):
            yield
    finally:
        if before is None:
            os.environ.pop(MUTANT_ENV, None)
        else:
            os.environ[MUTANT_ENV] = before


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: Any) -> None:
    """Register the mutants before ``--wd-store`` is checked, and after every plugin module (yours
    included, e.g. ``-p mystore_testing``) has registered its stores."""
    register_all()


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Keep only the checks each store is asked for: ``WD_MUTANT_PLAN`` is JSON mapping a store
    name to the check names to run on it (a mutant: its killers; a real store: every killer of its
    mutants). Without it, nothing is deselected."""
    plan_text = os.environ.get("WD_MUTANT_PLAN")
    if not plan_text:
        return
    plan: dict[str, list[str]] = json.loads(plan_text)
    keep: list[Any] = []
    drop: list[Any] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        store = callspec.params.get("_wd_store_name") if callspec is not None else None
        check = getattr(item, "originalname", item.name)
        wanted = store is not None and check in plan.get(store, ())
        (keep if wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
