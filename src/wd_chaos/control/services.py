"""Where a run's store server (and toxiproxy) come from: the store's kit holds its server recipe
(``without_durability.testing.kit``; environment URL, then testcontainers when Docker answers, then a
private instance from binaries on PATH, removed at exit, Ctrl-C included) and turns a server into the
store spec worker processes open; this module puts toxiproxy between workers and store.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from without_durability.testing.kit import KitError, StoreKit, find_kit, server_recipes
from without_durability.testing.replicated import Replicated
from without_durability.testing.servers import (
    INSTALL_HINT,
    Server,
    ServerRecipe,
    ServerUnavailable,
    choose,
    for_scheme,
    probe,
    provide,
    sweep_stale,
    why_unavailable,
)

from ..faults import clock_step as stepped_clock
from ..stores import WALL_OFFSET, Spec
from .toxiproxy_server import TOXIPROXY_SERVER

__all__ = [
    "KEEP_STORE_ENV",
    "Planned",
    "Services",
    "ServerUnavailable",
    "check_urls",
    "clean_up",
    "preflight",
    "services",
    "sweep_stale",
]


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
    wakeup_urls: dict[str, str] = field(default_factory=dict)
    """Each worker's wakeup URL through a proxy of its own (a ``wakeup-loss`` run's)."""
    wakeup_proxies: dict[str, str] = field(default_factory=dict)
    lazyfs: Any = None
    """A power-loss run's LazyFS (``wd_chaos.control.lazyfs``), where the store's data lives."""
    careless_spec: Spec | None = None
    """A store of the careless clients' own on the same server (``wd_chaos.client.clients``): a schema, a
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


def _on_lazyfs(
    stack: contextlib.ExitStack, kit: StoreKit, run_dir: Path, tag: str, relaxed: bool
) -> tuple[Server | None, Spec, Any]:
    """A power-loss run's store with its data on a LazyFS mount: a private server whose data
    folder is the mount, or (no server) the store's file in it; synced once up, as a machine
    that has run a while has written its setup back. ``FuseUnavailable`` (a ``ServerUnavailable``)
    when no mount can be had."""
    from .lazyfs import FuseUnavailable, mounted

    try:
        lazy = stack.enter_context(mounted(run_dir))
    except FuseUnavailable as exc:
        raise ServerUnavailable(str(exc)) from exc
    server = stack.enter_context(kit.server(restartable=True, datadir=lazy.mount, relaxed=relaxed))
    if server is not None and server.source != "local":
        raise ServerUnavailable(
            f"a power loss needs a private {kit.name} server this run starts on its own mount; it has "
            f"{server.source} ({server.url}): unset its URL variable"
        )
    spec: Spec = {"store": kit.name, **kit.worker_spec(server, lazy.mount if server is None else run_dir, tag)}
    spec["wall_offset"] = str(run_dir / WALL_OFFSET)  # the run's clock file stays off the mount
    if relaxed:
        spec["relaxed"] = True
    lazy.sync()
    return server, spec, lazy


def check_available(
    store: str,
    partition: bool = False,
    failover: object = None,
    clock_step: bool = False,
    restart: bool = False,
    power_loss: object = None,
    wakeup_proxy: bool = False,
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
        reason = stepped_clock.why_unavailable(kit.server_binary, kit.recipe)
        if reason:
            return reason
    if partition:
        reason = why_unavailable(TOXIPROXY_SERVER)
        if reason:
            return reason
    if power_loss:
        from .lazyfs import why_unavailable as fuse_unavailable

        reason = fuse_unavailable()
        if reason:
            return f"a power-loss run needs a FUSE mount: {reason}"
    if failover:
        return kit.replication_unavailable()
    return None


REACH_TIMEOUT = 2.0
"""Seconds a pre-flight waits for a server named by a URL variable to accept a connection."""


@dataclass(frozen=True)
class Planned:
    """Where one server of a run will come from, as a pre-flight found it: ``role`` (``store``,
    ``toxiproxy``), ``source`` (``env``, ``testcontainers``, ``local``, ``replicated``) and one line
    saying which (the variable and address, the image, the binaries)."""

    role: str
    source: str
    detail: str


def _malformed(variable: str, value: str, example: str) -> ServerUnavailable:
    return ServerUnavailable(
        f"{variable}={value!r} is not a URL like {example}: set {variable} to your server's URL, "
        "or unset it and wd-chaos starts a private server itself"
    )


def _recipes(first: ServerRecipe | None = None) -> list[ServerRecipe]:
    """``first`` (the recipe whose variable is read), then every installed kit's and toxiproxy's:
    where a URL's scheme says which server it is for, its default port and its login."""
    return [*([first] if first is not None else []), *server_recipes(), TOXIPROXY_SERVER]


def reach(recipe: ServerRecipe, timeout: float = REACH_TIMEOUT) -> str | None:
    """When ``recipe``'s URL variable is set: check each URL in it is well formed, that its
    address accepts a TCP connection within ``timeout`` seconds, and that the server there lets
    us in with the URL's own credentials (``login``, the server recipe's: Postgres authenticates
    and answers a query, Redis answers PING after AUTH/HELLO, toxiproxy its version; a port the
    URL leaves out is the recipe's default for its scheme); returns the address(es) reached,
    or raises ``ServerUnavailable`` naming the variable, the server's own error and what to do.
    None when it is not set (the server will come from elsewhere)."""
    from urllib.parse import urlsplit

    variable = recipe.env
    value = os.environ.get(variable) or ""
    if not value.strip():
        return None
    example = recipe.example or "scheme://host:port"
    reached = []
    for url in (u.strip() for u in value.split(",") if u.strip()):
        try:
            parts = urlsplit(url)
            host, port = parts.hostname, parts.port
        except ValueError as exc:  # a port that is not a number
            raise _malformed(variable, url, example) from exc
        if not parts.scheme or "://" not in url:
            raise _malformed(variable, url, example)
        if host is None:  # e.g. postgresql:///db, a Unix socket: nothing to reach over TCP
            reached.append(url)
            continue
        known = for_scheme(parts.scheme, _recipes(recipe))
        port = port or (known.default_port(parts.scheme) if known is not None else 0)
        try:
            with socket.create_connection((host, port), timeout=timeout):
                pass
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
            raise ServerUnavailable(
                f"{variable} names {host}:{port}, which did not accept a connection within "
                f"{timeout:g} s ({why}): start that server, fix {variable}, or unset it and wd-chaos "
                "starts a private server itself"
            ) from exc
        refused = login(url)
        if refused is not None:
            raise ServerUnavailable(
                f"{variable} names {host}:{port}, which accepted a connection but did not let us in "
                f"within {LOGIN_TIMEOUT:g} s: {refused}. Is it the right kind of server, and are the URL's "
                f"user, password and database right? Fix {variable}, or unset it and wd-chaos starts "
                "a private server itself"
            )
        reached.append(f"{host}:{port}")
    return ", ".join(reached)


LOGIN_TIMEOUT = 4.0
"""Seconds a pre-flight gives a server named by a URL variable to let us in and answer: the
connect, the protocol's handshake and one trivial request together."""


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def login(url: str, timeout: float = LOGIN_TIMEOUT) -> str | None:
    """Log in to the server at ``url`` with its own credentials and make one trivial request,
    every step held to about ``timeout`` seconds; None when it answered, else the server's (or
    the driver's) own error on one line. A scheme with no login known here, or a driver not
    installed (the run says so itself), is None. The login is the ``ServerRecipe.login`` of the
    recipe the URL's scheme names (an installed kit's, or toxiproxy's)."""
    recipe = for_scheme(urlsplit(url).scheme, _recipes())
    check = None if recipe is None else recipe.login
    if check is None:
        return None
    try:
        check(url, timeout)
    except ImportError:
        return None
    except Exception as exc:
        return _first_line(exc)
    return None


def _plan_recipe(role: str, recipe: ServerRecipe, *, private: bool = False) -> Planned:
    """Where a ``recipe`` server comes from, checked: its URL reached, Docker asked (when a
    container would be used), the binaries found."""
    if private:  # a server the run signals or steps: always started here
        found = probe(recipe)
        if found.missing:
            raise ServerUnavailable(
                f"{role}: this run starts a private {recipe.kind} itself, and "
                f"{', '.join(found.missing)} is not on PATH: {INSTALL_HINT}"
            )
        return Planned(role, "local", f"a private {recipe.kind} started from the installed binaries")
    address = reach(recipe)
    if address is not None:
        return Planned(role, "env", f"{recipe.env} ({address}, logged in)")
    choice = choose(recipe, probe(recipe))
    if choice.source is None:
        raise ServerUnavailable(choice.why)
    return Planned(role, choice.source, choice.why.removeprefix(f"{recipe.kind}: "))


def preflight(
    store: str,
    partition: bool = False,
    failover: object = None,
    clock_step: bool = False,
    restart: bool = False,
    power_loss: object = None,
    wakeup_proxy: bool = False,
) -> list[Planned]:
    """Where every server a run of ``store`` with these faults would use comes from, each one
    checked now: a URL variable's address reached (``reach``), Docker asked when a container would
    be used, the binaries of a private server found. Raises ``ServerUnavailable`` with one message
    naming what is missing (the variable, the server, the binary) and what to do. Starts nothing."""
    reason = check_available(store, partition, failover, clock_step, restart, power_loss)
    restart = restart or bool(power_loss)  # a power loss restarts the server on what was synced
    kit = find_kit(store)
    planned: list[Planned] = []
    recipe = kit.recipe
    if recipe is not None:
        reach(recipe)  # as check_urls does before a real run: the same message
    if failover:
        if reason:
            raise ServerUnavailable(reason)
        planned.append(Planned("store", "replicated", f"a private replicated {kit.name} deployment"))
    elif recipe is None:
        if reason:
            raise ServerUnavailable(reason)
        planned.append(Planned("store", "none", f"{kit.name} needs no server"))
    else:
        stepped = clock_step and kit.server_binary is not None
        if restart and not stepped and reach(recipe) is not None:
            raise ServerUnavailable(
                f"a store restart needs a private {kit.name} server this run starts itself, and "
                f"{recipe.env} names one of yours: unset {recipe.env} for this run"
            )
        planned.append(_plan_recipe("store", recipe, private=stepped or restart))
    if partition:
        planned.append(_plan_recipe("toxiproxy", TOXIPROXY_SERVER))
    if reason:  # a reason none of the above explained (a driver missing, a stepped clock's tool)
        raise ServerUnavailable(reason)
    return planned


def check_urls(
    store: str, partition: bool = False, failover: object = None, clock_step: bool = False, **_: object
) -> None:
    """Reach the servers a run's URL variables name (``reach``), raising ``ServerUnavailable`` with
    the pre-flight's own message: what a run calls before it starts anything, so a refused or
    malformed URL is named, not reported by a driver. Cheap: no Docker, no binaries. The store's
    variable is reached even for a run that starts its own server (a failover's, a stepped
    clock's): a variable that names no server is a mistake in the environment, said at once."""
    kit = find_kit(store)
    if kit.recipe is not None:  # even a run that starts its own: a variable set must be right
        reach(kit.recipe)
    if partition:
        reach(TOXIPROXY_SERVER)


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
    power_loss: dict[str, Any] | None = None,
    wakeup_proxy: bool = False,
) -> Iterator[Services]:
    """Provide the servers a run needs and yield its ``Services``. With ``failover`` (the run's
    failover event) the store is a replicated pair (``faults/failover.py``) that clients reach through
    a client following the primary. With ``clock_step`` the kit's server runs on a clock the
    nemesis steps (``faults.clock_step.server_env``), so it is a private one. With ``careless``
    the careless clients get a store of their own on the same server (``careless_spec``). With
    ``power_loss`` (``{"relaxed": bool}``) the store's data lives on a LazyFS mount in the run's
    folder (``faults/power_loss.py``), in its relaxed durability setting when ``relaxed``. With
    ``wakeup_proxy`` (and ``partition``) each worker's wakeup also gets a proxy of its own
    (``wakeup_urls``, ``wakeup_proxies``: ``faults/wakeup_loss.py``)."""
    tag = f"chaos_{secrets.token_hex(4)}"
    lazy = None
    with contextlib.ExitStack() as stack:
        kit = find_kit(store)
        server: Server | Replicated | None
        if failover is not None:
            server, spec = _replicated(stack, kit, failover, run_dir, tag)
        elif power_loss is not None:
            server, spec, lazy = _on_lazyfs(stack, kit, run_dir, tag, bool(power_loss.get("relaxed")))
        else:
            env = None
            if clock_step and kit.server_binary is not None:
                control = run_dir / stepped_clock.CLOCK_FILE
                env = stepped_clock.server_env(kit.server_binary, control, kit.recipe)
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
        found.lazyfs = lazy
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
                if wakeup_proxy:
                    listen = toxi.proxy(f"{proxy}-wakeup", f"{server.host}:{server.port}")
                    found.wakeup_proxies[name] = f"{proxy}-wakeup"
                    found.wakeup_urls[name] = _swap_netloc(server.url, listen)
        yield found


KEEP_STORE_ENV = "WD_KEEP_STORE"
"""Set (to anything but 0) and a run on your own server keeps what it created there (its schema,
its key prefix) for you to inspect, and says so in ``run.json``; unset, the run removes it."""

CLEANUP_SECONDS = 30.0
"""How long a kit's ``cleanup`` may take before the run reports the namespace kept."""


def clean_up(svc: Services) -> list[dict[str, str]]:
    """Remove what the run created in the store (the kit's ``cleanup``, for the run's spec and the
    careless clients'), once its final state has been read; one entry per spec: ``namespace``
    (its schema, prefix or file), ``outcome`` (``removed``, ``kept`` or ``nothing``) and
    ``detail`` (what was removed, or why it was kept). A private server (started here, a
    container, a replicated pair) goes with the run and is not cleaned; ``KEEP_STORE_ENV`` keeps
    everything. Never raises: a cleanup that failed is reported as kept, with the error."""
    import asyncio

    done: list[dict[str, str]] = []
    for spec in (svc.spec, svc.careless_spec):
        if spec is None:
            continue
        namespace = str(spec.get("schema") or spec.get("prefix") or spec.get("path") or spec.get("store"))
        entry = {"namespace": namespace}
        source = getattr(svc.server, "source", None)
        if os.environ.get(KEEP_STORE_ENV, "") not in ("", "0"):
            entry |= {"outcome": "kept", "detail": f"{KEEP_STORE_ENV} is set: left for inspection"}
        elif isinstance(svc.server, Replicated) or source in ("local", "testcontainers"):
            entry |= {"outcome": "nothing", "detail": f"on a private server ({source}), removed with the run"}
        else:
            try:
                kit = find_kit(str(spec["store"]))
                said = asyncio.run(asyncio.wait_for(kit.cleanup(spec), CLEANUP_SECONDS))
            except Exception as exc:  # the verdict stands; the leftover is named so it can be removed
                entry |= {"outcome": "kept", "detail": f"removing it failed: {type(exc).__name__}: {exc}"}
            else:
                outcome = "nothing" if said is None else "removed"
                entry |= {"outcome": outcome, "detail": said or f"{spec['store']} leaves nothing to remove"}
        done.append(entry)
    return done
