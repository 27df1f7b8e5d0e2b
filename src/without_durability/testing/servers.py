"""Real servers for tests and the chaos harness: Postgres, Redis, a Redis Cluster, toxiproxy.

A server comes from, first match wins: a URL in the environment (``WD_POSTGRES_URL``,
``WD_REDIS_URL``, ``WD_REDIS_CLUSTER_URLS``, ``WD_TOXIPROXY_URL``, for example from
``docker compose up``); testcontainers when a Docker engine answers; or a private instance started from
the binaries on PATH (``scripts/install-servers`` provides them) in a temporary folder on a free
loopback port, stopped and removed when the context exits, Ctrl-C included.

A private server's folder carries an owner file (``wd-owner-PORT.json``: the pid that started it and
the server's own pid). A process killed with SIGKILL cannot remove its servers; ``sweep_stale`` finds
the folders whose owner is gone, kills their servers and removes them (``provide`` calls it before
starting a private server, as do ``wd-chaos clean`` and every ``wd-chaos run``, and a run's lifeline
when its controller dies).

Process management is mirakuru's (process groups, start checks, stop-then-kill) and free ports come
from port-for; both are well-kept libraries used by pytest-postgresql and pytest-redis. Postgres keeps
its shipped durability settings: fsync and synchronous_commit stay on.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INSTALL_HINT = "run scripts/install-servers (Debian: apt-get install postgresql redis-server; toxiproxy-server is built from its Go module)"


class ServerUnavailable(RuntimeError):
    """A server could not be found, reached or started; the message says where it looked and what
    to do."""


@dataclass
class Server:
    """A running server: where to reach it and, for a private instance, how to fault it.

    ``pid`` is the server's own process (the postmaster, redis-server) for SIGSTOP/SIGKILL faults;
    ``restart`` stops it abruptly and starts it again on the same port and data. Both are None for a
    server this process did not start.
    """

    kind: str
    url: str
    host: str
    port: int
    source: str
    pid: int | None = None
    datadir: Path | None = None
    _restart: Any = field(default=None, repr=False)
    nodes: list[str] = field(default_factory=list)

    def restart(self, *, kill: bool = True) -> None:
        """Stop the server (SIGKILL when ``kill``, else a clean stop) and start it again on the same
        port and data folder. Only for private instances."""
        if self._restart is None:
            raise ServerUnavailable(
                f"{self.kind} at {self.url} came from {self.source}; only a private instance can be restarted"
            )
        self._restart(kill)


def find_binary(name: str, *extra_globs: str) -> str:
    """The path of ``name`` on PATH or in the given globs (Debian keeps Postgres in
    /usr/lib/postgresql/N/bin), or ``ServerUnavailable`` saying how to get it."""
    found = shutil.which(name)
    if found:
        return found
    for pattern in extra_globs:
        hits = sorted(glob.glob(pattern), reverse=True)
        if hits:
            return hits[0]
    raise ServerUnavailable(f"{name} was not found on PATH: {INSTALL_HINT}")


def free_port() -> int:
    """A free loopback TCP port."""
    import port_for

    return int(port_for.select_random())


def wait_for_port(host: str, port: int, timeout: float = 30.0) -> None:
    """Wait until something accepts TCP connections at host:port, or raise ``ServerUnavailable``."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        if time.monotonic() > deadline:
            raise ServerUnavailable(f"nothing answered on {host}:{port} within {timeout:.0f}s")
        time.sleep(0.05)


STALE_PREFIXES = ("wd-postgres-", "wd-redis-", "wd-redis-cluster-", "wd-toxiproxy-")
"""The temporary folders a private server lives in (``tempfile.gettempdir()``)."""


def _started(pid: int) -> float | None:
    """When ``pid`` started (to tell it from a later process given the same pid), or None if gone."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _own(folder: Path, port: int, server_pid: int | None = None) -> None:
    """Record who started the server on ``port`` in ``folder``, so a sweep can tell when it is stale."""
    me = os.getpid()
    record = {"owner": me, "owner_started": _started(me), "port": port, "server": server_pid}
    if server_pid is not None:
        record["server_started"] = _started(server_pid)
    path = folder / f"wd-owner-{port}.json"
    path.write_text(json.dumps(record))


def _alive(pid: object, started: object) -> bool:
    return isinstance(pid, int) and started is not None and _started(pid) == started


def _kill_tree(pid: int) -> None:
    """SIGKILL a server and its process group (a postmaster's backends); SIGCONT first, since a
    stopped process must run again to be reaped by its new parent."""
    import psutil

    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
        for proc in family:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        psutil.wait_procs(family, timeout=10)


def sweep_stale(dead_owner: int | None = None, folder: Path | None = None) -> list[Path]:
    """Kill the private servers whose owner process is gone (or is ``dead_owner``) and remove
    their folders; returns the folders removed. A folder without an owner file is left alone
    (an older version's, or not ours)."""
    base = folder or Path(tempfile.gettempdir())
    removed: list[Path] = []
    for path in sorted(base.iterdir()):
        if not path.is_dir() or not path.name.startswith(STALE_PREFIXES):
            continue
        records = []
        for owner_file in path.glob("wd-owner-*.json"):
            with contextlib.suppress(OSError, ValueError):
                records.append(json.loads(owner_file.read_text()))
        if not records:
            continue
        owners = {(r.get("owner"), r.get("owner_started")) for r in records}
        if any(pid != dead_owner and _alive(pid, started) for pid, started in owners):
            continue
        for record in records:
            server = record.get("server")
            if isinstance(server, int) and _alive(server, record.get("server_started")):
                _kill_tree(server)
        postmaster = path / "data" / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            _kill_tree(int(postmaster.read_text().split()[0]))
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _as_user(user: str) -> list[str]:
    """Postgres refuses to run as root: run it as ``user`` through setpriv (which execs, so the
    process we start is the server itself)."""
    entry = pwd.getpwnam(user)
    return ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--"]


def _postgres_user_prefix(folder: Path) -> list[str]:
    if os.geteuid() != 0:
        return []
    try:
        entry = pwd.getpwnam("postgres")
    except KeyError as exc:
        raise ServerUnavailable(
            "running as root, and Postgres refuses root: create a 'postgres' user "
            "(the Debian package does) or run as an ordinary user"
        ) from exc
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return _as_user("postgres")


def _executor(
    command: list[str], host: str, port: int, log: Path, stop_signal: int, env: dict[str, str] | None = None
) -> Any:
    from mirakuru import TCPExecutor

    out = open(log, "ab")  # noqa: SIM115 - the server writes here for its whole life
    return TCPExecutor(
        command,
        host=host,
        port=port,
        timeout=60,
        stop_signal=stop_signal,
        envvars=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )


@contextlib.contextmanager
def local_postgres(port: int | None = None, *, env: dict[str, str] | None = None) -> Iterator[Server]:
    """A private PostgreSQL: initdb into a temporary folder, listen on a free loopback port, trust
    auth for the ``postgres`` role, shipped durability settings. Removed on exit. ``env`` is added
    to the server's environment (and so every backend's): a preloaded fake clock, for one."""
    pg = "/usr/lib/postgresql/*/bin/"
    initdb = find_binary("initdb", pg + "initdb")
    postgres = find_binary("postgres", pg + "postgres")
    isready = find_binary("pg_isready", pg + "pg_isready")
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="wd-postgres-") as tmp:
        root = Path(tmp)
        _own(root, port)
        data = root / "data"
        prefix = _postgres_user_prefix(root)
        init = subprocess.run(
            [
                *prefix,
                initdb,
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--locale=C",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if init.returncode != 0:
            raise ServerUnavailable(f"initdb failed ({init.returncode}): {init.stderr.strip()}")
        # the environment is set after the switch to the postgres user: a preloaded library that
        # makes shared state at start (libfaketime) must make it as the user the server runs as
        given = ["env", *(f"{k}={v}" for k, v in env.items())] if env else []
        command = [
            *prefix,
            *given,
            postgres,
            "-D",
            str(data),
            "-p",
            str(port),
            "-k",
            str(root),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "max_connections=200",
            "-c",
            "log_min_messages=warning",
        ]
        server = Server(
            "postgres",
            f"postgresql://postgres@127.0.0.1:{port}/postgres",
            "127.0.0.1",
            port,
            "local",
            datadir=data,
        )
        state: dict[str, Any] = {}

        def start() -> None:
            ex = _executor(command, "127.0.0.1", port, root / "postgres.log", signal.SIGINT)
            ex.start()
            state["ex"] = ex
            _own(root, port, int(ex.process.pid))
            _wait_postgres_ready(isready, port)
            server.pid = _postmaster_pid(data, ex)

        def restart(kill: bool) -> None:
            ex = state["ex"]
            if kill:
                ex.kill(wait=True)
            else:
                ex.stop()
            start()

        server._restart = restart
        start()
        try:
            yield server
        finally:
            with contextlib.suppress(Exception):
                state["ex"].stop()


def _wait_postgres_ready(isready: str, port: int, timeout: float = 60.0) -> None:
    """An open port is not a ready server (crash recovery answers 'starting up'): ask pg_isready."""
    deadline = time.monotonic() + timeout
    while (
        subprocess.run(
            [isready, "-q", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres"], check=False
        ).returncode
        != 0
    ):
        if time.monotonic() > deadline:
            raise ServerUnavailable(f"postgres on port {port} was not ready within {timeout:.0f}s")
        time.sleep(0.05)


def _postmaster_pid(data: Path, ex: Any) -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((data / "postmaster.pid").read_text().split()[0])
    return int(ex.process.pid)


@contextlib.contextmanager
def local_redis(
    port: int | None = None,
    *,
    cluster: bool = False,
    folder: Path | None = None,
    fsync_always: bool = False,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """A private redis-server on a free loopback port, with no persistence configured beyond the
    defaults' append-only log being off. ``cluster`` starts it with cluster mode enabled.
    ``fsync_always`` turns the append-only log on with an fsync per write, the one setting under
    which an acknowledged write survives a SIGKILL of the server (the chaos store-restart fault).
    ``env`` is added to the server's environment."""
    binary = find_binary("redis-server")
    port = port or free_port()
    with contextlib.ExitStack() as stack:
        root = folder or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="wd-redis-")))
        root.mkdir(parents=True, exist_ok=True)
        _own(root, port)
        command = [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(root),
            "--save",
            "",
            "--appendonly",
            "yes" if fsync_always else "no",
            *(["--appendfsync", "always"] if fsync_always else []),
            "--protected-mode",
            "no",
        ]
        if cluster:
            command += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                f"nodes-{port}.conf",
                "--cluster-node-timeout",
                "5000",
            ]
        server = Server("redis", f"redis://127.0.0.1:{port}/0", "127.0.0.1", port, "local", datadir=root)
        state: dict[str, Any] = {}

        def start() -> None:
            ex = _executor(command, "127.0.0.1", port, root / f"redis-{port}.log", signal.SIGTERM, env)
            ex.start()
            state["ex"] = ex
            server.pid = int(ex.process.pid)
            _own(root, port, server.pid)

        def restart(kill: bool) -> None:
            ex = state["ex"]
            if kill:
                ex.kill(wait=True)
            else:
                ex.stop()
            start()

        server._restart = restart
        start()
        try:
            yield server
        finally:
            with contextlib.suppress(Exception):
                state["ex"].stop()


@contextlib.contextmanager
def local_redis_cluster(masters: int = 3) -> Iterator[Server]:
    """A private Redis Cluster of ``masters`` nodes on free loopback ports (no replicas), slots
    split evenly by ``redis-cli --cluster create``. ``nodes`` lists every node's URL."""
    cli = find_binary("redis-cli")
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="wd-redis-cluster-")))
        nodes = [stack.enter_context(local_redis(cluster=True, folder=root)) for _ in range(masters)]
        made = subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *[f"127.0.0.1:{n.port}" for n in nodes],
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            raise ServerUnavailable(f"redis-cli --cluster create failed: {made.stdout}{made.stderr}")
        _wait_cluster_ok(cli, nodes)
        first = nodes[0]
        yield Server(
            "redis-cluster", first.url, first.host, first.port, "local", nodes=[n.url for n in nodes]
        )


def _wait_cluster_ok(cli: str, nodes: list[Server], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        states = [
            subprocess.run(
                [cli, "-p", str(n.port), "cluster", "info"], capture_output=True, text=True, check=False
            ).stdout
            for n in nodes
        ]
        if all("cluster_state:ok" in s for s in states):
            return
        if time.monotonic() > deadline:
            raise ServerUnavailable(f"redis cluster did not reach cluster_state:ok: {states}")
        time.sleep(0.1)


@contextlib.contextmanager
def local_toxiproxy(port: int | None = None) -> Iterator[Server]:
    """A private toxiproxy-server on a free loopback port; ``url`` is its HTTP API."""
    binary = find_binary("toxiproxy-server")
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="wd-toxiproxy-") as tmp:
        _own(Path(tmp), port)
        ex = _executor(
            [binary, "-host", "127.0.0.1", "-port", str(port)],
            "127.0.0.1",
            port,
            Path(tmp) / "toxiproxy.log",
            signal.SIGTERM,
        )
        ex.start()
        _own(Path(tmp), port, int(ex.process.pid))
        try:
            yield Server(
                "toxiproxy", f"http://127.0.0.1:{port}", "127.0.0.1", port, "local", pid=int(ex.process.pid)
            )
        finally:
            with contextlib.suppress(Exception):
                ex.stop()


# -- provisioning: environment, then Docker, then local binaries -----------------------------

_ENV = {
    "postgres": "WD_POSTGRES_URL",
    "redis": "WD_REDIS_URL",
    "redis-cluster": "WD_REDIS_CLUSTER_URLS",
    "toxiproxy": "WD_TOXIPROXY_URL",
}
_LOCAL: dict[str, Callable[..., contextlib.AbstractContextManager[Server]]] = {
    "postgres": local_postgres,
    "redis": local_redis,
    "redis-cluster": local_redis_cluster,
    "toxiproxy": local_toxiproxy,
}
_BINARIES = {
    "postgres": [
        ("initdb", "/usr/lib/postgresql/*/bin/initdb"),
        ("postgres", "/usr/lib/postgresql/*/bin/postgres"),
    ],
    "redis": [("redis-server", "")],
    "redis-cluster": [("redis-server", ""), ("redis-cli", "")],
    "toxiproxy": [("toxiproxy-server", "")],
}


def _from_env(kind: str) -> Server | None:
    value = os.environ.get(_ENV[kind])
    if not value:
        return None
    urls = [u.strip() for u in value.split(",") if u.strip()]
    from urllib.parse import urlsplit

    parts = urlsplit(urls[0])
    return Server(kind, urls[0], parts.hostname or "127.0.0.1", parts.port or 0, "env", nodes=urls)


def _docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@contextlib.contextmanager
def _from_testcontainers(kind: str) -> Iterator[Server]:
    if kind == "postgres":
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16", driver=None) as pg:
            url = pg.get_connection_url()
            yield Server(
                kind, url, pg.get_container_host_ip(), int(pg.get_exposed_port(5432)), "testcontainers"
            )
    elif kind == "redis":
        from testcontainers.redis import RedisContainer

        with RedisContainer("redis:7") as rd:
            host, port = rd.get_container_host_ip(), int(rd.get_exposed_port(6379))
            yield Server(kind, f"redis://{host}:{port}/0", host, port, "testcontainers")
    elif kind == "toxiproxy":
        from testcontainers.core.container import DockerContainer

        with DockerContainer("ghcr.io/shopify/toxiproxy:2.12.0").with_exposed_ports(8474) as tp:
            host, port = tp.get_container_host_ip(), int(tp.get_exposed_port(8474))
            yield Server(kind, f"http://{host}:{port}", host, port, "testcontainers")
    else:
        raise ServerUnavailable(f"no container recipe for {kind}")


def why_unavailable(kind: str) -> str | None:
    """None if a ``kind`` server can be had (a URL is set, Docker answers, or the binaries are on
    PATH); otherwise why not, with what to do. Does not start anything."""
    if os.environ.get(_ENV[kind]):
        return None
    missing = []
    for name, pattern in _BINARIES[kind]:
        try:
            find_binary(name, *([pattern] if pattern else []))
        except ServerUnavailable:
            missing.append(name)
    if not missing:
        return None
    if kind != "redis-cluster" and _docker_answers():
        return None
    return (
        f"{kind}: {', '.join(missing)} not on PATH, {_ENV[kind]} not set, and no Docker "
        f"engine answers; {INSTALL_HINT}, or set {_ENV[kind]}"
    )


@contextlib.contextmanager
def provide(
    kind: str, *, redis_fsync_always: bool = False, env: dict[str, str] | None = None
) -> Iterator[Server]:
    """A ``kind`` server (postgres, redis, redis-cluster, toxiproxy): from the environment, from
    testcontainers, or a private local instance, in that order. Raises ``ServerUnavailable`` with
    what to do when none can be had. ``redis_fsync_always`` asks a private Redis for an
    append-only log fsynced on every write (see ``local_redis``). ``env`` is added to a private
    postgres or redis server's environment; a server from elsewhere cannot take it, so with
    ``env`` only a private instance is started (``ServerUnavailable`` if it cannot be)."""
    if kind not in _ENV:
        raise ValueError(f"unknown server kind {kind!r}; expected one of {sorted(_ENV)}")
    if env is not None and kind not in ("postgres", "redis"):
        raise ValueError(f"env is for a private postgres or redis server, not {kind}")
    given = _from_env(kind) if env is None else None
    if given is not None:
        yield given
        return
    reason = why_unavailable(kind)
    local_ok = all(_binary_ok(n, p) for n, p in _BINARIES[kind])
    if env is not None and not local_ok:
        raise ServerUnavailable(
            f"{kind}: this run changes the server's environment, so it starts a private {kind} "
            f"from binaries on PATH, and they are missing: {INSTALL_HINT}"
        )
    if not local_ok and reason is None and kind != "redis-cluster":
        with _from_testcontainers(kind) as server:
            yield server
        return
    if reason is not None:
        raise ServerUnavailable(reason)
    options: dict[str, Any] = {"fsync_always": True} if kind == "redis" and redis_fsync_always else {}
    if env is not None:
        options["env"] = env
    sweep_stale()  # what a killed test session or run left: servers whose owner is gone
    with _LOCAL[kind](**options) as server:
        yield server


def _binary_ok(name: str, pattern: str) -> bool:
    try:
        find_binary(name, *([pattern] if pattern else []))
        return True
    except ServerUnavailable:
        return False
