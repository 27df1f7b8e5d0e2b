"""A private Postgres primary with one streaming standby, for failover runs (the kit's
``replicated``): started from the binaries on PATH, reached through a multi-host conninfo with
``target_session_attrs=read-write`` (libpq tries each host and keeps the one that accepts writes),
promoted with ``pg_ctl promote`` as a failover manager would."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from without_durability.testing.replicated import Replicated, deadline
from without_durability.testing.servers import (
    Server,
    ServerUnavailable,
    executor,
    find_binary,
    free_port,
    own,
)

from .local_server import _postgres_user_prefix, _wait_postgres_ready, local_postgres

_PG = "/usr/lib/postgresql/*/bin/"
BINARIES = ("initdb", "postgres", "pg_basebackup", "pg_ctl", "pg_isready")
"""What a replicated Postgres is started with (found on PATH or under ``/usr/lib/postgresql``)."""


def unavailable() -> str | None:
    """Why a replicated Postgres cannot be started here (a binary missing, and how to get it), or None."""
    for name in BINARIES:
        try:
            find_binary(name, _PG + name)
        except ServerUnavailable as exc:
            return f"a failover run starts a replicated postgres itself: {exc}"
    return None


@dataclass
class PostgresReplicated(Replicated):
    """A Postgres primary and its hot standby; ``promote`` runs ``pg_ctl promote`` on the standby."""

    _standby_pid: Callable[[], int] = field(default=lambda: 0, repr=False)
    _promote: Callable[[float], None] = field(default=lambda timeout: None, repr=False)

    def _senders(self) -> list[int]:
        """The primary's walsender processes: what streams its WAL to the standby."""
        import psutil

        if self.primary.pid is None:
            return []
        found = []
        with contextlib.suppress(psutil.Error):
            for proc in psutil.Process(self.primary.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if "walsender" in " ".join(proc.cmdline()):
                        found.append(int(proc.pid))
        return found

    def standby_pids(self) -> list[int]:
        """The primary's walsenders and the standby: a stopped standby alone loses nothing, its
        kernel still takes the stream into its socket buffer."""
        return [*self._senders(), int(self._standby_pid())]

    def promote(self, timeout: float = 30.0) -> Server:
        """``pg_ctl promote`` the standby and wait until it accepts writes."""
        self._promote(timeout)
        return self.standby

    def log_files(self) -> list[Path]:
        """Both servers' ``postgres.log``."""
        return [s.datadir.parent / "postgres.log" for s in (self.primary, self.standby) if s.datadir]


def _sql(port: int, statement: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(
        f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True, connect_timeout=5
    ) as conn:
        cur = conn.execute(statement)
        return list(cur.fetchall()) if cur.description else []


@contextlib.contextmanager
def replicated_postgres(*, synchronous: bool = True) -> Iterator[PostgresReplicated]:
    """A private Postgres primary and one hot standby streaming from it (``pg_basebackup -R``).
    ``synchronous``: the primary names the standby in ``synchronous_standby_names``, so a commit
    returns only once the standby has flushed it; otherwise replication is asynchronous and a
    commit the standby has not received is lost if the primary dies. The setting lives only on
    the primary (set after the base backup), so a promoted standby does not wait for a standby
    it does not have. Removed on exit."""
    basebackup = find_binary("pg_basebackup", _PG + "pg_basebackup")
    pg_ctl = find_binary("pg_ctl", _PG + "pg_ctl")
    postgres = find_binary("postgres", _PG + "postgres")
    isready = find_binary("pg_isready", _PG + "pg_isready")
    with local_postgres() as primary, tempfile.TemporaryDirectory(prefix="wd-postgres-") as tmp:
        root = Path(tmp)
        port = free_port()
        own(root, port)
        data = root / "data"
        prefix = _postgres_user_prefix(root)
        copied = subprocess.run(
            [*prefix, basebackup, "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
             "-D", str(data), "-X", "stream", "-R", "--no-sync", "--checkpoint=fast"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if copied.returncode != 0:
            raise ServerUnavailable(f"pg_basebackup failed ({copied.returncode}): {copied.stderr.strip()}")
        conninfo = f"host=127.0.0.1 port={primary.port} user=postgres application_name=standby"
        command = [
            *prefix, postgres, "-D", str(data), "-p", str(port), "-k", str(root),
            "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200",
            "-c", "log_min_messages=warning", "-c", f"primary_conninfo={conninfo}",
        ]  # fmt: skip
        ex = executor(command, "127.0.0.1", port, root / "postgres.log", signal.SIGINT)
        ex.start()
        try:
            own(root, port, int(ex.process.pid))
            _wait_postgres_ready(isready, port)
            standby = Server(
                "postgres",
                f"postgresql://postgres@127.0.0.1:{port}/postgres",
                "127.0.0.1",
                port,
                "local",
                pid=int(ex.process.pid),
                datadir=data,
            )
            if synchronous:
                _sql(primary.port, "ALTER SYSTEM SET synchronous_standby_names = 'standby'")
                _sql(primary.port, "SELECT pg_reload_conf()")
            want = "sync" if synchronous else "async"
            for _ in deadline(30, f"the standby on port {port} streaming ({want})"):
                rows = _sql(primary.port, "SELECT state, sync_state FROM pg_stat_replication")
                if ("streaming", want) in rows:
                    break

            def promote(timeout: float) -> None:
                done = subprocess.run(
                    [*prefix, pg_ctl, "promote", "-w", "-t", str(int(timeout)), "-D", str(data)],
                    capture_output=True, text=True, check=False,
                )  # fmt: skip
                if done.returncode != 0:
                    raise ServerUnavailable(f"pg_ctl promote failed: {done.stdout}{done.stderr}")
                for _ in deadline(timeout, f"the standby on port {port} accepting writes"):
                    if _sql(port, "SELECT pg_is_in_recovery()") == [(False,)]:
                        break

            url = (
                f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{port}/postgres"
                "?target_session_attrs=read-write&connect_timeout=2"
            )
            yield PostgresReplicated(
                "postgres",
                url,
                primary,
                standby,
                synchronous,
                _standby_pid=lambda: int(ex.process.pid),
                _promote=promote,
            )
        finally:
            with contextlib.suppress(Exception):
                ex.stop()
