"""The SQLite store: both interfaces over one file, safe for several worker processes at once.

Three tables and no mechanism of our own. SQLite admits one writer at a time, and every write
here is a transaction begun ``IMMEDIATE`` (the write lock is taken before the first read), so each
method's read-then-write runs alone and nothing can overtake it between the read and the write.
That single writer is also why ``append`` may name its key by counting: the highest ``seq`` plus
one, read in the statement that inserts, is a number no other writer can take meanwhile, and it is
both the key's number and the row's load position.

The file is opened in WAL mode (readers never wait on the writer) with a busy timeout, so a process
that finds the write lock held waits for it rather than failing. Statements run on one dedicated
thread per connection, so that wait never blocks the event loop (a worker's renewal tick shares it),
and the statements of one connection run one at a time in the order they were issued.

Times are read after the write lock is held, so the order of stamps is the order of commits, and
stored as integer microseconds, which compare exactly. Record and queue times are the process's wall
clock (microseconds since the Unix epoch), and a record is never stamped before the record loaded
ahead of it, so a wall clock stepped back cannot reverse a workflow's history. Claim deadlines are
on the machine's monotonic clock (``without_durability.clock``), so a step of the wall clock neither
lapses a live pass nor keeps a dead one holding; the monotonic clock restarts at boot, so a claim
row whose liveness lies further ahead than its own window could reach is from before a reboot and
counts as lapsed (a row from before a reboot that the new clock has caught up with cannot be told
from a live one: it lapses within its alive window, as a crashed pass's does). An injected clock (tests) drives all of these.

What it asks of a deployment: every process on one machine (WAL needs shared memory, so no network
filesystems), which is also what makes the monotonic clock one clock for all of them. Two costs to
know. SQLite's busy wait is sleep-and-retry rather than a queue, so under a steady stream of writes
one process can wait its turn for a while (up to ``busy_timeout``, then ``StoreUnavailable``). And
a process stopped (SIGSTOP, a debugger) inside a write holds the lock, so every writer waits until
it resumes: that costs liveness, never the fence, since nobody can supersede a pass while its write
is open.
"""

from __future__ import annotations

from .checkpointer import SqliteCheckpointer, SqliteEffect
from .connection import DEFAULT_BUSY_TIMEOUT, SqliteConnection, sqlite_connect
from .durable import SqliteDurable
from .scheduler import SqliteScheduler
from .schema import APPLICATION_ID, SCHEMA_VERSION
from .statements import (
    ANSWER_AGAIN,
    ANSWER_DONE,
    APPEND,
    CANCEL,
    CLAIM,
    DISCARD_FENCE,
    DISCARD_RECORDS,
    FENCE_AND_RENEW,
    FENCE_HOLDS,
    HIDE,
    LOAD,
    NEXT_DUE,
    NEXT_TAKE,
    PUT,
    RELEASE,
    SCHEDULE,
    STORED,
)

__all__ = [
    "ANSWER_AGAIN",
    "ANSWER_DONE",
    "APPEND",
    "APPLICATION_ID",
    "CANCEL",
    "CLAIM",
    "DEFAULT_BUSY_TIMEOUT",
    "DISCARD_FENCE",
    "DISCARD_RECORDS",
    "FENCE_AND_RENEW",
    "FENCE_HOLDS",
    "HIDE",
    "LOAD",
    "NEXT_DUE",
    "NEXT_TAKE",
    "PUT",
    "RELEASE",
    "SCHEDULE",
    "SCHEMA_VERSION",
    "STORED",
    "SqliteCheckpointer",
    "SqliteConnection",
    "SqliteDurable",
    "SqliteEffect",
    "SqliteScheduler",
    "sqlite_connect",
]
