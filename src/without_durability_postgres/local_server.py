"""A private PostgreSQL for tests, benchmarks and wd-chaos runs, started from the binaries on PATH
(or Debian's /usr/lib/postgresql/N/bin), and the recipe that finds or starts one. Postgres keeps its
shipped durability settings here: fsync and synchronous_commit stay on.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from without_durability.testing.servers import (
    Server,
    ServerRecipe,
    ServerUnavailable,
    as_user,
    executor,
    find_binary,
    free_port,
    own,
    supervised,
)

SERVER_USER = "postgres"
"""The user a private Postgres runs as when started by root (Postgres refuses root)."""


def _postgres_user_prefix(folder: Path) -> list[str]:
    """Postgres refuses to run as root: as root, hand ``folder`` to the ``postgres`` user and run as it."""
    if os.geteuid() != 0:
        return []
    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError as exc:
        raise ServerUnavailable(
            "running as root, and Postgres refuses root: create a 'postgres' user "
            "(the Debian package does) or run as an ordinary user"
        ) from exc
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return as_user(SERVER_USER)


@contextlib.contextmanager
def local_postgres(
    port: int | None = None,
    *,
    env: dict[str, str] | None = None,
    datadir: Path | None = None,
    relaxed: bool = False,
) -> Iterator[Server]:
    """A private PostgreSQL: initdb into a temporary folder, listen on a free loopback port, trust
    auth for the ``postgres`` role, shipped durability settings. Removed on exit. ``env`` is added
    to the server's environment (and so every backend's): a preloaded fake clock, for one.
    ``datadir`` (an empty folder, a power-loss run's mount) holds the data directory instead of
    the temporary folder (its socket and log stay there); ``relaxed`` sets
    ``synchronous_commit=off``: a commit is acknowledged before its WAL is flushed."""
    pg = "/usr/lib/postgresql/*/bin/"
    initdb = find_binary("initdb", pg + "initdb")
    postgres = find_binary("postgres", pg + "postgres")
    isready = find_binary("pg_isready", pg + "pg_isready")
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="wd-postgres-") as tmp:
        root = Path(tmp)
        own(root, port)
        data = root / "data" if datadir is None else datadir / "data"
        prefix = _postgres_user_prefix(root)
        if datadir is not None and prefix:  # initdb, as the postgres user, creates data in it
            entry = pwd.getpwnam(SERVER_USER)
            os.chown(datadir, entry.pw_uid, entry.pw_gid)
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
            *(["-c", "synchronous_commit=off"] if relaxed else []),
        ]
        server = Server(
            "postgres",
            f"postgresql://postgres@127.0.0.1:{port}/postgres",
            "127.0.0.1",
            port,
            "local",
            datadir=data,
        )
        def start() -> Any:
            ex = executor(command, "127.0.0.1", port, root / "postgres.log", signal.SIGINT)
            ex.start()
            own(root, port, int(ex.process.pid))
            _wait_postgres_ready(isready, port)
            server.pid = _postmaster_pid(data, ex)
            return ex

        with supervised(server, start):
            yield server


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
def postgres_container() -> Iterator[Server]:
    """A Postgres 16 container through testcontainers (when a Docker engine answers)."""
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:  # testcontainers before the community split
        from testcontainers.postgres import PostgresContainer

    with PostgresContainer("postgres:16", driver=None) as pg:
        url = pg.get_connection_url()
        yield Server(
            "postgres", url, pg.get_container_host_ip(), int(pg.get_exposed_port(5432)), "testcontainers"
        )


def login_postgres(url: str, timeout: float) -> None:
    """Authenticate at ``url`` and run ``SELECT 1``, the connect, the handshake and the query each
    held to about ``timeout`` seconds; the driver's error when refused (psycopg imported here)."""
    import psycopg

    # connect_timeout bounds the connect and the startup handshake; statement_timeout the query
    with psycopg.connect(url, connect_timeout=max(1, round(timeout)), autocommit=True) as conn:
        conn.execute(f"SET statement_timeout = {int(timeout * 1000)}")
        conn.execute("SELECT 1").fetchone()


POSTGRES_SERVER = ServerRecipe(
    "postgres",
    "WD_POSTGRES_URL",
    (("initdb", "/usr/lib/postgresql/*/bin/initdb"), ("postgres", "/usr/lib/postgresql/*/bin/postgres")),
    local_postgres,
    postgres_container,
    run_as=SERVER_USER,
    schemes=(("postgresql", 5432), ("postgres", 5432)),
    login=login_postgres,
    example="postgresql://user@host:5432/postgres",
)
"""Where a Postgres comes from: ``WD_POSTGRES_URL``, then a container, then a private instance."""
