"""Replicated servers for failover runs, as one store-neutral type: a ``Replicated`` is a primary,
a standby, and the faults a failover needs (stall the standby, kill the primary, promote).

A store's kit offers replication (``StoreKit.replicated``, capability ``"failover"``) by starting
its own pair and returning a subclass that says how its standby is stalled and promoted: Postgres
with a streaming standby (``without_durability_postgres.replicated``), Redis with replicas under
Sentinel (``without_durability_redis.replicated``). Clients follow the primary as a deployment's
would; ``url`` is what such a client is given. This module names no store.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from .servers import Server, ServerUnavailable, _kill_tree


@dataclass
class Replicated:
    """A primary and its standby, started privately by a store's kit, and the failover's faults.

    ``url`` is what a client that follows the primary is given. ``primary`` and ``standby`` are the
    servers as started; after ``promote`` the standby answers as the primary. ``synchronous`` says
    whether an acknowledged write waited for the standby. Subclasses implement ``standby_pids``
    and ``promote`` (and, where offered, ``isolate_primary`` / ``rejoin_primary``).
    """

    kind: str
    url: str
    primary: Server
    standby: Server
    synchronous: bool
    source: str = "local"

    elects_itself: ClassVar[bool] = False
    """True when the store elects a new primary by itself (``promote`` only waits for it); False
    when a failover manager must promote (the nemesis calls ``promote`` after ``promote_after``)."""
    offers_partition: ClassVar[bool] = False
    """True when ``isolate_primary`` can cut the primary from its standbys but not its clients."""

    @property
    def pid(self) -> int | None:
        """The primary's server process as started (the one ``kill_primary`` kills)."""
        return self.primary.pid

    @property
    def host(self) -> str:
        """The primary's host (the address a partition proxy would stand in front of)."""
        return self.primary.host

    @property
    def port(self) -> int:
        """The primary's port."""
        return self.primary.port

    def standby_pids(self) -> list[int]:
        """The processes ``stall_standby`` stops to hold replication back (the standby, and
        whatever streams to it)."""
        raise NotImplementedError(f"{type(self).__name__} does not say which processes replicate")

    def stall_standby(self) -> None:
        """Hold replication back, as a slow network or a broken link would: SIGSTOP every process
        ``standby_pids`` names (and their children)."""
        for pid in self.standby_pids():
            signal_tree(pid, signal.SIGSTOP)

    def resume_standby(self) -> None:
        """SIGCONT what ``stall_standby`` stopped."""
        for pid in self.standby_pids():
            signal_tree(pid, signal.SIGCONT)

    def kill_primary(self) -> int:
        """SIGKILL the primary and every process under it, as a crashed machine; returns the pid."""
        import psutil

        pid = self.primary.pid
        if pid is None:
            raise ServerUnavailable(f"{self.kind} primary at {self.primary.url} has no known pid")
        with contextlib.suppress(psutil.Error):
            family = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
            # SIGKILL before any SIGCONT: a stopped sender let run for a moment would send what
            # it was holding back
            for proc in family:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        _kill_tree(pid)  # reaps what is left
        return pid

    def promote(self, timeout: float = 30.0) -> Server:
        """Make the standby the primary (or wait until the store has elected one) and return the
        new primary (also ``standby`` from then on); ``ServerUnavailable`` if that does not happen
        within ``timeout`` s."""
        raise NotImplementedError(f"{type(self).__name__} cannot promote its standby")

    def isolate_primary(self) -> None:
        """Cut the primary from its standbys while its clients still reach it (where
        ``offers_partition``); ``ServerUnavailable`` otherwise."""
        raise ServerUnavailable(f"a partition failover is not offered for {self.kind} (use how = 'kill')")

    def rejoin_primary(self) -> None:
        """Heal ``isolate_primary``."""
        raise ServerUnavailable(f"a partition failover is not offered for {self.kind}")

    def log_files(self) -> list[Path]:
        """The servers' log files, for a post-mortem of a failover (none by default)."""
        return []

    def restart(self, *, kill: bool = True) -> None:
        """Not offered: a replicated pair is faulted by ``kill_primary`` and ``promote``."""
        raise ServerUnavailable("a replicated pair is not restarted in place; use kill_primary and promote")


def signal_tree(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid`` and every process under it (gone ones are skipped)."""
    import psutil

    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)


def deadline(timeout: float, what: str) -> Iterator[None]:
    """Yield until ``timeout`` s have passed, then raise ``ServerUnavailable`` naming ``what``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        yield
        time.sleep(0.05)
    raise ServerUnavailable(f"{what} did not happen within {timeout:.0f}s")
