"""A private Redis primary with replicas watched by three Sentinels, for failover runs (the kits'
``replicated``): started from the binaries on PATH, reached through redis-py's
``Sentinel(...).master_for(SERVICE)`` (each new connection asks the Sentinels where the primary
is), the new primary elected by the Sentinels themselves."""

from __future__ import annotations

import contextlib
import signal
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
    sweep_stale,
)

from .local_server import local_redis

SERVICE = "wd"
"""The name the Sentinels monitor the Redis primary under (``master_for(SERVICE)``)."""

BINARIES = ("redis-server", "redis-sentinel")
"""What a replicated Redis is started with."""

LINK_COMMANDS = ("ping", "info", "replconf", "psync", "sync", "publish", "subscribe")
"""What the Sentinels and the replicas need from a primary and its clients do not: taking these
from the default user cuts the primary from them alone (``isolate_primary``)."""


def unavailable() -> str | None:
    """Why a replicated Redis cannot be started here (a binary missing, and how to get it), or None."""
    for name in BINARIES:
        try:
            find_binary(name)
        except ServerUnavailable as exc:
            return f"a failover run starts a replicated redis itself: {exc}"
    return None


def _redis(port: int) -> Any:
    import redis

    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, decode_responses=True)


def _addr(reply: Any) -> tuple[str, int]:
    host, port = reply
    return str(host), int(port)


@dataclass
class RedisReplicated(Replicated):
    """A Redis primary, its replicas (``standby`` is the first until ``promote`` names the elected
    one) and the Sentinels (``sentinels``) that monitor it as ``service``. Replication is
    asynchronous: a write is on a replica before its acknowledgement only if the client ``WAIT``ed."""

    sentinels: list[tuple[str, int]] = field(default_factory=list)
    replicas: list[Server] = field(default_factory=list)
    service: str = SERVICE
    _promote: Callable[[float], None] = field(default=lambda timeout: None, repr=False)

    elects_itself = True
    offers_partition = True

    def standby_pids(self) -> list[int]:
        """Every replica."""
        return [int(r.pid) for r in self.replicas if r.pid is not None]

    def stall_standby(self) -> None:
        """SIGSTOP every replica and close their connections at the primary
        (``CLIENT KILL TYPE replica``): the stopped replicas cannot reconnect."""
        super().stall_standby()
        _redis(self.primary.port).client_kill_filter(_type="replica")

    def promote(self, timeout: float = 30.0) -> Server:
        """Wait until the Sentinels agree on an elected replica that answers as the primary."""
        self._promote(timeout)
        return self.standby

    def isolate_primary(self) -> None:
        """Cut the primary from the Sentinels and the replicas while its clients still reach it
        (the partition Jepsen ran in 2013): the commands they need (``LINK_COMMANDS``) are taken
        from the user everyone connects as and their connections closed, so their pings go
        unanswered. The Sentinels then elect a replica, and clients holding a connection to the
        old primary keep writing to it until ``rejoin_primary``."""
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
        """The servers' and the Sentinels' log files."""
        return sorted(self.primary.datadir.glob("*.log")) if self.primary.datadir else []


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


@contextlib.contextmanager
def replicated_redis(*, replicas: int = 2, down_after: float = 1.0) -> Iterator[RedisReplicated]:
    """A private Redis primary, ``replicas`` replicas (``REPLICAOF``) and three Sentinels (quorum
    2) monitoring it as ``SERVICE``, which declare the primary down after ``down_after`` s without
    an answer and elect the replica with the most of its data. A write acknowledged by the primary
    and not yet sent to a replica is lost in a failover, unless the client waited for the replicas
    (``WAIT``). Two replicas by default, so one is still there to wait for once the other has been
    promoted. Removed on exit."""
    binary = find_binary("redis-sentinel")
    with contextlib.ExitStack() as stack:
        sweep_stale()
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="wd-redis-")))
        primary = stack.enter_context(local_redis(folder=root))
        copies = [stack.enter_context(local_redis(folder=root)) for _ in range(replicas)]
        for copy in copies:
            _redis(copy.port).replicaof("127.0.0.1", primary.port)
        for copy in copies:
            for _ in deadline(30, f"the replica on port {copy.port} in sync"):
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
        for _ in deadline(30, "the three Sentinels discovering each other and the replicas"):
            states = [_redis(p).sentinel_master(SERVICE) for _, p in sentinels]
            if all(int(s["num-other-sentinels"]) == 2 and int(s["num-slaves"]) == replicas for s in states):
                break
        pair = RedisReplicated(
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
            for _ in deadline(timeout, "the Sentinels electing a replica"):
                with contextlib.suppress(Exception):
                    named = {_addr(_redis(p).sentinel_get_master_addr_by_name(SERVICE)) for _, p in sentinels}
                    if len(named) == 1:
                        ((_host, port),) = named
                        if port in ports and _redis(port).info("replication").get("role") == "master":
                            pair.standby = ports[port]
                            break

        pair._promote = promote
        yield pair
