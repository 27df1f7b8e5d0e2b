"""Careless callers, and the ``misuse`` checker that judges what the store did with them.

A store is only as safe as what it does when a caller gets the API wrong. Two knobs of a scenario's
``[workload]`` make the workload's clients careless, the way real users are:

- ``careless_effects``: in that share of the workflows a pass first runs the ``ledger`` transact
  with an effect that writes its ledger row (under ``CARELESS_LEDGER_KEY``, so the row names its
  effect) and then fails: in three workflows of four after trying to end the transaction it was
  given (``COMMIT`` then ``BEGIN``, through the handle the store passed in), else plainly. The store must refuse the commit
  or roll it all back, so no such row may survive; the pass then runs its transact properly.
- ``forged_keys``: each outside writer also tries to ``supply`` a reserved lifecycle key
  (``FORGED_KEY``) to every workflow. The store must refuse it with ``InvalidKey`` and store
  nothing.

The history marks these calls (``careless`` on the transact's invoke, ``forged`` on the supply's),
so the checker judges exactly what the clients observed. A store whose effects are not callables
over a cursor (a Redis ``LuaEffect``, a script that cannot end anything) gets no careless effects.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..history import CARELESS_LEDGER_KEY, Op
from ..rundir import FinalState
from .core import UNKNOWN, Verdict, _final_values, checker, operations


@checker("misuse")
def misuse(ops: list[Op], final: FinalState) -> Verdict:
    """No careless effect's ledger row survives (its transaction committed without the record) and
    no careless transact returned as won; every forged reserved-key write was refused as
    ``InvalidKey`` and its key is in no load and not in the final state. Unknown when the run tried
    neither (it then proves nothing)."""
    bad: list[dict[str, Any]] = []
    all_ops = operations(ops)
    careless = [o for o in all_ops if o.f == "transact" and o.invoke.get("careless")]
    forged = [o for o in all_ops if o.f == "supply" and o.invoke.get("forged")]
    by_token: dict[tuple[str, int | None], list[Any]] = defaultdict(list)
    for o in careless:
        by_token[(str(o.workflow), o.token)].append(o)
        if o.ok and o.got("won"):
            bad.append(o.brief("a careless effect raised, yet the transact returned as won"))
    for row in final.get("ledger", []):
        if row.get("key") == CARELESS_LEDGER_KEY:
            culprits = by_token.get((str(row["workflow"]), int(row["token"])), [])
            bad.append(
                {
                    "workflow": row["workflow"],
                    "ledger_row": row,
                    "ops": [o.brief() for o in culprits],
                    "why": "a careless effect's ledger row survived: its transaction committed "
                    "without the record (the effect ended it, or its failure was not rolled back)",
                }
            )
    refused = 0
    for o in forged:
        if o.ok:
            bad.append(o.brief(f"a reserved key {o.invoke.get('key')!r} was accepted from a caller"))
        elif o.outcome == "failed":
            if str(o.got("error") or "").startswith("InvalidKey"):
                refused += 1
            else:
                bad.append(o.brief("a reserved key was refused, but not with InvalidKey"))
    forged_keys = {(str(o.workflow), str(o.invoke.get("key"))) for o in forged}
    for wf, key in sorted(forged_keys):
        if key in _final_values(final, wf):
            bad.append({"workflow": wf, "key": key, "why": "a forged reserved key is in the final state"})
    for o in all_ops:
        if o.f in ("load", "history") and o.ok and o.workflow is not None:
            seen = {str(k) for k in (o.got("keys") or [])}
            for wf, key in forged_keys:
                if wf == o.workflow and key in seen:
                    bad.append(o.brief(f"a load showed the forged reserved key {key!r}"))
    counts = {
        "careless_transacts": len(careless),
        "careless_rows_kept": sum(1 for r in final.get("ledger", []) if r.get("key") == CARELESS_LEDGER_KEY),
        "forged_writes": len(forged),
        "forged_refused": refused,
    }
    if bad:
        return Verdict("misuse", False, f"{len(bad)} misuse let through", bad, counts)
    if not careless and not forged:
        return Verdict(
            "misuse", UNKNOWN, "no careless effect or forged key was tried: nothing judged", [], counts
        )
    return Verdict(
        "misuse",
        True,
        f"{len(careless)} careless effects rolled back, {refused} of {len(forged)} forged keys refused",
        [],
        counts,
    )
