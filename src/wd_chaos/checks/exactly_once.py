"""exactly-once: a transact's effect lands once, with its record, or not at all."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import (
    Operation,
    Verdict,
    _final_values,
    checker,
    operations,
)


@checker("exactly-once")
def exactly_once(ops: list[Op], final: FinalState) -> Verdict:
    """The store's ledger moved exactly once per recorded transact key and never otherwise; the
    recorded value names the ledger row that moved; a refused transact left no row."""
    bad: list[dict[str, Any]] = []
    rows: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in final.get("ledger", []):
        rows[(str(row["workflow"]), str(row["key"]))].append(row)
    keys: set[tuple[str, str]] = set(rows)
    tx_ops: dict[tuple[str, str], list[Operation]] = defaultdict(list)
    for o in operations(ops):
        if o.f == "transact" and o.workflow is not None:
            k = (o.workflow, str(o.invoke.get("key")))
            tx_ops[k].append(o)
            keys.add(k)
    for wf, key in sorted(keys):
        values = _final_values(final, wf)
        moved = rows.get((wf, key), [])
        evidence = [o.brief() for o in tx_ops.get((wf, key), [])]
        if key in values:
            if len(moved) != 1:
                bad.append(
                    {
                        "workflow": wf,
                        "key": key,
                        "ledger_rows": moved,
                        "ops": evidence,
                        "why": f"recorded once, but the ledger moved {len(moved)} times",
                    }
                )
            elif isinstance(values[key], dict) and values[key].get("row") != moved[0].get("row"):
                bad.append(
                    {
                        "workflow": wf,
                        "key": key,
                        "recorded": values[key],
                        "ledger_rows": moved,
                        "why": "the record names another ledger row",
                    }
                )
        elif moved:
            bad.append(
                {
                    "workflow": wf,
                    "key": key,
                    "ledger_rows": moved,
                    "ops": evidence,
                    "why": "the ledger moved for a key that is not recorded",
                }
            )
        for o in tx_ops.get((wf, key), []):
            if o.outcome == "fenced" and any(r.get("token") == o.token for r in moved):
                bad.append(o.brief("refused as Fenced, but its ledger row survived"))
    counts = {"keys": len(keys), "ledger_rows": sum(len(r) for r in rows.values())}
    if bad:
        return Verdict("exactly-once", False, f"{len(bad)} exactly-once violation(s)", bad, counts)
    return Verdict("exactly-once", True, f"{len(keys)} transact keys moved the ledger once each", [], counts)
