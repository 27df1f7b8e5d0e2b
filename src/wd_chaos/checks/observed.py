"""The ``monotonic-loads`` checker: judged on what clients saw, not on the final state.

A load never shows a record before one that an earlier load returned. For two completed reads
(``load`` or ``history``) of one workflow, by any processes, where the first completed before the
second was invoked (the monotonic clock every line carries), the first's keys must be a prefix of
the second's with the same values (compared by the ``digests`` each read's complete line carries),
unless a ``discard`` of the workflow may lie between them. And read-your-writes: a read that a
process invokes after one of its own writes (append, record, supply, transact) was acknowledged
shows that key with the stored value. A reader that walks the inbox with a cursor (``via:
reader``) is replayed to count the messages it would have skipped for good.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from without_durability.testing.prefix import Read, non_prefix

from ..history import Op, digest
from ..rundir import FinalState
from .core import UNKNOWN, Operation, Verdict, checker, operations

READS = ("load", "history")
OWN_WRITES = ("append", "record", "supply", "transact")
INBOX = "inbox/"
WINDOW = 3
"""Keys shown either side of the place two reads part, in the evidence."""


def _items(o: Operation) -> tuple[tuple[str, str | None], ...]:
    keys = [str(k) for k in o.got("keys") or []]
    digests = o.got("digests")
    if not isinstance(digests, list) or len(digests) != len(keys):
        return tuple((k, None) for k in keys)  # an older history: judge the keys alone
    return tuple(zip(keys, (str(d) for d in digests), strict=True))


def _around(read: Read, at: int) -> list[str]:
    keys = [k for k, _ in read.items]
    return keys[max(0, at - WINDOW) : at + WINDOW + 1]


def _who(o: Operation) -> str:
    """The client that ran an operation: its process name and OS pid (locust users share a pid, a
    restarted worker keeps its name)."""
    return f"{o.invoke.get('process')}:{o.invoke.get('pid')}"


def _written(o: Operation) -> tuple[str, str] | None:
    """The key an acknowledged write put (or found) in the store, and the digest of the value the
    store holds under it."""
    if o.f == "append":
        key, value = o.got("key"), o.invoke.get("value")
    else:
        key, value = o.invoke.get("key"), o.got("value")
    return None if key is None else (str(key), digest(value))


@checker("monotonic-loads")
def monotonic_loads(ops: list[Op], final: FinalState) -> Verdict:
    """Every read of a workflow extends every read that completed before it began; a process's
    reads show its own acknowledged writes; and so no cursor over the inbox skips a message."""
    all_ops = operations(ops)
    reads: dict[str, list[Read]] = defaultdict(list)
    discards: dict[str, list[tuple[float, float]]] = defaultdict(list)
    writes: dict[tuple[str, str], list[Operation]] = defaultdict(list)
    for o in all_ops:
        wf = o.workflow
        if wf is None:
            continue
        if o.f in READS and o.ok and o.got("keys") is not None:
            reads[wf].append(Read(o.start, o.end, _items(o), o))
        elif o.f == "discard" and o.outcome != "failed":
            discards[wf].append((o.start, o.end))
        elif o.f in OWN_WRITES and o.ok:
            writes[(_who(o), wf)].append(o)
    bad: list[dict[str, Any]] = []
    broken = 0
    for wf, group in reads.items():
        for np in non_prefix(group, discards.get(wf, ())):
            broken += 1
            earlier, later = np.earlier.label, np.later.label
            bad.append(
                {
                    "workflow": wf,
                    "key": np.key,
                    "why": f"a load {np.why()}",
                    "op": later.invoke.get("op"),
                    "process": later.invoke.get("process"),
                    "earlier": earlier.brief(f"returned {len(np.earlier.items)} records"),
                    "later": later.brief(f"began after it ended; returned {len(np.later.items)} records"),
                    "earlier_keys": _around(np.earlier, np.at),
                    "later_keys": _around(np.later, np.at),
                }
            )
    before = len(bad)
    ryw = _read_your_writes(reads, writes, discards, bad)
    unseen = len(bad) - before
    skips = _cursor_skips(reads, bad)
    total = sum(len(g) for g in reads.values())
    counts = {
        "reads": total,
        "workflows read": len(reads),
        "reads breaking the prefix": broken,
        "keys shown out of place": len({(e["workflow"], e["key"]) for e in bad[:broken]}),
        "reads after own writes": ryw,
        "reads missing an own write": unseen,
        "inbox messages a cursor skipped": skips,
    }
    if bad:
        what = f"{broken} of {total} reads showed a record before one an earlier read returned"
        what += f"; {unseen} missed their own process's write" if unseen else ""
        what += f"; a cursor would have skipped {skips} message(s)" if skips else ""
        return Verdict("monotonic-loads", False, what, bad, counts)
    if not total:
        return Verdict("monotonic-loads", UNKNOWN, "no reads with keys in the history to judge", [], counts)
    return Verdict(
        "monotonic-loads",
        True,
        f"{total} reads of {len(reads)} workflows each extend every earlier one; "
        f"{ryw} reads after own writes showed them",
        [],
        counts,
    )


def _read_your_writes(
    reads: dict[str, list[Read]],
    writes: dict[tuple[str, str], list[Operation]],
    discards: dict[str, list[tuple[float, float]]],
    bad: list[dict[str, Any]],
) -> int:
    """Each read against the acknowledged writes its own process finished before invoking it;
    returns how many reads had at least one such write."""
    checked = 0
    for wf, group in reads.items():
        mine: dict[str, list[Read]] = defaultdict(list)
        for r in group:
            mine[_who(r.label)].append(r)
        for who, rs in mine.items():
            done = sorted(writes.get((who, wf), []), key=lambda o: o.end)
            if not done:
                continue
            for r in rs:
                before = [w for w in done if w.end < r.start]
                if not before:
                    continue
                checked += 1
                seen = dict(r.items)
                for w in before:
                    if any(s < r.end and e > w.start for s, e in discards.get(wf, ())):
                        continue  # a discard may lie between the write and the read
                    written = _written(w)
                    if written is None:
                        continue
                    key, want = written
                    got = seen.get(key, "absent")
                    if got != want and not (got is None and key in seen):
                        bad.append(
                            {
                                "workflow": wf,
                                "key": key,
                                "why": "a read invoked after its own process's write was "
                                f"acknowledged shows {key!r} "
                                + ("missing" if got == "absent" else "with another value"),
                                "op": r.label.invoke.get("op"),
                                "write": w.brief("acknowledged"),
                                "read": r.label.brief("invoked after it, by the same process"),
                            }
                        )
                        break  # one per read
    return checked


def _cursor_skips(reads: dict[str, list[Read]], bad: list[dict[str, Any]]) -> int:
    """Replay each reader (``via: reader``) walking the inbox with a cursor: the messages that
    showed up below its cursor after it had moved past them, never to be consumed."""
    skipped = 0
    for wf, group in reads.items():
        by_reader: dict[tuple[str, int], list[Read]] = defaultdict(list)
        for r in group:
            if r.label.invoke.get("via") == "reader":
                by_reader[(str(r.label.invoke.get("process")), int(r.label.invoke["pid"]))].append(r)
        for (process, _), rs in by_reader.items():
            cursor, consumed = "", set()
            for r in sorted(rs, key=lambda x: x.start):
                inbox = [k for k, _ in r.items if k.startswith(INBOX)]
                for k in inbox:
                    if k > cursor:
                        consumed.add(k)
                    elif k not in consumed:
                        consumed.add(k)  # counted once
                        skipped += 1
                        bad.append(
                            {
                                "workflow": wf,
                                "key": k,
                                "why": f"{process} walks the inbox with a cursor already at {cursor!r}: "
                                f"{k!r} appeared below it and is skipped for good",
                                "op": r.label.invoke.get("op"),
                                "read": r.label.brief("the read it first appeared in"),
                            }
                        )
                cursor = max([cursor, *inbox])
    return skipped
