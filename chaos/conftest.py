"""The chaos gate's pytest settings: the longest cases start first when cases run two at a time."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "longest: a case that takes several runs; started before the rest")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # with cases two at a time (-n 2), a long case started last runs alone at the end
    items.sort(key=lambda item: item.get_closest_marker("longest") is None)
