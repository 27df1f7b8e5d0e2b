"""Real servers for tests and the chaos harness, whatever the store: where a server comes from, and
the private instances' bookkeeping. Each store kit holds its own ``ServerRecipe`` (the environment
variable naming a URL, the binaries, how to start a private instance, a container image); this module
knows no store.

A server comes from, first match wins: a URL in the recipe's environment variable (for example from
``docker compose up``); testcontainers when a Docker engine answers and the recipe has a container;
or a private instance started from the binaries on PATH (``scripts/install-servers`` provides them) in
a temporary folder on a free loopback port, stopped and removed when the context exits, Ctrl-C
included.

A private server's folder (``wd-<kind>-*`` under the temporary directory) carries an owner file
(``wd-owner-PORT.json``: the pid that started it and the server's own pid). A process killed with
SIGKILL cannot remove its servers; ``sweep_stale`` finds the folders whose owner is gone, kills their
servers and removes them (``provide`` calls it before starting a private server, as do ``wd-chaos
clean`` and every ``wd-chaos run``, and a run's lifeline when its controller dies).

Process management is mirakuru's (process groups, start checks, stop-then-kill) and free ports come
from port-for; both are well-kept libraries that pytest's server plugins use.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

_log = logging.getLogger(__name__)
INSTALL_HINT = "run scripts/install-servers (it installs every server the built-in kits and wd-chaos use)"


class ServerUnavailable(RuntimeError):
    """A server could not be found, reached or started; the message says where it looked and what
    to do."""


@dataclass
class Server:
    """A running server: where to reach it and, for a private instance, how to fault it.

    ``pid`` is the server's own process (not a wrapper's) for SIGSTOP/SIGKILL faults;
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

    def restart(self, *, kill: bool = True, down: float = 0.0) -> None:
        """Stop the server (SIGKILL when ``kill``, else a clean stop) and start it again on the same
        port and data folder, ``down`` seconds later (an outage, not a blink). Only for private
        instances."""
        if self._restart is None:
            raise ServerUnavailable(
                f"{self.kind} at {self.url} came from {self.source}; only a private instance can be restarted"
            )
        self._restart(kill, down)


def find_binary(name: str, *extra_globs: str) -> str:
    """The path of ``name`` on PATH or in the given globs (a distribution may keep a server's
    programs off PATH), or ``ServerUnavailable`` saying how to get it."""
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


STALE_PREFIX = "wd-"
"""The temporary folders a private server lives in start so (``tempfile.gettempdir()``); only those
holding an owner file are swept."""


def _started(pid: int) -> float | None:
    """When ``pid`` started (to tell it from a later process given the same pid), or None if gone."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def own(folder: Path, port: int, server_pid: int | None = None) -> None:
    """Record who started the server on ``port`` in ``folder`` (and the server's pid), so a sweep can
    tell when it is stale; call it again with the new pid after a restart."""
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
        if not path.is_dir() or not path.name.startswith(STALE_PREFIX):
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
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def as_user(user: str) -> list[str]:
    """The command prefix that runs a server as ``user`` through setpriv (which execs, so the process
    started is the server itself): for a server that refuses to run as root."""
    entry = pwd.getpwnam(user)
    return ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--"]


def executor(
    command: list[str], host: str, port: int, log: Path, stop_signal: int, env: dict[str, str] | None = None
) -> Any:
    """A mirakuru executor for ``command``, started when host:port accepts TCP; stdout and stderr go
    to ``log``, ``stop_signal`` stops it cleanly, and ``env`` is added to its environment."""
    from mirakuru import TCPExecutor

    out = open(log, "ab")  # noqa: SIM115 - the server writes here for its whole life
    return TCPExecutor(
        command,
        host=host,
        port=port,
        timeout=60,
        stop_signal=stop_signal,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        envvars=env,
    )


@contextlib.contextmanager
def supervised(server: Server, launch: Callable[[], Any]) -> Iterator[Server]:
    """Keep ``server`` running as the process ``launch`` starts. ``launch`` starts an executor (see
    ``executor``), waits until the server answers, sets ``server.pid`` and returns the executor; it
    is called again by ``server.restart`` (after a clean stop, or a SIGKILL when ``kill``). The
    current process is stopped on exit, whatever happened to the ones before it."""
    current = [launch()]

    def restart(kill: bool, down: float = 0.0) -> None:
        if kill:
            current[0].kill(wait=True)
        else:
            current[0].stop()
        if down > 0:
            time.sleep(down)
        current[0] = launch()

    server._restart = restart
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            current[0].stop()


# -- provisioning: environment, then testcontainers (Docker), then local binaries -----------------------------


@dataclass(frozen=True)
class ServerRecipe:
    """How to have one kind of server: ``env`` names the variable holding a URL (comma-separated
    URLs for a cluster); ``binaries`` the programs a private instance needs, each with a glob to
    look in besides PATH (or ""); ``local(**options)`` starts a private instance and yields its
    ``Server``; ``container()``, if given, does the same with testcontainers. The rest tell a
    tool what it needs to know about the server without naming it: the user it runs as, and how
    to check a URL the user gave (``schemes``, ``login``, ``example``)."""

    kind: str
    env: str
    binaries: tuple[tuple[str, str], ...]
    local: Callable[..., AbstractContextManager[Server]]
    container: Callable[[], AbstractContextManager[Server]] | None = None
    run_as: str = ""
    """The user a private instance runs as when this process is root (through ``as_user``), for
    a server that refuses root; a file the server must read has to be readable by that user.
    Empty: the server runs as this process's user."""
    schemes: tuple[tuple[str, int], ...] = ()
    """The URL schemes this server is reached at, each with the port a URL of it means when it
    names none (``for_scheme`` finds the recipe of a URL; ``default_port`` reads the port)."""
    login: Callable[[str, float], None] | None = None
    """``login(url, timeout)``: log in to the server at ``url`` with the URL's own credentials and
    make one trivial request, each step held to about ``timeout`` seconds; returns when the
    server answered, raises its (or the driver's) error when not, and ``ImportError`` when the
    driver is not installed (imported when called, never with the recipe). None: no login known."""
    example: str = ""
    """A well-formed value for ``env``, for a message about a malformed one (empty: none given)."""

    def default_port(self, scheme: str) -> int:
        """The port a URL of ``scheme`` means when it names none (0: not one of ``schemes``)."""
        return dict(self.schemes).get(scheme, 0)

    def binary_glob(self, name: str) -> str:
        """The glob this recipe looks in besides PATH for its program ``name`` ("" when none)."""
        return next((pattern for binary, pattern in self.binaries if binary == name), "")


def for_scheme(scheme: str, recipes: Iterable[ServerRecipe]) -> ServerRecipe | None:
    """The first of ``recipes`` reached at URLs of ``scheme`` (``ServerRecipe.schemes``), or None."""
    return next((recipe for recipe in recipes if scheme in dict(recipe.schemes)), None)


def _from_env(recipe: ServerRecipe) -> Server | None:
    value = os.environ.get(recipe.env)
    if not value:
        return None
    urls = [u.strip() for u in value.split(",") if u.strip()]
    from urllib.parse import urlsplit

    parts = urlsplit(urls[0])
    return Server(recipe.kind, urls[0], parts.hostname or "127.0.0.1", parts.port or 0, "env", nodes=urls)


Source = Literal["env", "testcontainers", "local"]


@dataclass(frozen=True)
class Probe:
    """What decides where a recipe's server comes from, as ``probe`` found it on this machine."""

    url: str | None
    """The recipe's URL variable (``WD_POSTGRES_URL``, ...), when set and not empty."""
    docker: str | None
    """None when testcontainers is installed and a Docker engine answered; else why not."""
    missing: tuple[str, ...]
    """The server binaries not found (empty: a private server can be started)."""


@dataclass(frozen=True)
class Choice:
    """Where a server will come from (``source``; None when nowhere) and one line saying why."""

    source: Source | None
    why: str


def _docker_probe() -> str | None:
    try:
        import testcontainers.core.container  # noqa: F401
    except ImportError:
        return "testcontainers is not installed (pip install 'without-durability[containers]')"
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=2).ping()
    except Exception as exc:
        detail = " ".join(str(exc).split())[:200]
        return f"no Docker engine answers ({type(exc).__name__}: {detail})"
    return None


def _binary_ok(name: str, pattern: str) -> bool:
    try:
        find_binary(name, *([pattern] if pattern else []))
        return True
    except ServerUnavailable:
        return False


def probe(recipe: ServerRecipe) -> Probe:
    """Look at this machine for ``recipe``: its URL variable, testcontainers and a Docker engine
    (a ping with a 2 s timeout; only when the recipe has a container), and the server binaries."""
    url = os.environ.get(recipe.env) or None
    docker = _docker_probe() if url is None and recipe.container is not None else "not probed"
    missing = tuple(name for name, pattern in recipe.binaries if not _binary_ok(name, pattern))
    return Probe(url, docker, missing)


def choose(recipe: ServerRecipe, found: Probe, *, private: bool = False) -> Choice:
    """Where a ``recipe`` server comes from, first match wins: the URL variable when set; else a
    testcontainers container when the recipe has one and Docker answered (not when ``private``: a
    server the caller must restart or signal is one it starts itself); else a private server from
    the installed binaries. ``why`` names the variable and says why each earlier source was passed
    over."""
    kind, variable = recipe.kind, recipe.env
    if found.url is not None:
        return Choice("env", f"{kind}: from {variable}")
    if recipe.container is None:
        passed = f"not testcontainers: {kind} has no container recipe"
    elif private:
        passed = "not testcontainers: the caller needs a server it can restart or signal"
    elif found.docker is None:
        return Choice("testcontainers", f"{kind}: a testcontainers container ({variable} not set, Docker answers)")
    else:
        passed = f"not testcontainers: {found.docker}"
    if not found.missing:
        return Choice("local", f"{kind}: a private server from the installed binaries ({variable} not set; {passed})")
    return Choice(
        None,
        f"{kind}: {', '.join(found.missing)} not on PATH, {variable} not set, and {passed}; "
        f"{INSTALL_HINT}, or set {variable}",
    )


def why_unavailable(recipe: ServerRecipe) -> str | None:
    """None if a server of ``recipe`` can be had (a URL is set, Docker answers and the recipe has a
    container, or the binaries are on PATH); otherwise why not, with what to do. Starts nothing."""
    choice = choose(recipe, probe(recipe))
    return None if choice.source is not None else choice.why


@contextlib.contextmanager
def provide(recipe: ServerRecipe, *, private: bool = False, **options: Any) -> Iterator[Server]:
    """A server of ``recipe``: from the environment, from testcontainers, or a private local
    instance (started with ``options``), in that order (``choose`` says which and why; the reason
    is logged at INFO on this module's logger). ``private`` skips testcontainers (a server the
    caller restarts); an ``env`` option (added to the server's environment) always means a private
    instance. Raises ``ServerUnavailable`` with what to do when none can be had."""
    if options.get("env") is not None:  # a server from elsewhere cannot take an environment
        found = probe(recipe)
        if found.missing:
            raise ServerUnavailable(
                f"{recipe.kind}: this run changes the server's environment, so it starts a private "
                f"{recipe.kind} from binaries on PATH, and they are missing: {INSTALL_HINT}"
            )
        sweep_stale()
        with recipe.local(**options) as private_server:
            yield private_server
        return
    choice = choose(recipe, probe(recipe), private=private)
    _log.info("%s", choice.why)
    if choice.source is None:
        raise ServerUnavailable(choice.why)
    if choice.source == "env":
        given = _from_env(recipe)
        assert given is not None  # choose saw the variable set
        yield given
        return
    if choice.source == "testcontainers":
        assert recipe.container is not None  # choose saw a container recipe
        with recipe.container() as server:
            yield server
        return
    sweep_stale()  # what a killed test session or run left: servers whose owner is gone
    with recipe.local(**options) as server:
        yield server
