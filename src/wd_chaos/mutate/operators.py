"""Mutation operators on statement text (SQL) and script text (Lua).

Each operator reads a text and yields ``Edit``s: one small change at one place, the old text and the
new. Operators work on the text as a tokenless scan with comments masked out, which is enough for the
short, regular statements a store keeps as constants; an edit that makes a statement invalid is still
a mutant (the store's tests see the error), only a wasteful one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from ..mutation.patch import Edit

Operator = Callable[[str], Iterator[Edit]]


def _mask_comments(text: str) -> str:
    """``text`` with every ``--`` comment (SQL and Lua, block comments included) blanked to spaces,
    so operators never edit a comment; offsets stay those of ``text``."""

    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group(0))

    text = re.sub(r"--\[\[.*?\]\]", blank, text, flags=re.S)
    return re.sub(r"--[^\n]*", blank, text)


def _mask_strings(text: str) -> str:
    """``text`` with quoted literals blanked too ('...' and "..."), keeping the quotes' places."""

    def blank(match: re.Match[str]) -> str:
        inner = re.sub(r"[^\n]", " ", match.group(0)[1:-1])
        return match.group(0)[0] + inner + match.group(0)[-1]

    return re.sub(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"", blank, text)


def _masked(text: str) -> str:
    return _mask_strings(_mask_comments(text))


def _swap(name: str, pairs: dict[str, str], pattern: str, flags: int = 0) -> Operator:
    """An operator replacing each match of ``pattern`` (whose text is a key of ``pairs``) by its pair."""
    compiled = re.compile(pattern, flags)

    def operator(text: str) -> Iterator[Edit]:
        for m in compiled.finditer(_masked(text)):
            old = text[m.start() : m.end()]
            new = pairs.get(old) or pairs.get(old.upper()) or pairs.get(old.lower())
            if new is not None:
                yield Edit(name, m.start(), old, new)

    return operator


# Comparison flips: < and <=, > and >= (not <>, ->, =>, <<, >>, and not Lua's ~=).
comparison = _swap(
    "comparison",
    {"<": "<=", "<=": "<", ">": ">=", ">=": ">"},
    r"(?<![<>=~\-!])(?:<=|>=|<|>)(?![<>=])",
)

# Lua equality flips: == and ~=.
lua_equality = _swap("equality", {"==": "~=", "~=": "=="}, r"==|~=")

least_greatest = _swap(
    "least-greatest", {"LEAST": "GREATEST", "GREATEST": "LEAST"}, r"\b(?:LEAST|GREATEST)\b", re.I
)
min_max = _swap("min-max", {"min(": "max(", "max(": "min("}, r"\b(?:min|max)\(")
lua_min_max = _swap("min-max", {"math.min": "math.max", "math.max": "math.min"}, r"\bmath\.(?:min|max)\b")
clock = _swap(
    "clock",
    {"clock_timestamp()": "now()", "now()": "clock_timestamp()"},
    r"\b(?:clock_timestamp|now)\(\)",
    re.I,
)


def _drop(name: str, pattern: str, flags: int = 0) -> Operator:
    """An operator deleting each match of ``pattern`` (with the whitespace before it)."""
    compiled = re.compile(r"\s*" + pattern, flags)

    def operator(text: str) -> Iterator[Edit]:
        for m in compiled.finditer(_masked(text)):
            yield Edit(name, m.start(), text[m.start() : m.end()], "")

    return operator


drop_for_update = _drop("drop-for-update", r"\bFOR\s+UPDATE(?:\s+SKIP\s+LOCKED)?\b", re.I)
drop_skip_locked = _drop("drop-skip-locked", r"\bSKIP\s+LOCKED\b", re.I)
drop_desc = _drop("drop-desc", r"\bDESC\b", re.I)

_CLAUSE_END = r"(?=\s+(?:AND|OR|RETURNING|ORDER|LIMIT|GROUP|FOR|ON|SET|DO|UNION)\b|\s*\)|\s*;|\s*$)"
_CONJUNCT = re.compile(
    r"\s+(AND|OR)\s+((?:[^()\s]|\([^()]*(?:\([^()]*\)[^()]*)*\)|\s(?!\s*(?:AND|OR|RETURNING|ORDER|LIMIT|GROUP|FOR|DO|UNION)\b))+?)"
    + _CLAUSE_END
)
_FIRST_CONJUNCT = re.compile(
    r"\b(WHERE|WHEN)\s+((?:[^()\s]|\([^()]*(?:\([^()]*\)[^()]*)*\)|\s(?!\s*(?:AND|OR)\b))+?)\s+(AND|OR)\s+"
)


def drop_conjunct(text: str) -> Iterator[Edit]:
    """SQL: each ``AND x`` / ``OR x`` in a condition dropped, and the first term before one."""
    masked = _masked(text)
    for m in _CONJUNCT.finditer(masked):
        yield Edit(f"drop-{m.group(1).lower()}", m.start(), text[m.start() : m.end()], "")
    for m in _FIRST_CONJUNCT.finditer(masked):
        start = m.start(2)
        yield Edit(f"drop-{m.group(3).lower()}", start, text[start : m.end()], "")


def do_nothing_update(text: str) -> Iterator[Edit]:
    """SQL: ``DO NOTHING`` becomes an overwrite; a ``DO UPDATE ...`` arm becomes ``DO NOTHING``."""
    masked = _masked(text)
    for m in re.finditer(r"\bDO\s+NOTHING\b", masked, re.I):
        yield Edit(
            "do-nothing-update", m.start(), text[m.start() : m.end()], "DO UPDATE SET value = excluded.value"
        )
    for m in re.finditer(r"\bDO\s+UPDATE\b", masked, re.I):
        end = _arm_end(masked, m.end())
        yield Edit("do-update-nothing", m.start(), text[m.start() : end], "DO NOTHING")


def _arm_end(masked: str, at: int) -> int:
    """Where a ``DO UPDATE`` arm starting before ``at`` ends: at RETURNING, at the parenthesis that
    closes the statement it sits in, or at the end, trailing whitespace left out."""
    depth = 0
    i = at
    while i < len(masked):
        if masked[i] == "(":
            depth += 1
        elif masked[i] == ")":
            depth -= 1
            if depth < 0:
                break
        elif depth == 0 and re.match(r"RETURNING\b", masked[i:], re.I) and not masked[i - 1].isalnum():
            break
        i += 1
    return len(masked[:i].rstrip())


def off_by_one(text: str) -> Iterator[Edit]:
    """``+ 1`` becomes ``+ 0`` and ``+ 2``, ``- 1`` becomes ``- 0`` and ``- 2``; ``LIMIT 1`` becomes
    ``LIMIT 2`` (sequence, token and count arithmetic)."""
    masked = _masked(text)
    for m in re.finditer(r"(?<![\w.])([+-])\s*1(?![\w.])", masked):
        old = text[m.start() : m.end()]
        for n in ("0", "2"):
            yield Edit("off-by-one", m.start(), old, old[:-1] + n)
    for m in re.finditer(r"\bLIMIT\s+1\b", masked, re.I):
        old = text[m.start() : m.end()]
        yield Edit("off-by-one", m.start(), old, old[:-1] + "2")


_LUA_COND = re.compile(r"\b(if|elseif|while|until)\b(.*?)\b(then|do)\b|\breturn\b([^\n]*)", re.S)
_LUA_SPLIT = re.compile(r"\s+(and|or)\s+")


def lua_drop_condition(text: str) -> Iterator[Edit]:
    """Lua: in an ``if``/``while`` condition (or a returned ``a and b``), each ``and``/``or`` operand
    dropped in turn (a dropped check)."""
    masked = _masked(text)
    for m in _LUA_COND.finditer(masked):
        group = 2 if m.group(2) is not None else 4
        start, end = m.start(group), m.end(group)
        body = masked[start:end]
        depth = 0
        cuts: list[tuple[int, int, str]] = []  # top-level and/or: (start, end, word) within body
        i = 0
        while i < len(body):
            ch = body[i]
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            elif depth == 0:
                s = _LUA_SPLIT.match(body, i)
                if s is not None:
                    cuts.append((s.start(), s.end(), s.group(1)))
                    i = s.end()
                    continue
            i += 1
        if not cuts:
            continue
        lead = len(body) - len(body.lstrip())
        trail = len(body.rstrip())
        bounds = [lead, *[c for cut in cuts for c in cut[:2]], trail]
        operands = [(bounds[2 * k], bounds[2 * k + 1]) for k in range(len(cuts) + 1)]
        for k, (o_start, o_end) in enumerate(operands):
            # drop operand k together with the joining word next to it
            if k == 0:
                cut_start, cut_end, word = o_start, cuts[0][1], cuts[0][2]
            else:
                cut_start, cut_end, word = cuts[k - 1][0], o_end, cuts[k - 1][2]
            a, b = start + cut_start, start + cut_end
            yield Edit(f"lua-drop-{word}", a, text[a:b], "")


SQL_OPERATORS: tuple[Operator, ...] = (
    comparison,
    least_greatest,
    min_max,
    clock,
    drop_conjunct,
    drop_for_update,
    drop_skip_locked,
    drop_desc,
    do_nothing_update,
    off_by_one,
)
"""The operators run on a SQL statement."""

LUA_OPERATORS: tuple[Operator, ...] = (
    comparison,
    lua_equality,
    lua_min_max,
    off_by_one,
    lua_drop_condition,
)
"""The operators run on a Lua script."""


def edits(text: str, operators: tuple[Operator, ...]) -> list[Edit]:
    """Every edit ``operators`` derive from ``text``, in text order, each once, none a no-op."""
    found: dict[tuple[int, str, str], Edit] = {}
    for operator in operators:
        for edit in operator(text):
            if edit.old != edit.new:
                found.setdefault((edit.start, edit.old, edit.new), edit)
    return sorted(found.values(), key=lambda e: (e.start, e.operator, e.new))
