"""Fast failover (opt-in): a dead worker's claims are taken over as soon as the server sees the
worker gone, not when their leases lapse.

How. Each worker process holds a *presence*: a session-level advisory lock on an id of its own
(``PRESENCE_LOCK``, a random int4), taken on the connection ``PostgresWakeup(presence=True)``
already keeps for LISTEN. A claim made through ``PostgresCheckpointer(pool, failover=wakeup)``
records that id on its claim row (``owner``). The server releases a session's advisory locks the
moment it ends the session: when the worker process dies (a SIGKILL closes its sockets, and the
idle backend sees end-of-file at once), when the connection is cut and the server notices
(``presence_timeout`` sets the session's TCP keepalive and user timeout so that it notices within
about that long), or when the worker closes the wakeup. So "the holder's presence lock is free"
is the server's own verdict that the holder's session is gone. Two statements act on it:

- the claim (``CLAIM_OWNED``, and the claim inside ``take_and_claim``) takes a live claim row
  over when its ``owner``'s lock is free, exactly as it takes a lapsed one: a new, higher token;
- ``PostgresScheduler(reap_dead=True)`` runs ``REAP`` with every ``take`` and ``take_and_claim``
  (same transaction, same round trip): the queue rows of live claims whose owner's lock is free
  are made visible now (their delivery was hidden for ``visibility`` by the dead worker's take),
  and those claims lapsed. So an idle worker polling every ``poll_interval`` resumes a dead
  worker's workflow within detection + one poll. A worker that never idles (always answering and
  taking in one statement) does not reap; the lease bound still holds for everything.

Why it is safe. Taking over early is never trusted to mean the old holder is dead: it is only
what a lease lapse already is, sooner. Every write a pass makes carries its token and is refused
once a higher token exists (``RECORD``, ``RENEW`` and ``transact``'s ``LOCK_FENCE`` compare the
token under the claim row's lock; the release and the queue answer act only on their own token
and receipt). So:

- the holder died: nothing of it can write again; the takeover only stops the wait.
- the holder's LISTEN connection dropped but the process lives (a network cut, a server-side
  ``pg_terminate_backend``, a proxy restart): its lock is free, its claims are taken over with a
  higher token, and its pass is refused (``Fenced``) at its next record, renewal or transact,
  whose effect rolls back with it. While it has no presence it records no owner on new claims
  (``owner`` is None), so those fall back to the lease; when the listener reconnects it takes its
  lock again (a new id if the old one is taken).
- the server restarts (or fails over, or loses power): every session ends at once, so every
  live claim is taken over by whichever worker claims it before its holder's presence is back,
  and the holders are fenced as above. Their workflows run on from what was recorded; a step
  whose effect ran but whose record was refused runs again, as after any takeover.
- a claim is made with an owner whose lock was freed a moment before (the worker does not know
  yet): it may be taken over at once; its writes are then refused. Wasteful, never wrong.
- the lock test itself: ``pg_try_advisory_xact_lock`` succeeds only if no session holds the
  id's lock, and holds it to the end of the claiming transaction, so a presence re-taking that id
  meanwhile fails and picks another.

A mixed fleet (some workers with fast failover, some without: a rolling deploy, an admin script
with a plain checkpointer, one worker whose ``failover=`` was left unset) may rely on this: a
claim's ``owner`` is always its own claimer's presence or NULL. Every statement that takes a row
over writes ``owner`` afresh: the owned claims set the claimer's id, the plain ``CLAIM`` and
``TAKE_AND_CLAIM`` set NULL, so a plain worker's live pass is protected by its lease alone and is
never taken over because the worker that held the row before it has gone. The statements that lapse
a row (a release, a discard's fence, a sweep) leave ``owner`` as it was, which is harmless: the
takeover test looks at ``owner`` only while the claim is alive.

Ids are random among 2^31; a collision with a live worker's id only makes a dead worker's claims
look alive, which falls back to the lease.

What it gives up: the lease's promise that no second pass starts while the first could still be
running. With fast failover a pass whose session the server dropped may still be running (it
cannot land a write), as after any lease lapse, only sooner.

Redis has no equivalent here: a client's death is not tied to anything the server releases on its
own (no session-scoped lock; ``CLIENT LIST`` shows connections but a script cannot trust it across
a failover), so the Redis stores recover at the lease bound.
"""

from __future__ import annotations

import re
from typing import Protocol


class Presence(Protocol):
    """What ``PostgresCheckpointer(failover=...)`` reads at each claim: ``PostgresWakeup`` built
    with ``presence=True``."""

    @property
    def owner(self) -> int | None:
        """This worker's presence id while its session holds the presence lock, else None (a claim
        then records no owner and is protected by its lease alone)."""
        ...


PRESENCE_LOCK = 0x77645F66
"""The class id of the presence locks ("wd_f" in ASCII; the second key is the worker's id)."""

# A claim row's owner is gone when its presence lock is free. CASE keeps the lock try to the rows
# that need it (a live, owned claim). The xact lock taken when it is free is held to this
# transaction's commit, so no new presence can take that id while the takeover commits.
_OWNER_GONE = f"""CASE WHEN held.owner IS NOT NULL AND held.alive_until > now()
              THEN pg_try_advisory_xact_lock({PRESENCE_LOCK}, held.owner) ELSE false END"""


def owned_claim(statement: str) -> str:
    """A claim statement that records ``%(owner)s`` and takes over a claim whose owner is gone."""
    out = statement.replace(
        "(workflow, token, held_until, alive_until, alive_for)",
        "(workflow, token, held_until, alive_until, alive_for, owner)",
    )
    out = out.replace(
        "LEAST(now() + %(alive)s, now() + %(budget)s), %(alive)s\n",
        "LEAST(now() + %(alive)s, now() + %(budget)s), %(alive)s, %(owner)s\n",
    )
    out = re.sub(
        r"( *)owner = NULL\n( *)WHERE held.alive_until <= now\(\)",
        lambda m: f"{m[1]}owner = EXCLUDED.owner\n{m[2]}WHERE held.alive_until <= now() OR {_OWNER_GONE}",
        out,
    )
    assert out.count("%(owner)s") == 1 and "owner = EXCLUDED.owner" in out, "claim statement changed"
    return out


# Live claims whose owner is gone: lapse them (the token is kept; the next claim raises it) and
# make their workflows' queue rows visible now, so the next take hands them out. Rows held by a
# transaction in flight (a renewal, a record) are skipped: their owner is writing, so alive.
REAP = f"""
WITH gone AS (
    SELECT held.workflow FROM workflow_claim AS held
     WHERE held.owner IS NOT NULL AND held.alive_until > now() AND {_OWNER_GONE}
       FOR UPDATE OF held SKIP LOCKED
), lapsed AS (
    UPDATE workflow_claim AS c SET alive_until = LEAST(c.alive_until, now()), owner = NULL
      FROM gone WHERE c.workflow = gone.workflow
    RETURNING c.workflow
)
UPDATE workflow_queue AS q SET visibility = now()
  FROM lapsed
 WHERE q.namespace = %(namespace)s AND q.workflow = lapsed.workflow AND q.visibility > now()
"""

# The presence: taken once per session, held until the session ends.
TAKE_PRESENCE = f"SELECT pg_try_advisory_lock({PRESENCE_LOCK}, %(owner)s)"

# The server-side timeouts of the presence session, so a cut connection frees the lock within
# about ``presence_timeout`` rather than the system's keepalive default (hours).
PRESENCE_TIMEOUTS = (
    "SELECT set_config('tcp_keepalives_idle', %(idle)s, false),"
    " set_config('tcp_keepalives_interval', %(interval)s, false),"
    " set_config('tcp_keepalives_count', '3', false),"
    " set_config('tcp_user_timeout', %(user_ms)s, false)"
)
