"""The built-in store factories: importing this package registers each of them.

Each module here imports its driver only inside ``open``, so registering costs nothing and a store
whose driver or server is missing says so through ``unavailable`` instead of failing the import.
"""

from __future__ import annotations

from . import memory  # noqa: F401

for _name in ("sqlite", "postgres", "redis"):
    try:
        __import__(f"{__name__}.{_name}")
    except ModuleNotFoundError as exc:  # that store has not been added to this checkout
        if exc.name != f"{__name__}.{_name}":
            raise
