"""A pytest plugin (``-p wd_chaos.mutate.plugin``) putting the generated mutant ``WD_MUTANT_EDIT``
names in place before any test module is collected (without it, no mutant), and running Hypothesis
derandomized and without shrinking, so the real store and every mutant meet the same examples and
a failing example is reported at once rather than minimized. ``WD_MUTATE_ORDER`` (a JSON file of
test id -> seconds, from the real store's run) runs the fastest tests first, and ``WD_MUTATE_FIRST``
(a JSON list of test ids: the tests that killed this mutant's neighbours) runs those before them,
so a mutant is killed as early as it can be."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, settings

from ..mutation.patch import apply_from_env

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
FIRST_ENV = "WD_MUTATE_FIRST"


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """The likely killers first (in the order given), then fastest first by the real store's
    timings; tests without a timing keep their place, last. Only the order changes: every test
    still runs until one fails."""
    path = os.environ.get(ORDER_ENV)
    seconds: dict[str, float] = json.loads(Path(path).read_text()) if path else {}
    first = {test: n for n, test in enumerate(json.loads(os.environ.get(FIRST_ENV) or "[]"))}
    if not seconds and not first:
        return
    slowest = max(seconds.values(), default=0.0) + 1
    items.sort(key=lambda item: (first.get(item.nodeid, len(first)), seconds.get(item.nodeid, slowest)))
