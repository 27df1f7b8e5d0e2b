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

# Fencing tokens come from one sequence for every workflow, never from a claim row's own count:
# a row the sweep deleted would restart that count, and a running pass's token be handed out again.
# A token is also at least its row's last one plus one, so tokens of a workflow only go up.
CREATE_TOKEN_SEQ = "CREATE SEQUENCE IF NOT EXISTS workflow_token_seq"

# A database whose claim rows were minted before the token sequence existed (each row counted
# from 1): start the sequence above every token already held, so none is handed out again.
CATCH_UP_TOKEN_SEQ = """
SELECT setval('workflow_token_seq', top.token)
  FROM (SELECT max(token) AS token FROM workflow_claim) AS top,
       (SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS issued FROM workflow_token_seq) AS seq
 WHERE top.token > seq.issued
"""

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


def _add_column(table: str, column: str, definition: str) -> str:
    """A statement adding ``column`` to ``table`` where it is missing, looking first: an ALTER
    TABLE, even one with IF NOT EXISTS, takes the table's strongest lock, and every booting worker
    migrates."""
    return f"""
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_attribute
         WHERE attrelid = '{table}'::regclass AND attname = '{column}' AND NOT attisdropped
    ) THEN
        ALTER TABLE {table} ADD COLUMN {column} {definition};
    END IF;
END $$
"""


# owner: the presence id of the worker that made the claim, when it asked for fast failover
# (failover.py), else NULL. Added to a claim table made before it existed (_add_column). A nullable
# column without a default changes only the catalog.
ADD_CLAIM_OWNER = _add_column("workflow_claim", "owner", "integer")

# The reap (failover.REAP) looks only at live claims with an owner.
CREATE_CLAIM_OWNED = (
    "CREATE INDEX IF NOT EXISTS workflow_claim_owned ON workflow_claim (alive_until) WHERE owner IS NOT NULL"
)

CREATE_QUEUE = """
CREATE TABLE IF NOT EXISTS workflow_queue (
    namespace  text        NOT NULL,
    workflow   text        NOT NULL,
    visibility timestamptz NOT NULL,
    PRIMARY KEY (namespace, workflow)
)
"""

# took: the number of the take that last hid the row, half of its receipt (scheduler.TAKE). From
# one sequence for the whole table, so no two takes share one, whatever their times. Added to a
# queue table made before it existed (_add_column); a constant default
# changes only the catalog. A process of an earlier release neither sets nor checks it: its takes
# leave the number as it was (their visibility still tells them apart) and its answers act as before.
CREATE_TAKE_SEQ = "CREATE SEQUENCE IF NOT EXISTS workflow_take_seq"

ADD_QUEUE_TOOK = _add_column("workflow_queue", "took", "bigint NOT NULL DEFAULT 0")

# take scans a namespace for the earliest visible row.
CREATE_QUEUE_DUE = "CREATE INDEX IF NOT EXISTS workflow_queue_due ON workflow_queue (namespace, visibility)"

# -- the transact guard: a commit cannot land while a transact's effect is open -----------------
# transact inserts a row here before the effect and deletes it with the record; the deferred
# trigger runs at COMMIT (or PREPARE TRANSACTION), so an effect that commits on its own finds its
# row still there and the commit fails, rolling the effect back. Unlogged: no row ever outlives
# its transaction, so there is nothing to log or to lose.
CREATE_TRANSACT_GUARD = "CREATE UNLOGGED TABLE IF NOT EXISTS workflow_transact_guard (nonce text PRIMARY KEY)"

# The table is found through the trigger's own schema, so the check holds whatever search_path the
# committing session has. EXECUTE leaves FOUND alone, hence INTO.
CREATE_TRANSACT_GUARD_CHECK = """
CREATE OR REPLACE FUNCTION workflow_transact_guard_check() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    open_guard int;
BEGIN
    EXECUTE format('SELECT 1 FROM %I.%I WHERE nonce = $1', TG_TABLE_SCHEMA, TG_TABLE_NAME)
       INTO open_guard USING NEW.nonce;
    IF open_guard IS NOT NULL THEN
        RAISE EXCEPTION 'a without-durability transact effect tried to end its transaction; '
                        'nothing of it was committed'
              USING ERRCODE = 'invalid_transaction_termination';
    END IF;
    RETURN NULL;
END $$
"""

# CREATE CONSTRAINT TRIGGER has no IF NOT EXISTS; the advisory lock makes the look-first safe.
CREATE_TRANSACT_GUARD_TRIGGER = """
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_trigger
         WHERE tgrelid = 'workflow_transact_guard'::regclass
           AND tgname = 'workflow_transact_guard_at_commit'
    ) THEN
        CREATE CONSTRAINT TRIGGER workflow_transact_guard_at_commit
            AFTER INSERT ON workflow_transact_guard
            DEFERRABLE INITIALLY DEFERRED
            FOR EACH ROW EXECUTE FUNCTION workflow_transact_guard_check();
    END IF;
END $$
"""

# -- history order across a server clock stepped back ------------------------------------------
# written_at is the server's clock_timestamp(), which NTP, an operator or a resumed VM can step
# back: a record would then be stamped before the one loaded ahead of it, and history would say
# it landed first. Never before the workflow's latest record, as the SQLite store stamps. The
# trigger runs once the insert holds the workflow's turn (TAKE_TURN), so the latest is committed
# and no later seq can commit under it; a losing (conflicting) insert changes nothing either way.
CREATE_STAMP_IN_ORDER = """
CREATE OR REPLACE FUNCTION workflow_checkpoint_stamp_in_order() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    latest timestamptz;
BEGIN
    EXECUTE format('SELECT written_at FROM %I.%I WHERE workflow = $1 ORDER BY seq DESC LIMIT 1',
                   TG_TABLE_SCHEMA, TG_TABLE_NAME)
       INTO latest USING NEW.workflow;
    IF latest > NEW.written_at THEN
        NEW.written_at := latest;
    END IF;
    RETURN NEW;
END $$
"""

CREATE_STAMP_IN_ORDER_TRIGGER = """
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_trigger
         WHERE tgrelid = 'workflow_checkpoint'::regclass
           AND tgname = 'workflow_checkpoint_stamp_in_order'
    ) THEN
        CREATE TRIGGER workflow_checkpoint_stamp_in_order
            BEFORE INSERT ON workflow_checkpoint
            FOR EACH ROW EXECUTE FUNCTION workflow_checkpoint_stamp_in_order();
    END IF;
END $$
"""

MIGRATIONS: tuple[str, ...] = (
    CREATE_SEQ,
    CREATE_CHECKPOINT,
    CREATE_CHECKPOINT_ORDER,
    CREATE_CHECKPOINT_AGE,
    CREATE_CLAIM,
    CREATE_TOKEN_SEQ,
    CATCH_UP_TOKEN_SEQ,
    ADD_CLAIM_OWNER,
    CREATE_CLAIM_OWNED,
    CREATE_QUEUE,
    CREATE_TAKE_SEQ,
    ADD_QUEUE_TOOK,
    CREATE_QUEUE_DUE,
    CREATE_TRANSACT_GUARD,
    CREATE_TRANSACT_GUARD_CHECK,
    CREATE_TRANSACT_GUARD_TRIGGER,
    CREATE_STAMP_IN_ORDER,
    CREATE_STAMP_IN_ORDER_TRIGGER,
)
"""Every statement ``migrate`` runs, in order. Each is idempotent."""


async def migrate(pool: AsyncConnectionPool[Any]) -> None:
    """Create the store's tables, indexes and sequence where they are missing, in the first schema
    of the connection's search_path.

    Safe to call from every worker of a fleet booting at once: all callers serialize on one
    advisory lock and each creates only what is still missing, in one transaction. It is not a
    migration tool: the changes it makes to tables that already exist are adding the claim
    table's nullable ``owner`` column (fast failover's) and the queue table's ``took`` column (the
    take's number in each receipt) where they are missing.
    """
    async with connect(pool, "migrating the schema") as conn:
        await conn.execute(TAKE_MIGRATE_LOCK, {"key": MIGRATE_LOCK})
        for statement in MIGRATIONS:
            await conn.execute(statement)
