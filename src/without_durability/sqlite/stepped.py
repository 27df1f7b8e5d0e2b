"""The SQLite connection with no thread, for a simulator that drives every await itself.

``SqliteConnection`` runs each statement on a thread of its own, so the event loop never waits on
the write lock; a deterministic simulator (``wd-chaos sim``) cannot have a thread, whose timing no
seed decides. Here the thread's one job, running a batch of statements to its commit, becomes one
*step* of the running event loop: ``read`` and ``write`` schedule the batch with ``call_soon`` and
await its future, so the loop chooses when it runs among the other ready callbacks, and a process
the loop crashes or stalls takes its pending batch with it, as a killed or stopped process takes
its thread. A caller cancelled before its batch ran finds nothing of it applied (as a queued job of
the thread's executor is cancelled); one cancelled after finds it committed (as a job the thread
had begun). Everything else (the file, WAL, the schema check, the statements) is the real store's.

Made for simulated runs only: a batch blocks the loop while it runs, and a busy write lock would
stall every task, so each database should have the one connection, or connections that never hold
a transaction across an await (which no batch does).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from ..errors import StoreError
from .connection import DEFAULT_BUSY_TIMEOUT, SqliteConnection

T = TypeVar("T")


class _Inline(concurrent.futures.Executor):
    """Runs each submitted call at once on the caller's thread; its future is already done."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # the caller's .result() raises it, as a thread's future would
            future.set_exception(exc)
        return future


class SteppedSqliteConnection(SqliteConnection):
    """A ``SqliteConnection`` whose statements run as steps of the running event loop (see the
    module docstring). Opening and ``close_now`` run at once on the caller's thread. ``owned``, if
    given, is a folder this connection removes when it closes (``temporary`` makes one)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: timedelta = DEFAULT_BUSY_TIMEOUT,
        synchronous: str = "FULL",
        owned: Path | None = None,
    ) -> None:
        self.owned = owned
        super().__init__(path, busy_timeout=busy_timeout)
        if synchronous != "FULL":
            # a simulator's reboot keeps what the OS was handed, so it may spare the fsyncs
            mode = synchronous.upper()
            if mode not in ("OFF", "NORMAL"):
                raise ValueError(f"synchronous must be FULL, NORMAL or OFF, got {synchronous!r}")
            self._require().execute(f"PRAGMA synchronous={mode}")

    @classmethod
    def temporary(cls, *, synchronous: str = "FULL") -> SteppedSqliteConnection:
        """A connection to a new file ``store.db`` in a new temporary folder, removed on close."""
        folder = Path(tempfile.mkdtemp(prefix="wd-sim-sqlite-"))
        try:
            return cls(folder / "store.db", synchronous=synchronous, owned=folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise

    def _new_executor(self) -> concurrent.futures.Executor:
        return _Inline()

    async def _submit(self, call: Callable[[], T]) -> T:
        if self._closed:
            raise StoreError(f"SQLite store {str(self.path)!r}: the connection is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def step() -> None:
            if future.cancelled():
                return  # its caller gave up before it ran: nothing of it is applied
            try:
                result = call()
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

        loop.call_soon(step)  # in the caller's context: its process's crash or stall holds it too
        return await future

    async def close(self) -> None:
        """Close the file at once (see ``close_now``)."""
        self.close_now()

    def close_now(self) -> None:
        """Close the file and remove the owned folder, if any; a step still pending then finds the
        connection closed. Closing twice is harmless."""
        if not self._closed:
            self._closed = True
            self._close_now()
        if self.owned is not None:
            shutil.rmtree(self.owned, ignore_errors=True)
            self.owned = None
