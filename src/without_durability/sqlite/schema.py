"""The SQLite store's file layout: its schema version and tables, and how it writes times (integer
microseconds, which compare exactly)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ..clock import epoch_micros

SCHEMA_VERSION = 3
"""The schema this version reads and writes, kept in ``PRAGMA user_version``. Version 2 measures
claim deadlines on the monotonic clock; version 3 numbers every take (``take_count``, and the
queue row's ``took``), so that a receipt names one take even where two takes hid a workflow until
the same instant. Older files are upgraded in place when opened: version 1's wall-clock deadlines
read as from before a reboot, so its claims lapse and their tokens, the fence, carry on; the take
number starts at 0, and a delivery handed out before the upgrade answers nothing (its process held
the receipt, and the upgrading process is a new one)."""

_UPGRADABLE = (1, 2)

APPLICATION_ID = 0x57445331  # "WDS1": marks the file as this library's, in PRAGMA application_id

_TABLES = ("checkpoint", "claim", "queue", "take_count")

_TAKE_NUMBERS = (
    "ALTER TABLE queue ADD COLUMN took INTEGER NOT NULL DEFAULT 0",
    "CREATE TABLE take_count (one INTEGER PRIMARY KEY CHECK (one = 1), n INTEGER NOT NULL)",
    "INSERT INTO take_count VALUES (1, 0)",
)
"""Version 3's additions: ``took`` is the number of the take that last hid a queue row (0: none
since it was queued, or since the file was upgraded), drawn from ``take_count``, which only grows."""

# seq is named INTEGER PRIMARY KEY so it is the rowid itself: VACUUM keeps an explicitly declared
# one, and an insert that names no seq gets the highest plus one, like append's.
_SCHEMA = (
    """
    CREATE TABLE checkpoint (
        seq INTEGER PRIMARY KEY,
        workflow TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        written_at INTEGER NOT NULL,
        UNIQUE (workflow, key)
    )
    """,
    "CREATE INDEX checkpoint_order ON checkpoint (workflow, seq)",
    """
    CREATE TABLE claim (
        workflow TEXT PRIMARY KEY,
        token INTEGER NOT NULL,
        held_until INTEGER NOT NULL,
        alive_until INTEGER NOT NULL,
        alive_for INTEGER NOT NULL
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE queue (
        namespace TEXT NOT NULL,
        workflow TEXT NOT NULL,
        visibility INTEGER NOT NULL,
        PRIMARY KEY (namespace, workflow)
    ) WITHOUT ROWID
    """,
    "CREATE INDEX queue_due ON queue (namespace, visibility)",
    *_TAKE_NUMBERS,
)
_UPGRADE = _TAKE_NUMBERS
"""What turns a version 1 or 2 file into version 3 (their tables are the same)."""


# -- time -----------------------------------------------------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


_micros = epoch_micros


def _span(by: timedelta) -> int:
    return by // _MICRO


def _datetime(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)
