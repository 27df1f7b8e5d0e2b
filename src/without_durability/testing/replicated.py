"""Replicated servers for failover tests, started privately from the binaries on PATH (no Docker):
a Postgres primary with one streaming standby, and a Redis primary with one replica watched by
three Sentinels.

Clients follow the primary, as a deployment's would: Postgres through a multi-host conninfo with
``target_session_attrs=read-write`` (libpq tries each host and keeps the one that accepts writes),
Redis through redis-py's ``Sentinel(...).master_for(service)`` (each new connection asks the
Sentinels where the primary is). The recipes reuse ``servers.py``'s processes, ports, owner files
and sweeping, so a killed test leaves nothing running.

A ``Replicated`` can fault its pair: ``stall_standby`` (SIGSTOP the standby, the lag a slow
network or disk gives it), ``kill_primary`` (SIGKILL the primary and its children, as a crashed
machine) and ``promote`` (Postgres: ``pg_ctl promote`` on the standby, as a failover manager
would; Redis: wait for the Sentinels to elect the replica).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from without_durability_postgres.local_server import (
    _postgres_user_prefix,
    _wait_postgres_ready,
    local_postgres,
)
from without_durability_redis.local_server import local_redis

from .servers import (
    Server,
    ServerUnavailable,
    _kill_tree,
    executor,
    find_binary,
    free_port,
    own,
    sweep_stale,
)

SERVICE = "wd"
"""The name the Sentinels monitor the Redis primary under (``master_for(SERVICE)``)."""

_PG = "/usr/lib/postgresql/*/bin/"


@dataclass
class Replicated:
    """A primary and its standby (Postgres) or replica (Redis, with ``sentinels``).

    ``url`` is what a client that follows the primary is given: the multi-host conninfo (Postgres)
    or the first Sentinel's address (Redis; every Sentinel is in ``sentinels``). ``primary`` and
    ``standby`` are the two servers as started; after ``promote`` the standby answers as the
    primary. ``synchronous`` says whether a commit waits for the standby (Postgres only; Redis
    replication is always asynchronous, ``WAIT`` aside).
    """

    kind: str
    url: str
    primary: Server
    standby: Server
    synchronous: bool
    sentinels: list[tuple[str, int]] = field(default_factory=list)
    replicas: list[Server] = field(default_factory=list)
    """Redis: every replica (``standby`` is the first until ``promote`` names the elected one)."""
    service: str = SERVICE
    source: str = "local"
    _standby_pid: Any = field(default=None, repr=False)
    _promote: Any = field(default=None, repr=False)

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

    def _standbys(self) -> list[int]:
        if self.replicas:
            return [int(r.pid) for r in self.replicas if r.pid is not None]
        return [int(self._standby_pid())]

    def _senders(self) -> list[int]:
        """The primary's walsender processes (Postgres): what streams its WAL to the standby."""
        import psutil

        if self.kind != "postgres" or self.primary.pid is None:
            return []
        found = []
        with contextlib.suppress(psutil.Error):
            for proc in psutil.Process(self.primary.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if "walsender" in " ".join(proc.cmdline()):
                        found.append(int(proc.pid))
        return found

    def stall_standby(self) -> None:
        """Hold replication back, as a slow network or a broken link would: SIGSTOP the standby
        (every replica) and cut the stream at the primary (Postgres: SIGSTOP its walsenders;
        Redis: ``CLIENT KILL TYPE replica``, and the stopped replicas cannot reconnect). A stopped
        standby alone loses nothing: its kernel still takes the stream into its socket buffer."""
        for pid in self._senders() + self._standbys():
            _signal_tree(pid, signal.SIGSTOP)
        if self.kind == "redis":
            _redis(self.primary.port).client_kill_filter(_type="replica")

    def resume_standby(self) -> None:
        """SIGCONT what ``stall_standby`` stopped."""
        for pid in self._senders() + self._standbys():
            _signal_tree(pid, signal.SIGCONT)

    def isolate_primary(self) -> None:
        """Redis: cut the primary from the Sentinels and the replicas while its clients still
        reach it (the partition Jepsen ran in 2013): the commands they need (``LINK_COMMANDS``)
        are taken from the user everyone connects as and their connections closed, so their
        pings go unanswered. The Sentinels then elect a replica, and clients holding a connection
        to the old primary keep writing to it until ``rejoin_primary``."""
        if self.kind != "redis":
            raise ServerUnavailable("isolate_primary is Redis's: a Postgres partition is not offered")
        old = _redis(self.primary.port)
        old.execute_command("ACL", "SETUSER", "default", *(f"-{c}" for c in LINK_COMMANDS))
        old.client_kill_filter(_type="replica")
        for client in old.client_list():
            if str(client.get("name", "")).startswith("sentinel-"):
                with contextlib.suppress(Exception):
                    old.client_kill_filter(_id=client["id"])

    def rejoin_primary(self) -> None:
        """Heal ``isolate_primary``: the Sentinels reach the old primary again and turn it into a
        replica of the new one, which throws away what it took while isolated."""
        with contextlib.suppress(Exception):  # a killed primary has nothing to rejoin
            _redis(self.primary.port).execute_command("ACL", "SETUSER", "default", "+@all")

    def log_files(self) -> list[Path]:
        """The servers' (and Sentinels') log files, for a post-mortem of a failover."""
        if self.kind == "postgres":
            return [s.datadir.parent / "postgres.log" for s in (self.primary, self.standby) if s.datadir]
        return sorted(self.primary.datadir.glob("*.log")) if self.primary.datadir else []

    def kill_primary(self) -> int:
        """SIGKILL the primary and every process under it; returns the pid killed."""
        import psutil

        pid = self.primary.pid
        if pid is None:
            raise ServerUnavailable(f"{self.kind} primary at {self.primary.url} has no known pid")
        with contextlib.suppress(psutil.Error):
            family = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
            # SIGKILL before any SIGCONT: a stopped walsender let run for a moment would send
            # the WAL it was holding back
            for proc in family:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        _kill_tree(pid)  # reaps what is left
        return pid

    def promote(self, timeout: float = 30.0) -> Server:
        """Make the standby the primary (Postgres) or wait until the Sentinels have elected a
        replica (Redis), and return the new primary (also ``standby`` from then on);
        ``ServerUnavailable`` if that does not happen within ``timeout`` s."""
        self._promote(timeout)
        return self.standby

    def restart(self, *, kill: bool = True) -> None:
        """Not offered: a replicated pair is faulted by ``kill_primary`` and ``promote``."""
        raise ServerUnavailable("a replicated pair is not restarted in place; use kill_primary and promote")


def _signal_tree(pid: int, sig: int) -> None:
    import psutil

    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)


def _deadline(timeout: float, what: str) -> Iterator[None]:
    """Yield until ``timeout`` s have passed, then raise ``ServerUnavailable`` naming ``what``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        yield
        time.sleep(0.05)
    raise ServerUnavailable(f"{what} did not happen within {timeout:.0f}s")


# -- Postgres -------------------------------------------------------------------------------------


def _sql(port: int, statement: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(
        f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True, connect_timeout=5
    ) as conn:
        cur = conn.execute(statement)
        return list(cur.fetchall()) if cur.description else []


@contextlib.contextmanager
def replicated_postgres(*, synchronous: bool = True) -> Iterator[Replicated]:
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
            for _ in _deadline(30, f"the standby on port {port} streaming ({want})"):
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
                for _ in _deadline(timeout, f"the standby on port {port} accepting writes"):
                    if _sql(port, "SELECT pg_is_in_recovery()") == [(False,)]:
                        break

            url = (
                f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{port}/postgres"
                "?target_session_attrs=read-write&connect_timeout=2"
            )
            yield Replicated(
                "postgres",
                url,
                primary,
                standby,
                synchronous,
                _standby_pid=lambda: ex.process.pid,
                _promote=promote,
            )
        finally:
            with contextlib.suppress(Exception):
                ex.stop()


# -- Redis ----------------------------------------------------------------------------------------


def _redis(port: int) -> Any:
    import redis

    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, decode_responses=True)


def _addr(reply: Any) -> tuple[str, int]:
    host, port = reply
    return str(host), int(port)


_SENTINEL_CONF = """\
port {port}
bind 127.0.0.1
protected-mode no
dir {dir}
sentinel monitor {service} 127.0.0.1 {master} 2
sentinel down-after-milliseconds {service} {down_ms}
sentinel failover-timeout {service} 10000
sentinel parallel-syncs {service} 1
"""

LINK_COMMANDS = ("ping", "info", "replconf", "psync", "sync", "publish", "subscribe")
"""What the Sentinels and the replicas need from a primary and its clients do not: taking these
from the default user cuts the primary from them alone (``isolate_primary``)."""


@contextlib.contextmanager
def replicated_redis(*, replicas: int = 2, down_after: float = 1.0) -> Iterator[Replicated]:
    """A private Redis primary, ``replicas`` replicas (``REPLICAOF``) and three Sentinels (quorum
    2) monitoring it as ``SERVICE``, which declare the primary down after ``down_after`` s without
    an answer and elect the replica with the most of its data. Redis replication is asynchronous:
    a write acknowledged by the primary and not yet sent to a replica is lost in a failover,
    unless the client waited for the replicas (``WAIT``). Two replicas by default, so one is still
    there to wait for once the other has been promoted. ``standby`` is the first replica; every
    replica is in ``replicas``. Removed on exit."""
    binary = find_binary("redis-sentinel")
    with contextlib.ExitStack() as stack:
        sweep_stale()
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="wd-redis-")))
        primary = stack.enter_context(local_redis(folder=root))
        copies = [stack.enter_context(local_redis(folder=root)) for _ in range(replicas)]
        for copy in copies:
            _redis(copy.port).replicaof("127.0.0.1", primary.port)
        for copy in copies:
            for _ in _deadline(30, f"the replica on port {copy.port} in sync"):
                if _redis(copy.port).info("replication").get("master_link_status") == "up":
                    break
        sentinels: list[tuple[str, int]] = []
        for _ in range(3):
            port = free_port()
            conf = root / f"sentinel-{port}.conf"
            conf.write_text(
                _SENTINEL_CONF.format(
                    port=port, dir=root, service=SERVICE, master=primary.port,
                    down_ms=int(down_after * 1000),
                )
            )  # fmt: skip
            ex = executor(
                [binary, str(conf)], "127.0.0.1", port, root / f"sentinel-{port}.log", signal.SIGTERM
            )
            ex.start()
            stack.callback(ex.stop)
            own(root, port, int(ex.process.pid))
            sentinels.append(("127.0.0.1", port))
        # a failover needs the Sentinels to know each other and the replicas (hello messages, ~2 s)
        for _ in _deadline(30, "the three Sentinels discovering each other and the replicas"):
            states = [_redis(p).sentinel_master(SERVICE) for _, p in sentinels]
            if all(int(s["num-other-sentinels"]) == 2 and int(s["num-slaves"]) == replicas for s in states):
                break
        pair = Replicated(
            "redis",
            f"redis://127.0.0.1:{sentinels[0][1]}/0",
            primary,
            copies[0],
            False,
            sentinels=sentinels,
            replicas=copies,
        )

        def promote(timeout: float) -> None:
            ports = {c.port: c for c in copies}
            for _ in _deadline(timeout, "the Sentinels electing a replica"):
                with contextlib.suppress(Exception):
                    named = {_addr(_redis(p).sentinel_get_master_addr_by_name(SERVICE)) for _, p in sentinels}
                    if len(named) == 1:
                        ((_host, port),) = named
                        if port in ports and _redis(port).info("replication").get("role") == "master":
                            pair.standby = ports[port]
                            break

        pair._promote = promote
        yield pair
