"""How soon a killed worker's workflow was claimed again, read from a wd-chaos run's history.

    python -m benchmarks.takeover RUN_FOLDER [RUN_FOLDER ...]

For every failpoint kill in the run (a worker SIGKILLs itself at ``after-effect-before-record``,
``inside-transact`` or ``after-claim``, logging the workflow and token it held just before), the
time from that kill to the next claim of the workflow that completed with a higher token, beside
when the dead pass's lease lapsed: ``alive`` after the last write of that token that renews it
(its claim, renewals, records), measured from when each was invoked. With fast failover
(``WD_POSTGRES_FAST_FAILOVER=1``) the takeover comes before the lapse; with leases only, after.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RENEWING = {"claim", "renew", "record", "transact"}


def takeovers(folder: Path) -> list[dict[str, Any]]:
    """One row per failpoint kill: workflow, token, ms to the next claim, ms to the lease lapse."""
    invokes: dict[str, dict[str, Any]] = {}
    kills: list[dict[str, Any]] = []
    claims: list[tuple[str, int, int]] = []  # (workflow, token, complete mono)
    renewed: dict[tuple[str, int], tuple[int, float]] = {}  # (workflow, token) -> (latest invoke, alive)
    alive_of: dict[tuple[str, int], float] = {}
    for line in (folder / "history.jsonl").read_text().splitlines():
        e = json.loads(line)
        kind = e.get("type")
        if kind == "fault" and e.get("phase") == "start" and e.get("workflow") and e.get("token") is not None:
            kills.append(e)
        elif kind == "invoke" and "op" in e:
            invokes[e["op"]] = e
        elif kind == "complete" and e.get("outcome") == "ok" and e.get("op") in invokes:
            inv = invokes[e["op"]]
            wf, token = inv.get("workflow"), e.get("token", inv.get("token"))
            if wf is None or token is None or e["f"] not in RENEWING:
                continue
            key = (wf, int(token))
            if e["f"] == "claim":
                claims.append((wf, int(token), int(e["mono"])))
                alive_of[key] = float(inv.get("alive", 0.0))
            last = renewed.get(key)
            if last is None or inv["mono"] > last[0]:
                renewed[key] = (int(inv["mono"]), 0.0)
    rows = []
    for k in kills:
        wf, token, at = k["workflow"], int(k["token"]), int(k["mono"])
        later = [m for w, t, m in claims if w == wf and t > token and m > at]
        last = renewed.get((wf, token))
        alive = alive_of.get((wf, token))
        lapse = None if last is None or alive is None else (last[0] + alive * 1e9 - at) / 1e6
        rows.append(
            {
                "failpoint": k["id"].split(".")[0],
                "workflow": wf,
                "token": token,
                "takeover_ms": (min(later) - at) / 1e6 if later else None,
                "lease_lapse_ms": lapse,
            }
        )
    return rows


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(arg)
        for r in takeovers(Path(arg)):
            took = "never" if r["takeover_ms"] is None else f"{r['takeover_ms']:.0f} ms"
            lapse = "-" if r["lease_lapse_ms"] is None else f"{r['lease_lapse_ms']:.0f} ms"
            print(
                f"  {r['failpoint']:28} {r['workflow']} token {r['token']}: claimed again after {took}; "
                f"its lease lapsed {lapse} after the kill"
            )
