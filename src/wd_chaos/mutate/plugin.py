"""A pytest plugin (``-p wd_chaos.mutate.plugin``) putting the generated mutant ``WD_MUTANT_EDIT``
names in place before any test module is collected (without it, no mutant), and running Hypothesis
derandomized and without shrinking, so the real store and every mutant meet the same examples and
a failing example is reported at once rather than minimized."""

from __future__ import annotations

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
