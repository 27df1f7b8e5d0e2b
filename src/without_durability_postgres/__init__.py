"""without-durability's two interfaces over one Postgres: three tables, one sequence, and no
mechanism of its own beyond statements and transactions.

    pool = AsyncConnectionPool(dsn, open=False)
    await pool.open(wait=True)
    await migrate(pool)
    durable = PostgresDurable(PostgresCheckpointer(pool=pool), PostgresScheduler(pool=pool))
"""

from __future__ import annotations

from .checkpointer import PostgresCheckpointer, PostgresEffect
from .durable import PostgresDurable
from .scheduler import PostgresScheduler
from .schema import migrate
from .sweep import sweep
from .wakeup import PostgresWakeup

__all__ = [
    "PostgresCheckpointer",
    "PostgresDurable",
    "PostgresEffect",
    "PostgresScheduler",
    "PostgresWakeup",
    "migrate",
    "sweep",
]
