"""Where a run's store server (and toxiproxy) come from: the store's kit holds its server recipe
(``without_durability.testing.kit``; environment URL, then testcontainers when Docker answers, then a
private instance from binaries on PATH, removed at exit, Ctrl-C included) and turns a server into the
store spec worker processes open; this module puts toxiproxy between workers and store.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from without_durability.testing.kit import KitError, StoreKit, find_kit
from without_durability.testing.replicated import Replicated
from without_durability.testing.servers import (
    Server,
    ServerUnavailable,
    provide,
    sweep_stale,
    why_unavailable,
)

from .faults import clock_step as stepped_clock
from .stores import WALL_OFFSET, Spec
from .toxiproxy_server import TOXIPROXY_SERVER

__all__ = ["Services", "ServerUnavailable", "services", "sweep_stale"]


@dataclass
class Services:
    """What a run has: the store spec, the server (None for SQLite; a failover run's replicated
    deployment), toxiproxy and the per-worker
    URLs through it (empty without partitions)."""

    spec: Spec
    server: Server | Replicated | None = None
    toxi: Any = None
    worker_urls: dict[str, str] = field(default_factory=dict)
    proxies: dict[str, str] = field(default_factory=dict)
    careless_spec: Spec | None = None
    """A store of the careless clients' own on the same server (``wd_chaos.clients``): a schema, a
    key prefix, a file. Their sweeps with a cutoff of a tenth of a second would otherwise sweep the
    workers' finished workflows before the final read."""


def _swap_netloc(url: str, hostport: str) -> str:
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{hostport}" if userinfo else hostport
    return urlunsplit(parts._replace(netloc=netloc))


def _replicated(
    stack: contextlib.ExitStack, kit: StoreKit, event: dict[str, Any], run_dir: Path, tag: str
) -> tuple[Replicated, Spec]:
    """A private replicated deployment of ``kit`` for a failover run, and the spec that follows
    its primary (with the event's ``wait_replicas``, for stores that can wait for replicas)."""
    pair = stack.enter_context(kit.replicated(synchronous=event.get("replication") != "async"))

    def keep_logs() -> None:  # the servers' own account of the failover, kept with the run
        (run_dir / "servers").mkdir(exist_ok=True)
        for log in pair.log_files():
            with contextlib.suppress(OSError):
                shutil.copy(log, run_dir / "servers" / f"{log.parent.name}-{log.name}")

    stack.callback(keep_logs)
    spec: Spec = {"store": kit.name, **kit.worker_spec(pair, run_dir, tag)}
    if event.get("wait_replicas"):
        spec["wait_replicas"] = int(event["wait_replicas"])
    return pair, spec


def check_available(
    store: str,
    partition: bool = False,
    failover: object = None,
    clock_step: bool = False,
    restart: bool = False,
) -> str | None:
    """Why this run cannot have its servers (one message saying how to get them), or None. A
    failover run starts its replicated store privately (the kit's ``replicated``), so it asks the
    kit what that needs; a clock-step run starts the kit's server program on a stepped clock."""
    try:
        kit = find_kit(store)
        reason = kit.unavailable()
    except KitError as exc:
        return str(exc)
    if reason:
        return reason
    if clock_step and kit.server_binary is not None:
        reason = stepped_clock.why_unavailable(kit.server_binary)
        if reason:
            return reason
    if partition:
        reason = why_unavailable(TOXIPROXY_SERVER)
        if reason:
            return reason
    if failover:
        return kit.replication_unavailable()
    return None


@contextlib.contextmanager
def services(
    store: str,
    run_dir: Path,
    workers: list[str],
    *,
    partition: bool = False,
    restart: bool = False,
    mutant: str | None = None,
    failover: dict[str, Any] | None = None,
    clock_step: bool = False,
    careless: bool = False,
) -> Iterator[Services]:
    """Provide the servers a run needs and yield its ``Services``. With ``failover`` (the run's
    failover event) the store is a replicated pair (``faults/failover.py``) that clients reach through
    a client following the primary. With ``clock_step`` the kit's server runs on a clock the
    nemesis steps (``faults.clock_step.server_env``), so it is a private one. With ``careless``
    the careless clients get a store of their own on the same server (``careless_spec``)."""
    tag = f"chaos_{secrets.token_hex(4)}"
    with contextlib.ExitStack() as stack:
        kit = find_kit(store)
        server: Server | Replicated | None
        if failover is not None:
            server, spec = _replicated(stack, kit, failover, run_dir, tag)
        else:
            env = None
            if clock_step and kit.server_binary is not None:
                env = stepped_clock.server_env(kit.server_binary, run_dir / stepped_clock.CLOCK_FILE)
            server = stack.enter_context(kit.server(restartable=restart, env=env))
            if restart and (server is None or server.source != "local"):
                where = "no server" if server is None else f"{server.source} ({server.url}): unset its URL variable"
                raise ServerUnavailable(
                    f"a store restart needs a private {kit.name} server this run starts itself; it has {where}"
                )
            spec = {"store": kit.name, **kit.worker_spec(server, run_dir, tag)}
        spec["namespace"] = "chaos"
        spec.setdefault("wall_offset", str(run_dir / WALL_OFFSET))  # what a wall-step fault moves
        if mutant:
            spec["mutant"] = mutant
        found = Services(spec, server)
        if careless and failover is None:
            folder = run_dir / "careless"
            folder.mkdir(exist_ok=True)
            found.careless_spec = {
                **spec,
                **kit.worker_spec(server, folder, f"{tag}_careless"),
                "wall_offset": str(run_dir / WALL_OFFSET),
            }
        if partition:
            if server is None or "proxy" not in kit.provides:
                raise ServerUnavailable(
                    f"a partition needs a store reached at one network address; {kit.name} is not "
                    "(choose a store whose kit provides 'proxy')"
                )
            from .toxi import Toxi

            proxy_server = stack.enter_context(provide(TOXIPROXY_SERVER))
            toxi = Toxi(proxy_server.url)
            stack.callback(toxi.remove_all)
            found.toxi = toxi
            for name in workers:
                proxy = f"{tag}-{name}"
                listen = toxi.proxy(proxy, f"{server.host}:{server.port}")
                found.proxies[name] = proxy
                found.worker_urls[name] = _swap_netloc(server.url, listen)
        yield found
