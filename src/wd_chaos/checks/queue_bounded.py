"""queue-bounded (core): at most one queue entry per workflow at the end of a run."""

from __future__ import annotations

from ..history import Op
from ..rundir import FinalState
from .core import Verdict, checker
from .queue_calls import final_key, final_queue


@checker("queue-bounded")
def queue_bounded(ops: list[Op], final: FinalState) -> Verdict:
    """The store's final queue (``final["queue"]``: entries per workflow, read by the kit's
    ``Opened.read_queue``) holds at most one entry per workflow. A kit that declares more
    (``final["queue_entries_per_workflow"]`` above 1, from ``Opened.queue_entries_per_workflow``)
    has its counts reported, not judged; a kit that reads no queue is reported as not read."""
    del ops
    queue = final_queue(final)
    if queue is None:
        return Verdict(
            "queue-bounded", True, "not judged: the store's kit does not read its queue (Opened.read_queue)",
            [], {"read": 0},
        )  # fmt: skip
    allowed = int(str(final_key(final, "queue_entries_per_workflow") or 1))
    entries = sum(queue.values())
    most = max(queue.values(), default=0)
    counts = {"read": 1, "entries": entries, "workflows": len(queue), "most_per_workflow": most}
    over = {wf: n for wf, n in sorted(queue.items()) if n > 1}
    if allowed > 1:
        return Verdict(
            "queue-bounded", True,
            f"reported, not judged (the kit declares up to {allowed} entries per workflow): "
            f"{entries} entries for {len(queue)} workflows, at most {most} for one",
            [{"workflow": wf, "entries": n} for wf, n in over.items()], counts,
        )  # fmt: skip
    if over:
        return Verdict(
            "queue-bounded", False,
            f"{len(over)} workflow(s) with more than one queue entry ({entries} entries for {len(queue)} workflows)",
            [{"workflow": wf, "entries": n, "why": "more than one queue entry at the end"} for wf, n in over.items()],
            counts,
        )  # fmt: skip
    return Verdict("queue-bounded", True, f"{entries} queue entries, at most one per workflow", [], counts)
