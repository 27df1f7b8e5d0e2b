"""cancelled-calls: what a cancelled call may and may not leave behind.

Clients cancel calls: ``asyncio.wait_for`` and ``asyncio.timeout`` around a store call, a request
handler whose client went away, the Worker's renewal ticker cancelled when its pass ends. The
workload (``wd_chaos.client.clients``) does all of it and marks the outcome on the complete line:
``cancelled`` (the client cancelled the call and it ended with ``CancelledError``, or its
``wait_for`` timed out), ``cancel_swallowed`` (the client's cancel was accepted, ``Task.cancel()``
returned True, yet the call returned as if never cancelled), and ``unsent`` (the client knows the
call cannot have reached the server before it was cancelled: its process's only pooled connection
was held by its own open transaction from before the call until after the cancellation).

What a client can know, and so what is judged:

- A cancelled call's outcome is unknown in general: it may have been sent, and may have landed.
  A cancelled append or record lands wholly or not at all, and at most once: its value appears in
  the workflow's last read at most as many times as appends of that value were made (each value
  is unique to its call), and a cancelled record's key holds either its value or another writer's.
  How many cancelled calls landed is counted (information, not a verdict).
- A call ``unsent`` leaves no trace: its value (append) or its key (record, supply) is absent
  from the workflow's last read made after it.
- A cancellation is never swallowed: a call whose cancel was accepted ends with
  ``CancelledError``; one that returns instead leaves every ``wait_for``, ``timeout`` and ticker
  built on it waiting (``no-hung-pass`` sees the ticker).

Unknown when no call was cancelled (nothing judged).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..history import Op, digest
from ..rundir import FinalState
from .core import UNKNOWN, Operation, Verdict, checker, operations

READS = ("load", "history")
LANDING = ("append", "record", "supply")


def _last_reads(all_ops: list[Operation]) -> dict[str, Operation]:
    """Each workflow's last successful read (by when it was invoked)."""
    out: dict[str, Operation] = {}
    for o in all_ops:
        wf = o.workflow
        if (
            o.f in READS
            and o.ok
            and wf is not None
            and o.got("keys") is not None
            and (wf not in out or o.start > out[wf].start)
        ):
            out[wf] = o
    return out


@checker("cancelled-calls")
def cancelled_calls(ops: list[Op], final: FinalState) -> Verdict:
    """No cancellation swallowed; no ``unsent`` call's value or key in the workflow's last read
    made after it; no cancelled append's value there more often than appends of it were made, nor a
    cancelled record's key holding a value no one wrote; and the count of cancelled calls that
    landed (see the module docstring for what a client can know). Unknown when nothing was
    cancelled."""
    del final
    all_ops = operations(ops)
    cancelled = [o for o in all_ops if o.got("cancelled") or o.got("cancel_swallowed")]
    last = _last_reads(all_ops)
    made: Counter[tuple[str, str]] = Counter()
    written: dict[tuple[str, str], set[str]] = {}
    for o in all_ops:
        if o.f == "append" and o.workflow is not None and "value" in o.invoke:
            made[(o.workflow, digest(o.invoke["value"]))] += 1
        if o.f in ("record", "supply", "transact") and o.workflow is not None and "value" in o.invoke:
            written.setdefault((o.workflow, str(o.invoke.get("key"))), set()).add(digest(o.invoke["value"]))
    bad: list[dict[str, Any]] = []
    counts = {"cancelled": 0, "swallowed": 0, "unsent": 0, "landed": 0, "absent": 0, "unjudged": 0}
    for o in cancelled:
        if o.got("cancel_swallowed"):
            counts["swallowed"] += 1
            bad.append(
                o.brief(
                    "the client cancelled this call (the cancel was accepted) and it returned as if "
                    "not cancelled: the store swallowed the cancellation"
                )
            )
            continue
        counts["cancelled"] += 1
        if o.f not in LANDING or o.workflow is None:
            continue
        unsent = bool(o.got("unsent"))
        counts["unsent"] += unsent
        read = last.get(o.workflow)
        if read is None or read.start < o.end:
            counts["unjudged"] += 1  # no read after it: what it left cannot be seen
            continue
        keys = [str(k) for k in read.got("keys") or []]
        digests = [str(d) for d in read.got("digests") or []]
        if o.f == "append":
            if "value" not in o.invoke:
                counts["unjudged"] += 1
                continue
            mine = digest(o.invoke["value"])
            seen = digests.count(mine)
            allowed = made[(o.workflow, mine)]
            if seen > allowed:
                bad.append(
                    {
                        **o.brief(
                            f"a cancelled append's value appears {seen} times, {allowed} append(s) of it made"
                        ),
                        "read": read.brief(),
                    }
                )
                continue
            present = seen > 0
        else:
            key = str(o.invoke.get("key"))
            present = key in keys
            if present and "value" in o.invoke:
                held = digests[keys.index(key)]
                if held not in written.get((o.workflow, key), set()):
                    bad.append(
                        {**o.brief(f"key {key!r} holds a value no writer wrote"), "read": read.brief()}
                    )
                    continue
                present = held == digest(o.invoke["value"])
        if present:
            counts["landed"] += 1
            if unsent:
                bad.append(
                    {
                        **o.brief(
                            "cancelled before it could be sent (the pool's only connection was held "
                            "throughout), yet it landed"
                        ),
                        "read": read.brief(),
                    }
                )
        else:
            counts["absent"] += 1
    if bad:
        return Verdict(
            "cancelled-calls", False, f"{len(bad)} cancelled call(s) left what they may not", bad, counts
        )
    if not cancelled:
        return Verdict("cancelled-calls", UNKNOWN, "no call was cancelled: nothing judged", [], counts)
    return Verdict(
        "cancelled-calls",
        True,
        f"{counts['cancelled']} cancelled calls ({counts['unsent']} before they could be sent): "
        f"{counts['landed']} landed once, {counts['absent']} left nothing, none swallowed",
        [],
        counts,
    )
