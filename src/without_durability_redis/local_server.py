"""Private Redis servers for tests, benchmarks and wd-chaos runs (one redis-server, or a 3-node
Redis Cluster), started from the binaries on PATH, and the recipes that find or start them.
"""

from __future__ import annotations

import contextlib
import signal
import socket
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
    executor,
    find_binary,
    free_port,
    own,
    supervised,
)


@contextlib.contextmanager
def local_redis(
    port: int | None = None,
    *,
    cluster: bool = False,
    folder: Path | None = None,
    fsync_always: bool = False,
    env: dict[str, str] | None = None,
    datadir: Path | None = None,
    appendfsync: str | None = None,
) -> Iterator[Server]:
    """A private redis-server on a free loopback port, with no persistence configured beyond the
    defaults' append-only log being off. ``cluster`` starts it with cluster mode enabled.
    ``fsync_always`` turns the append-only log on with an fsync per write, the one setting under
    which an acknowledged write survives a SIGKILL of the server (the chaos store-restart fault).
    ``appendfsync`` (``always``, ``everysec``, ``no``) turns the log on with that policy instead;
    ``datadir`` holds the log (a power-loss run's mount) instead of the server's folder."""
    binary = find_binary("redis-server")
    port = port or free_port()
    with contextlib.ExitStack() as stack:
        root = folder or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="wd-redis-")))
        root.mkdir(parents=True, exist_ok=True)
        own(root, port)
        command = [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(datadir or root),
            "--save",
            "",
            "--appendonly",
            "yes" if fsync_always or appendfsync else "no",
            *(["--appendfsync", appendfsync or "always"] if fsync_always or appendfsync else []),
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

        def start() -> Any:
            ex = executor(command, "127.0.0.1", port, root / f"redis-{port}.log", signal.SIGTERM, env)
            ex.start()
            server.pid = int(ex.process.pid)
            own(root, port, server.pid)
            return ex

        with supervised(server, start):
            yield server


CLUSTER_BUS_OFFSET = 10000
"""A cluster node also listens on its port plus this (its cluster bus), which must be free too."""


def _cluster_port(attempts: int = 50) -> int:
    """A free loopback port whose cluster-bus port is free as well: a node whose bus port is taken
    (often by another connection's ephemeral port, 32768-60999 on Linux) exits at start."""
    for _ in range(attempts):
        port = free_port()
        bus = port + CLUSTER_BUS_OFFSET
        if bus > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", bus))
            except OSError:
                continue
        return port
    raise ServerUnavailable(
        f"no free port with a free cluster-bus port (+{CLUSTER_BUS_OFFSET}) in {attempts} tries"
    )


@contextlib.contextmanager
def local_redis_cluster(masters: int = 3) -> Iterator[Server]:
    """A private Redis Cluster of ``masters`` nodes on free loopback ports (no replicas), slots
    split evenly by ``redis-cli --cluster create``. ``nodes`` lists every node's URL."""
    cli = find_binary("redis-cli")
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="wd-redis-cluster-")))
        nodes = [
            stack.enter_context(local_redis(_cluster_port(), cluster=True, folder=root))
            for _ in range(masters)
        ]
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
def redis_container() -> Iterator[Server]:
    """A Redis 7 container through testcontainers (when a Docker engine answers)."""
    try:
        from testcontainers.community.redis import RedisContainer
    except ImportError:  # testcontainers before the community split
        from testcontainers.redis import RedisContainer

    with RedisContainer("redis:7") as rd:
        host, port = rd.get_container_host_ip(), int(rd.get_exposed_port(6379))
        yield Server("redis", f"redis://{host}:{port}/0", host, port, "testcontainers")


def login_redis(url: str, timeout: float) -> None:
    """PING the server at ``url`` (after the AUTH and HELLO the URL asks for), each step held to
    about ``timeout`` seconds; the driver's error when refused (redis-py imported here)."""
    from redis import Redis

    client = Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()  # the connection sends AUTH and HELLO first when the URL asks for them
    finally:
        client.close()


_SCHEMES = (("redis", 6379), ("rediss", 6379))  # a server's and a cluster node's URLs alike

REDIS_SERVER = ServerRecipe(
    "redis",
    "WD_REDIS_URL",
    (("redis-server", ""),),
    local_redis,
    redis_container,
    schemes=_SCHEMES,
    login=login_redis,
    example="redis://host:6379/0",
)
"""Where one redis-server comes from: ``WD_REDIS_URL``, then a container, then a private instance
(``provide(REDIS_SERVER, fsync_always=True)`` asks a private one for an fsync per write)."""

REDIS_CLUSTER_SERVER = ServerRecipe(
    "redis-cluster",
    "WD_REDIS_CLUSTER_URLS",
    (("redis-server", ""), ("redis-cli", "")),
    local_redis_cluster,
    schemes=_SCHEMES,
    login=login_redis,
    example="redis://host:7000,redis://host:7001",
)
"""Where a Redis Cluster comes from: ``WD_REDIS_CLUSTER_URLS`` (every node's URL), or a private
3-node cluster (no container recipe: a cluster's nodes announce addresses a container would hide)."""
