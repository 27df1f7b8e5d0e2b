"""The sweep: collect finished and failed workflows, since nothing here expires on its own.

Terminal is what the Worker's lifecycle records say (``without_durability.lifecycle``): a
``wd/finished`` record, or more ``wd/failed/<g>`` than ``wd/rearmed/<g>`` records. A workflow
waiting for an arrival is live however old its records are, so it is kept unless the caller asks,
explicitly, to remove abandoned ones too (``abandoned_after``).
"""

from __future__ import annotations

from datetime import timedelta

from without_durability.errors import InvalidInput

from ._boundary import Pool, connect

# A workflow may be swept when its newest record is older than the cutoff, it is terminal (or,
# only when asked, untouched for abandoned_after), it is not queued in any namespace, and no live
# claim holds it. Each row says which age found it, for the re-check below.
FIND_IDLE = """
SELECT cp.workflow,
       bool_or(cp.key = 'wd/finished')
       OR count(*) FILTER (WHERE cp.key LIKE 'wd/failed/%%')
          > count(*) FILTER (WHERE cp.key LIKE 'wd/rearmed/%%') AS terminal
  FROM workflow_checkpoint cp
 GROUP BY cp.workflow
HAVING ((max(cp.written_at) < now() - %(age)s
         AND (bool_or(cp.key = 'wd/finished')
              OR count(*) FILTER (WHERE cp.key LIKE 'wd/failed/%%')
                 > count(*) FILTER (WHERE cp.key LIKE 'wd/rearmed/%%')))
        OR max(cp.written_at) < now() - %(abandoned)s::interval)
   AND NOT EXISTS (SELECT 1 FROM workflow_queue q WHERE q.workflow = cp.workflow)
   AND NOT EXISTS (SELECT 1 FROM workflow_claim c
                    WHERE c.workflow = cp.workflow AND c.alive_until > now())
"""

# Sweeping a workflow is a discard: raise the fence under the claim row's lock first (re-checking,
# under that lock, that no live claim appeared since), so a pass in flight cannot write after.
SWEEP_FENCE = """
UPDATE workflow_claim
   SET token = GREATEST(token + 1, nextval('workflow_token_seq')),
       held_until = LEAST(held_until, now()),
       alive_until = LEAST(alive_until, now())
 WHERE workflow = %(workflow)s AND alive_until <= now()
RETURNING token
"""
HAS_CLAIM = "SELECT 1 FROM workflow_claim WHERE workflow = %(workflow)s"

# Delete only if, in this newer snapshot, the workflow is still old and unqueued: a supply or a
# wakeup that landed since it was found keeps it. Its terminal state needs no re-check: only a new
# record (a rearm) changes it, and that record is younger than the cutoff.
SWEEP_FORGET = """
DELETE FROM workflow_checkpoint
 WHERE workflow = %(workflow)s
   AND (SELECT max(written_at) FROM workflow_checkpoint WHERE workflow = %(workflow)s)
       < now() - %(age)s
   AND NOT EXISTS (SELECT 1 FROM workflow_queue WHERE workflow = %(workflow)s)
"""

# Claim rows lapsed for longer than the cutoff are locked first, so any record holding one has
# committed (and any later one will find the row gone and be fenced) ...
LOCK_OLD_CLAIMS = """
SELECT workflow FROM workflow_claim
 WHERE alive_until < now() - %(age)s
 FOR UPDATE SKIP LOCKED
"""

# ... then a new statement, with a snapshot taken after those locks, deletes only those whose
# workflow has no records and no queue row. Deleting a row never lets a token come round again:
# tokens are drawn from workflow_token_seq, so the next claim of the workflow gets a token above
# every one handed out before, and a pass still holding an old one is fenced.
DROP_CLAIMS = """
DELETE FROM workflow_claim c
 WHERE c.workflow = ANY(%(workflows)s)
   AND NOT EXISTS (SELECT 1 FROM workflow_checkpoint cp WHERE cp.workflow = c.workflow)
   AND NOT EXISTS (SELECT 1 FROM workflow_queue q WHERE q.workflow = c.workflow)
"""


async def sweep(pool: Pool, older_than: timedelta, *, abandoned_after: timedelta | None = None) -> int:
    """Delete the records of every finished or failed workflow (per its ``wd/`` lifecycle records)
    whose newest record is older than ``older_than`` and that is neither queued nor held by a live
    claim (each such workflow is discarded: its token is raised first, so a pass in flight is
    fenced), then delete claim rows lapsed for longer than ``older_than`` whose workflow has no
    records and is not queued. Returns how many workflows' records were deleted.

    A workflow that is neither finished nor failed (waiting for an arrival, or run by something
    other than the Worker) is never swept by default, however old. ``abandoned_after`` (off by
    default) sweeps those too once their newest record is older than it: only for an operator who
    knows no arrival is coming, since a later ``arrive`` would then run the body from scratch.

    Nothing here runs on a schedule: call it from a periodic job. It never deletes the claim row of
    a workflow that still has records. Whatever it deletes, no fencing token is handed out twice
    for one workflow: tokens come from one sequence (``workflow_token_seq``), so a claim made
    after a sweep gets a token above every earlier one, and a pass that outlived its claim row
    (one that overran its budget, or stalled past ``older_than``) is fenced at its next write.
    """
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise InvalidInput(f"sweep older_than must be a non-negative timedelta, got {older_than!r}")
    if abandoned_after is not None and (
        not isinstance(abandoned_after, timedelta) or abandoned_after < timedelta(0)
    ):
        raise InvalidInput(
            f"sweep abandoned_after must be None (keep waiting workflows) or a non-negative "
            f"timedelta, got {abandoned_after!r}"
        )
    found = {"age": older_than, "abandoned": abandoned_after}
    async with connect(pool, "finding workflows to sweep") as conn:
        rows = await (await conn.execute(FIND_IDLE, found)).fetchall()
    swept = 0
    for workflow, terminal in rows:
        age = older_than if terminal else abandoned_after
        async with connect(pool, f"sweeping {workflow!r}", workflow) as conn:
            params = {"workflow": workflow, "age": age}
            fenced = await (await conn.execute(SWEEP_FENCE, params)).fetchone()
            if fenced is None and await (await conn.execute(HAS_CLAIM, params)).fetchone():
                continue  # claimed again since it was found: leave it
            if (await conn.execute(SWEEP_FORGET, params)).rowcount:
                swept += 1
    async with connect(pool, "collecting old claim rows") as conn:
        locked = await (await conn.execute(LOCK_OLD_CLAIMS, {"age": older_than})).fetchall()
        old = [workflow for (workflow,) in locked]
        if old:
            await conn.execute(DROP_CLAIMS, {"workflows": old})
    return swept
