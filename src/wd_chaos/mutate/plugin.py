"""A pytest plugin (``-p wd_chaos.mutate.plugin``) putting the generated mutant ``WD_MUTANT_EDIT``
names in place before any test module is collected (without it, no mutant), and running Hypothesis
derandomized and without shrinking, so the real store and every mutant meet the same examples and
a failing example is reported at once rather than minimized. ``WD_MUTATE_ORDER`` (a JSON file of
test id -> seconds, from the real store's run) runs the fastest tests first, so a mutant is
killed as early as it can be."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, settings

from .patch import apply_from_env

PROFILE = "wd-mutate"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: Any) -> None:
    """Apply the mutant before collection, so a test module importing a statement by name gets
    the mutated text too; load the Hypothesis profile."""
    settings.register_profile(
        PROFILE, derandomize=True, database=None, phases=(Phase.explicit, Phase.generate)
    )
    settings.load_profile(PROFILE)
    apply_from_env()


ORDER_ENV = "WD_MUTATE_ORDER"


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Fastest first, by the real store's timings; tests without one keep their place, last."""
    path = os.environ.get(ORDER_ENV)
    if not path:
        return
    seconds: dict[str, float] = json.loads(Path(path).read_text())
    slowest = max(seconds.values(), default=0.0) + 1
    items.sort(key=lambda item: seconds.get(item.nodeid, slowest))
