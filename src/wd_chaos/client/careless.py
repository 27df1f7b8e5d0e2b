"""The workload's careless callers (see ``misuse``, whose checker judges them): a transact effect
that writes its ledger row and then fails, having first tried to end its transaction or not, and a
reserved key that writers try to supply. Kept apart from the checker so worker processes import no
checkers."""

from __future__ import annotations

import inspect
from typing import Any

FORGED_KEY = "wd/forged"
"""A reserved key (``wd/`` belongs to the Worker's lifecycle records) that forging writers try."""

HOW = ("commits", "fails")
"""What a careless effect does after writing its row: try to end its transaction and fail, or fail."""


class CarelessFailure(RuntimeError):
    """What a careless effect raises once it has done its damage."""


def careless_effect(inner: Any, how: str) -> Any:
    """Wrap the kit's ledger effect ``inner`` (already built for ``history.CARELESS_LEDGER_KEY``) into one
    that writes its row, then (``how == "commits"``) executes ``COMMIT`` and ``BEGIN`` through the
    handle it was given, then raises ``CarelessFailure``. None when ``inner`` is not a callable
    (the store's effects are scripts, which cannot end a transaction)."""
    if how not in HOW:
        raise ValueError(f"careless effect: how must be one of {HOW}, got {how!r}")
    if not callable(inner):
        return None
    why = f"a careless effect failed after writing its row ({how})"
    if inspect.iscoroutinefunction(inner):

        async def effect_async(cur: Any) -> object:
            await inner(cur)
            if how == "commits":
                await cur.execute("COMMIT")
                await cur.execute("BEGIN")
            raise CarelessFailure(why)

        return effect_async

    def effect(cur: Any) -> object:
        inner(cur)
        if how == "commits":
            cur.execute("COMMIT")
            cur.execute("BEGIN")
        raise CarelessFailure(why)

    return effect
