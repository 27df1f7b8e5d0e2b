"""Every statement the SQLite store runs, one constant each (``wd-chaos mutate`` finds them here by
name, and a mutant subclass may replace one)."""

from __future__ import annotations

from ..rules import (
    INBOX_DIGITS,
    INBOX_PREFIX,
)

# The WHERE on DO UPDATE is the "is it free" test: a live holder fails it, nothing changes, and
# RETURNING yields no row. Liveness equal to now counts as lapsed. No write sets liveness further
# ahead than its window from now, so a row beyond that was written before the monotonic clock
# restarted (a reboot, which ended every pass) and is free too.
CLAIM = """
INSERT INTO claim (workflow, token, held_until, alive_until, alive_for)
VALUES (:workflow, 1, :held_until, :alive_until, :alive_for)
ON CONFLICT (workflow) DO UPDATE
    SET token = claim.token + 1,
        held_until = excluded.held_until,
        alive_until = excluded.alive_until,
        alive_for = excluded.alive_for
    WHERE claim.alive_until <= :now OR claim.alive_until > :now + claim.alive_for
RETURNING token
"""

# The fence and the renewal in one statement: the token is in the WHERE, so a refused write renews
# nobody, and min() keeps liveness under the budget (and so under a release).
FENCE_AND_RENEW = """
UPDATE claim SET alive_until = min(:now + alive_for, held_until)
WHERE workflow = :workflow AND token = :token
RETURNING token
"""

RELEASE = """
UPDATE claim SET held_until = min(held_until, :now), alive_until = min(alive_until, :now)
WHERE workflow = :workflow AND token = :token
"""

FENCE_HOLDS = "SELECT 1 FROM claim WHERE workflow = :workflow AND token = :token"

DISCARD_RECORDS = "DELETE FROM checkpoint WHERE workflow = :workflow"

# Raise the token rather than delete the row: a deleted row would restart tokens at 1 and let a
# pass in flight outrank the next claim.
DISCARD_FENCE = """
UPDATE claim SET token = token + 1,
    held_until = min(held_until, :now), alive_until = min(alive_until, :now)
WHERE workflow = :workflow
"""

# Never before the workflow's latest record, so a wall clock stepped back cannot reverse history
# (the checkpoint_order index finds that record at once).
_STAMP = """max(:now, coalesce(
    (SELECT written_at FROM checkpoint WHERE workflow = :workflow ORDER BY seq DESC LIMIT 1), :now))"""

# First writer wins: a conflicting insert changes nothing, so seq and written_at stay the winner's.
PUT = f"""
INSERT INTO checkpoint (workflow, key, value, written_at)
VALUES (:workflow, :key, :value, {_STAMP})
ON CONFLICT (workflow, key) DO NOTHING
"""

STORED = "SELECT value FROM checkpoint WHERE workflow = :workflow AND key = :key"

# One number spent twice, as the key and as the load position, read in the statement that inserts
# (the IMMEDIATE transaction means no other writer can take the same number meanwhile).
APPEND = f"""
INSERT INTO checkpoint (seq, workflow, key, value, written_at)
SELECT next.seq, :workflow, '{INBOX_PREFIX}' || printf('%0{INBOX_DIGITS}d', next.seq), :value, {_STAMP}
FROM (SELECT coalesce(max(seq), 0) + 1 AS seq FROM checkpoint) AS next
RETURNING key
"""

LOAD = "SELECT key, value, written_at FROM checkpoint WHERE workflow = :workflow ORDER BY seq"

# The earlier of the queued and the asked-for time wins, and the row always moves, at least a
# microsecond earlier: a pass whose receipt is already in the past (slower than its visibility, or
# a wall clock stepped ahead) must find it gone, or its answer would delete this wakeup.
SCHEDULE = """
INSERT INTO queue (namespace, workflow, visibility) VALUES (:namespace, :workflow, :at)
ON CONFLICT (namespace, workflow) DO UPDATE
    SET visibility = min(queue.visibility - 1, excluded.visibility)
"""

NEXT_DUE = """
SELECT workflow FROM queue
WHERE namespace = :namespace AND visibility <= :now
ORDER BY visibility, workflow
LIMIT 1
"""

# Every take draws the next number (take_count only grows, whatever is deleted), so no two takes
# share one, even two whose visibilities end at the same instant.
NEXT_TAKE = "UPDATE take_count SET n = n + 1 RETURNING n"

HIDE = """
UPDATE queue SET visibility = :hidden, took = :took WHERE namespace = :namespace AND workflow = :workflow
"""

# The receipt is the visibility the take set and the take's number: if the row moved (a wakeup), is
# gone (a cancel) or was taken since, these match nothing, so that wakeup stands, a cancelled
# workflow is not reinstated, and a superseded holder's answer leaves the newer take's alone.
ANSWER_AGAIN = """
UPDATE queue SET visibility = :at
WHERE namespace = :namespace AND workflow = :workflow AND visibility = :taken AND took = :took
"""

ANSWER_DONE = """
DELETE FROM queue
WHERE namespace = :namespace AND workflow = :workflow AND visibility = :taken AND took = :took
"""

CANCEL = "DELETE FROM queue WHERE namespace = :namespace AND workflow = :workflow"
