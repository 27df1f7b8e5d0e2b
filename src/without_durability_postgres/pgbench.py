"""This store's statements as pgbench scripts: for measuring them outside the library.

The benchmarks compare each statement run through the store with the same text run by pgbench (a
C client), so that the gap is the Python side's. pgbench names its variables ``:name`` where
psycopg takes ``%(name)s``; rendering that here keeps the benchmarks from editing the store's SQL
themselves. Nothing here is run by the store, and nothing here changes what it runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_PARAMETER = re.compile(r"%\((\w+)\)s")


def as_pgbench(statement: str, rename: Mapping[str, str] | None = None) -> str:
    """``statement`` (one of this package's, with psycopg's ``%(name)s`` parameters) as pgbench SQL.

    Each ``%(name)s`` becomes the pgbench variable ``:name``, or ``:rename[name]`` when ``rename``
    names it (a variable holding another statement's result, e.g. kept with ``\\gset``); ``%%``
    becomes ``%``; the text is stripped of its surrounding blank lines. Nothing else changes, so
    the result runs exactly the statement the store runs, without a trailing ``;``.
    """
    names = dict(rename or {})
    out = _PARAMETER.sub(lambda m: ":" + names.get(m[1], m[1]), statement.strip())
    return out.replace("%%", "%")
