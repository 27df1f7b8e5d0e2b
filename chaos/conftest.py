"""The chaos gate runs wd-chaos as subprocesses; make ``chaos/mutants.py`` importable by them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH", "")) if p)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "longest: a case that takes several runs; started before the rest")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # with cases two at a time (-n 2), a long case started last runs alone at the end
    items.sort(key=lambda item: item.get_closest_marker("longest") is None)
