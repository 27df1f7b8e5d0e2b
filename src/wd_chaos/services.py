"""Where a run's store server (and toxiproxy) come from: ``without_durability.testing.servers``
does the finding and starting (environment URL, then testcontainers when Docker answers, then a
private instance from binaries on PATH, removed at exit, Ctrl-C included); this module turns a
server into the store spec worker processes open, and puts toxiproxy between workers and store.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from without_durability.testing.servers import (
    Server,
    ServerUnavailable,
    provide,
    sweep_stale,
    why_unavailable,
)

from . import clockstep
from .stores import WALL_OFFSET, Spec

__all__ = ["Services", "ServerUnavailable", "services", "sweep_stale"]


@dataclass
class Services:
    """What a run has: the store spec, the server (None for SQLite), toxiproxy and the per-worker
    URLs through it (empty without partitions)."""

    spec: Spec
    server: Server | None = None
    toxi: Any = None
    worker_urls: dict[str, str] = field(default_factory=dict)
    proxies: dict[str, str] = field(default_factory=dict)


def _swap_netloc(url: str, hostport: str) -> str:
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{hostport}" if userinfo else hostport
    return urlunsplit(parts._replace(netloc=netloc))


def check_available(store: str, partition: bool, clock_step: bool = False) -> str | None:
    """Why this run cannot have its servers (one message saying how to get them), or None."""
    if clock_step and store != "sqlite" and (reason := clockstep.why_unavailable(store)):
        return reason
    kinds = ([] if store == "sqlite" else [store]) + (["toxiproxy"] if partition else [])
    for kind in kinds:
        reason = why_unavailable(kind)
        if reason:
            return reason
    return None


@contextlib.contextmanager
def services(
    store: str,
    run_dir: Path,
    workers: list[str],
    *,
    partition: bool,
    restart: bool = False,
    checkpointer_class: str | None = None,
    mutant: str | None = None,
    clock_step: bool = False,
) -> Iterator[Services]:
    """Provide the servers a run needs and yield its ``Services``. With ``clock_step`` a server
    runs on a clock the nemesis steps (``clockstep.server_env``), so it is a private one."""
    tag = f"chaos_{secrets.token_hex(4)}"
    with contextlib.ExitStack() as stack:
        if store == "sqlite":
            spec: Spec = {"kind": "sqlite", "path": str(run_dir / "store.db")}
            spec["wall_offset"] = str(run_dir / WALL_OFFSET)  # what a wall-step fault moves
            server = None
        elif store in ("postgres", "redis"):
            # a restarted Redis keeps acknowledged writes only with an fsync per write
            env = clockstep.server_env(store, run_dir / clockstep.CLOCK_FILE) if clock_step else None
            server = stack.enter_context(provide(store, redis_fsync_always=restart, env=env))
            if restart and server.source != "local":
                raise ServerUnavailable(
                    f"a store restart needs a private {store} this run starts itself; "
                    f"{store} came from {server.source} ({server.url}): unset its URL variable"
                )
            spec = {"kind": store, "url": server.url, "schema": tag, "prefix": f"{tag}:"}
        else:
            raise ValueError(f"unknown store {store!r}; expected sqlite, postgres or redis")
        spec["namespace"] = "chaos"
        if checkpointer_class:
            spec["checkpointer_class"] = checkpointer_class
        if mutant:
            spec["mutant"] = mutant
        found = Services(spec, server)
        if partition:
            if server is None:
                raise ServerUnavailable(
                    "a partition needs a store reached over the network; "
                    "SQLite is a file (use --store postgres or redis)"
                )
            from .toxi import Toxi

            proxy_server = stack.enter_context(provide("toxiproxy"))
            toxi = Toxi(proxy_server.url)
            stack.callback(toxi.remove_all)
            found.toxi = toxi
            for name in workers:
                proxy = f"{tag}-{name}"
                listen = toxi.proxy(proxy, f"{server.host}:{server.port}")
                found.proxies[name] = proxy
                found.worker_urls[name] = _swap_netloc(server.url, listen)
        yield found
