"""first-writer-wins: every acknowledged write of a key agrees with the value the store keeps."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import (
    WRITES,
    Operation,
    Verdict,
    _final_values,
    canon,
    checker,
    operations,
)


@checker("first-writer-wins")
def first_writer_wins(ops: list[Op], final: FinalState) -> Verdict:
    """Every acknowledged write of a key returns the value the store holds at the end; ``won`` is
    True exactly when the caller offered that value; the stored value was offered by some caller;
    at most one transact of a key won; no acknowledged write is missing from the final state; a
    supply or append from outside a pass is never refused for want of the claim."""
    by_key: dict[tuple[str, str], list[Operation]] = defaultdict(list)
    for o in operations(ops):
        if o.f in WRITES and o.workflow is not None and o.invoke.get("key") is not None:
            by_key[(o.workflow, str(o.invoke["key"]))].append(o)
    bad: list[dict[str, Any]] = []
    acked = 0
    for (wf, key), group in by_key.items():
        values = _final_values(final, wf)
        present = key in values
        stored = canon(values.get(key))
        oks = [o for o in group if o.ok]
        acked += len(oks)
        if oks and not present:
            bad += [o.brief(f"acknowledged, but {key!r} is not in the final state") for o in oks]
            continue
        for o in oks:
            if canon(o.got("value")) != stored:
                bad.append(o.brief(f"returned a value other than the stored {stored}"))
            if o.f != "transact" and "value" in o.invoke:
                offered = canon(o.invoke["value"])
                if bool(o.got("won")) != (offered == stored):
                    bad.append(
                        o.brief(
                            f"won={o.got('won')} but offered "
                            f"{'==' if offered == stored else '!='} stored {stored}"
                        )
                    )
        winners = [o for o in oks if o.f == "transact" and o.got("won")]
        if len(winners) > 1:
            bad += [o.brief("a second transact of this key reported winning") for o in winners]
        if present and not any(o.f == "transact" for o in group):
            offered_any = {
                canon(o.invoke.get("value")) for o in group if o.outcome not in ("fenced", "contended")
            }
            if stored not in offered_any:
                bad.append(
                    {
                        "workflow": wf,
                        "key": key,
                        "stored": values.get(key),
                        "why": "the stored value was offered by no write that may have landed",
                    }
                )
    for o in operations(ops):
        if o.f in ("supply", "append") and o.outcome in ("fenced", "contended"):
            bad.append(
                o.brief(
                    f"{o.f} from outside a pass was refused as {o.outcome}: "
                    "writes from outside a pass are not gated on the claim"
                )
            )
    counts = {"keys": len(by_key), "acknowledged": acked}
    if bad:
        return Verdict("first-writer-wins", False, f"{len(bad)} first-writer-wins violation(s)", bad, counts)
    return Verdict("first-writer-wins", True, f"{len(by_key)} keys agree with the store", [], counts)
