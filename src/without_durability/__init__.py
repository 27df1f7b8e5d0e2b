"""without-durability: durable workflows whose guarantees live in an interface.

``Checkpointer`` says what a workflow has done and who may write it; ``Scheduler`` says when it may
run; a ``Durable`` bundles the two and names the transitions across them. Stores for Postgres and
Redis live in ``without_durability_postgres`` and ``without_durability_redis`` and are never imported
here.
"""

from __future__ import annotations

from ._values import Delivery, Entry, Pass, Recorded
from .clock import Clock, ManualClock, system_clock
from .codec import CheckpointCodec, JsonCodec, verify_codec
from .durable import SplitDurable
from .errors import (
    Contended,
    Fenced,
    InvalidInput,
    InvalidKey,
    InvalidValue,
    InvalidWorkflowId,
    SchemaMismatch,
    StoreError,
    StoreUnavailable,
    Suspended,
    Swallowed,
    WithoutDurabilityError,
)
from .lifecycle import RetryPolicy, Status, WorkflowFailed, rearm, status_of
from .memory import MemoryCheckpointer, MemoryDurable, MemoryEffect, MemoryScheduler
from .protocols import AnswersAndTakes, Checkpointer, Durable, Effect, Scheduler, TakesAndClaims
from .run import Blocked, Finished, Outcome, Run, Sleeping, resume
from .sqlite import (
    SqliteCheckpointer,
    SqliteConnection,
    SqliteDurable,
    SqliteEffect,
    SqliteScheduler,
    sqlite_connect,
)
from .worker import Wakeup, Worker

__all__ = [
    "AnswersAndTakes",
    "Blocked",
    "Finished",
    "Outcome",
    "Run",
    "Sleeping",
    "Wakeup",
    "Worker",
    "resume",
    "RetryPolicy",
    "Status",
    "WorkflowFailed",
    "rearm",
    "status_of",
    "CheckpointCodec",
    "Checkpointer",
    "Clock",
    "Contended",
    "Delivery",
    "Durable",
    "Effect",
    "Entry",
    "Fenced",
    "InvalidInput",
    "InvalidKey",
    "InvalidValue",
    "InvalidWorkflowId",
    "JsonCodec",
    "ManualClock",
    "MemoryCheckpointer",
    "MemoryDurable",
    "MemoryEffect",
    "MemoryScheduler",
    "Pass",
    "Recorded",
    "Scheduler",
    "SchemaMismatch",
    "TakesAndClaims",
    "SplitDurable",
    "SqliteCheckpointer",
    "SqliteConnection",
    "SqliteDurable",
    "SqliteEffect",
    "SqliteScheduler",
    "StoreError",
    "StoreUnavailable",
    "Suspended",
    "Swallowed",
    "WithoutDurabilityError",
    "sqlite_connect",
    "system_clock",
    "verify_codec",
]
