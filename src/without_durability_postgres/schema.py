"""The schema, and ``migrate``: create it if absent, safely from many processes at once."""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from ._boundary import connect

MIGRATE_LOCK = 0x77645F70675F6D67
"""The advisory lock key every ``migrate`` takes ("wd_pg_mg" in ASCII)."""

# Two sessions running CREATE ... IF NOT EXISTS at once can both miss the other's uncommitted
# catalog row and then collide on the catalog's unique index; the lock makes them take turns.
TAKE_MIGRATE_LOCK = "SELECT pg_advisory_xact_lock(%(key)s)"

CREATE_SEQ = "CREATE SEQUENCE IF NOT EXISTS workflow_seq"

# seq has a DEFAULT, not an identity: append must be able to supply the number it drew itself.
# written_at's DEFAULT is clock_timestamp(), the moment of the insert, not the transaction start;
# both defaults fire only on insert, so a losing write moves neither.
CREATE_CHECKPOINT = """
CREATE TABLE IF NOT EXISTS workflow_checkpoint (
    workflow   text        NOT NULL,
    key        text        NOT NULL,
    value      jsonb       NOT NULL,
    seq        bigint      NOT NULL DEFAULT nextval('workflow_seq'),
    written_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (workflow, key)
)
"""

# load and history read a workflow in seq order; the sweep finds old workflows by written_at.
CREATE_CHECKPOINT_ORDER = (
    "CREATE INDEX IF NOT EXISTS workflow_checkpoint_order ON workflow_checkpoint (workflow, seq)"
)
CREATE_CHECKPOINT_AGE = (
    "CREATE INDEX IF NOT EXISTS workflow_checkpoint_age ON workflow_checkpoint (written_at)"
)

# held_until is the budget; alive_until (kept at or below it) is when silence lapses the claim;
# alive_for rides on the row so a renewal by record uses the window this claim asked for.
CREATE_CLAIM = """
CREATE TABLE IF NOT EXISTS workflow_claim (
    workflow    text        PRIMARY KEY,
    token       bigint      NOT NULL,
    held_until  timestamptz NOT NULL,
    alive_until timestamptz NOT NULL,
    alive_for   interval    NOT NULL
)
"""

CREATE_QUEUE = """
CREATE TABLE IF NOT EXISTS workflow_queue (
    namespace  text        NOT NULL,
    workflow   text        NOT NULL,
    visibility timestamptz NOT NULL,
    PRIMARY KEY (namespace, workflow)
)
"""

# take scans a namespace for the earliest visible row.
CREATE_QUEUE_DUE = "CREATE INDEX IF NOT EXISTS workflow_queue_due ON workflow_queue (namespace, visibility)"

MIGRATIONS: tuple[str, ...] = (
    CREATE_SEQ,
    CREATE_CHECKPOINT,
    CREATE_CHECKPOINT_ORDER,
    CREATE_CHECKPOINT_AGE,
    CREATE_CLAIM,
    CREATE_QUEUE,
    CREATE_QUEUE_DUE,
)
"""Every statement ``migrate`` runs, in order. Each is idempotent."""


async def migrate(pool: AsyncConnectionPool[Any]) -> None:
    """Create the store's tables, indexes and sequence where they are missing, in the first schema
    of the connection's search_path.

    Safe to call from every worker of a fleet booting at once: all callers serialize on one
    advisory lock and each creates only what is still missing, in one transaction. It is not a
    migration tool: it never changes a table that already exists.
    """
    async with connect(pool, "migrating the schema") as conn:
        await conn.execute(TAKE_MIGRATE_LOCK, {"key": MIGRATE_LOCK})
        for statement in MIGRATIONS:
            await conn.execute(statement)
