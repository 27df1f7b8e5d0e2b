"""``StoreKit``: everything the conformance suite, wd-chaos, the mutant gate and the benchmarks need to
know about one store, in the store's own package, found by entry point.

A store package registers each of its kits under the entry-point group ``without_durability.stores``
(the entry's name is the kit's ``name``; its value, ``module:ATTRIBUTE``, a ``StoreKit`` instance or
a class or function that returns one)::

    [project.entry-points."without_durability.stores"]
    my-store = "my_store.kit:KIT"

Then ``pytest --wd-store my-store`` runs the conformance suite on it, and, when the kit ``provides``
``workers``, ``wd-chaos run SCENARIO --store my-store`` and ``wd-chaos mutants --store my-store`` run
on it too. The built-in stores register the same way from their own packages; this module names none.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

from ..clock import monotonic_micros, system_clock
from .harness import StoreFactory, StoreUnderTest
from .replicated import Replicated
from .servers import ServerRecipe
from .simulated import SimulatedStore, Wrap

ENTRY_POINT_GROUP = "without_durability.stores"

Spec = dict[str, Any]
"""A JSON-ready description of a store a run opened: the kit's ``worker_spec`` writes it and every
process of the run (workers, writers, readers, the controller) hands it to ``open_worker``. The
harness adds ``store`` (the kit's name), ``namespace``, and optionally ``mutant``, ``ttl`` (a
scenario's small retention, for stores that keep records for a time), ``wait_replicas`` (a failover
run's replicas each write waits for, for stores that can wait) and ``prepare`` (true once, before
any worker starts: create the schema and the ledger)."""

Capability = Literal[
    "workers", "restart", "proxy", "transact-pause", "failover", "power-loss", "simulated"
]
"""What a kit can do for a wd-chaos scenario. ``workers``: many processes open one store from a
spec (every worker scenario needs it). ``restart``: its private server can be killed and started on
the same data with acknowledged writes kept (``store-restart``). ``proxy``: it is reached over one TCP
address that a proxy can stand in for (``partition``). ``transact-pause``: its ledger effect awaits
``Opened.pause`` with the transaction open (a stall inside ``transact``). ``failover``: it starts a
private replicated deployment (``replicated``) whose primary a ``failover`` fault kills.
``power-loss``: its data can live in a folder the run chooses (a private server started with
``server(datadir=...)``, or a file ``worker_spec`` puts in the folder it is given), and it has a
relaxed durability setting (``server(relaxed=True)``, or ``relaxed`` in the spec) that acknowledges
before its data is fsynced (``power-loss``, ``power-loss-relaxed``). ``simulated``: it opens a store
in this process, every wait of it the running event loop's, on clocks it is handed
(``open_simulated``), so ``wd-chaos sim`` runs it."""
CAPABILITIES: tuple[Capability, ...] = get_args(Capability)


WALL_OFFSET = "wall-offset"
"""The file in a run's folder holding the seconds a ``wall-step`` fault has moved the wall clock of
the run's processes (absent until the first step). A store deciding by this machine's clock reads
it through ``stepped_clock`` (``spec["wall_offset"]`` is its path); a server's clock cannot be
stepped so."""


def stepped_clock(path: str) -> Callable[[], datetime]:
    """The system clock plus the offset ``path`` holds (0 while it does not exist): the wall clock a
    ``wall-step`` fault moves in every process at once."""
    offset_file = Path(path)

    def clock() -> datetime:
        try:
            offset = float(offset_file.read_text())
        except (FileNotFoundError, ValueError):
            offset = 0.0
        return system_clock() + timedelta(seconds=offset)

    return clock


class KitError(LookupError):
    """No kit by that name, or a kit that cannot do what was asked; the message says which kits
    exist and what to install or choose."""


@dataclass
class Opened:
    """A store a run's process opened from a spec, and what the harness needs around it."""

    durable: Any
    close: Callable[[], Awaitable[None]]
    ledger_effect: Callable[[str, str, int, Callable[[], None]], Any]
    """``(workflow, key, token, failpoint) -> Effect``: an effect that appends one ledger row
    (workflow, key, token) in the store's own data, calls ``failpoint()`` where a kill would leave
    the effect's transaction open, and returns ``{"row": ..., "token": token}``."""
    read_ledger: Callable[[list[str]], Awaitable[list[dict[str, Any]]]]
    """Every ledger row of the given workflows: row, workflow, key, token."""
    pause: Callable[[str, int], Awaitable[None]] | None = None
    """Set by a worker: awaited inside the ledger effect after its row is written, with the
    transaction open, as ``pause(workflow, token)`` (kits that provide ``transact-pause``)."""
    sweep: Callable[[Any], Awaitable[int]] | None = None
    """For a store whose retention is a process: delete terminal workflows older than the given
    ``timedelta``, returning how many (the ``long-wait`` scenario's sweeper calls it)."""
    holds: Callable[[], AbstractAsyncContextManager[Any]] | None = None
    """For a store whose fence is a row lock: sessions of the store's own that hold a workflow's
    claim, or an uncommitted write of one key, so a probe can order a claim and a record for
    certain (``wd_chaos.client.landing.Holds`` says what it yields; None: the probe is skipped)."""
    read_queue: Callable[[], Awaitable[dict[str, int]]] | None = None
    """The scheduler's queue as it stands: entries per workflow of this store's namespace, for the
    final state that ``queue-bounded`` judges and ``summary.json`` reports (None: not read)."""
    queue_entries_per_workflow: int = 1
    """The most queue entries per workflow this store keeps by design; above 1, ``queue-bounded``
    reports the counts rather than judging them."""
    wakeup: Any = None
    """A ``Wakeup`` (``wait(at_most)``) an idle worker waits on instead of sleeping out its poll
    interval, when the spec asked for one (``spec["wakeup"]``, the ``dead-wakeup`` scenario's);
    None: poll."""
    pool_size: int | None = None
    """The most connections this process's store holds at once, when it pools them (a spec's
    ``pool_size`` asks for a size); None when unbounded or not pooled. With 1, and the ledger
    effect holding that connection in ``pause``, a careless client knows a call it cancels then
    cannot have been sent (``wd_chaos.client.clients``)."""


def local_clocks(spec: Spec, checkpointer: Any) -> dict[str, str]:
    """Which clocks a store's decisions ran on, as the checkers need them. ``store_clock``: whose
    wall clock stamps records and times the queue, ``"local"`` (this machine's: no URL, or a server
    on loopback) or ``"remote"`` (a server elsewhere). ``lease_clock``: ``"monotonic"`` when the
    checkpointer measures leases on the machine's monotonic clock, else ``"wall"``."""
    url = str(spec.get("url", ""))
    local = not url or urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1")
    monotonic = getattr(checkpointer, "lease_clock", None) is monotonic_micros
    return {
        "store_clock": "local" if local else "remote",
        "lease_clock": "monotonic" if monotonic else "wall",
    }


@dataclass(frozen=True)
class MutatePlan:
    """What ``wd-chaos mutate --store NAME`` mutates in this kit's store and which checks judge each
    mutant; a kit declares it as ``mutate_plan``. Names only: nothing is imported until a job runs."""

    statements: tuple[str, ...] = ()
    """Modules or packages whose statement constants are mutated (SQL the store reads when it runs;
    or the constants a module lists in ``WD_STATEMENTS``)."""
    scripts: str | None = None
    """A package whose ``scripts`` folder holds the store's Lua scripts, each one mutated (needs
    ``script_reader``)."""
    script_reader: str = ""
    """With ``scripts``: the ``module:function`` the store reads a script's text through, called
    with its name (``"claim"`` for ``scripts/claim.lua``) each time the store assembles a script.
    A generated script mutant replaces that function in every process of a check, and empties
    every ``functools`` cache in its module, so the store runs the mutated text."""
    tests: tuple[str, ...] = ()
    """The test files each mutant runs, relative to the project folder the job runs in (the
    conformance suite's file among them)."""
    stores: tuple[str, ...] = ()
    """The conformance-registry names the tests run on (``--wd-store``); empty: the kit's own."""
    name: str = ""
    """The prefix of the mutants' ids (empty: the kit's ``family`` or name)."""
    server_env: str = ""
    """The variable the kit's ``server()`` reads a server's URL from first: the job starts one
    server and names it there, so every session shares it (empty: the store has no server)."""
    scenarios: tuple[str, ...] = ()
    """wd-chaos scenarios that judge the tests' survivors (kits that provide ``workers``)."""
    pytest_args: tuple[str, ...] = ()
    """Extra pytest arguments, e.g. ``("-p", "my_store.testing")``."""
    narrow: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(target prefix, stores): a mutant of a statement or script whose name starts so runs on those
    stores only (the first match); one the prefixes miss runs on ``stores``."""
    python: tuple[str, ...] = ()
    """The store's Python decision code (``.py`` files under ``src/``, relative to the project
    folder) that ``wd-chaos mutate --python`` mutates with cosmic-ray and runs ``tests`` against."""
    equivalents: str = ""
    """A TOML file shipped in the store's package, as ``package:file``, holding ``[equivalent]`` of
    ``"mutant id" = "why"``: the generated mutants (of statements, scripts or, ids with ``:py:``,
    Python) that behave as the real store for every caller, reported as equivalent and never run
    (``wd-chaos mutate --equivalent FILE`` replaces it for one job). Empty: none."""


class StoreKit:
    """One store, for every tool that tests it. Subclass it (or build an instance) in the store's
    own package and register it by entry point (see the module docstring).

    The conformance suite needs ``open`` (and ``server``, ``unavailable``); wd-chaos needs
    ``provides``, ``worker_spec`` and ``open_worker``; the mutant gate needs ``mutant_modules``;
    ``wd-chaos mutate`` needs ``mutate_plan``; ``wd-chaos sim`` needs ``open_simulated``.
    """

    name: str = ""
    """The name ``--wd-store`` and ``wd-chaos --store`` take."""
    description: str = ""
    family: str = ""
    """The store this kit is a form of, for ``@pytest.mark.wd_store(...)`` filters and mutants
    (empty: its own name); a kit that runs another kit's code on a different deployment may name it."""
    aliases: tuple[str, ...] = ()
    """Other names that reach this kit (a store's older or shorter name)."""
    default: bool = False
    """Whether a tool runs on this kit when the user names no store (``default_kit``). The
    built-in SQLite kit declares it: it needs no server and every worker process opens one file."""
    provides: frozenset[Capability] = frozenset()
    server_key: str = ""
    """Kits with the same key share one server per test session (empty: the kit's own name)."""
    mutant_modules: tuple[str, ...] = ()
    """Modules holding a ``MUTANTS`` list of this store's deliberately broken forms (see
    ``without_durability.testing.mutants``); named, not imported, so loading a kit costs nothing."""
    mutate_plan: MutatePlan | None = None
    """Where this store's statements or scripts live and which tests judge their generated mutants
    (``wd-chaos mutate --store NAME``); None: the store declares none."""

    def unavailable(self) -> str | None:
        """Why this store cannot run here (its driver is missing, no server can be had), with what
        to do; None when it can. Starts nothing."""
        return None

    recipe: ServerRecipe | None = None
    """Where this store's server comes from (its URL variable, binaries, container), for a tool
    that checks before it starts anything (``wd-chaos run --check``); None for a store without
    one, or a kit that does not say."""

    server_binary: str | None = None
    """The server program whose clock decides this store's leases and stamps (``postgres``,
    ``redis-server``): what a clock-step run starts under a stepped clock; None for a store that
    runs on its workers' clocks."""

    def server(
        self,
        *,
        restartable: bool = False,
        env: dict[str, str] | None = None,
        datadir: Path | None = None,
        relaxed: bool = False,
    ) -> AbstractContextManager[Any]:
        """Enter to have this store's server for a session or a run (None for a store without one).
        ``restartable`` asks for a private instance set up to keep acknowledged writes across a
        SIGKILL, for kits that provide ``restart``; ``env`` for a private instance with these
        variables added to its environment (a stepped clock). Kits that provide ``power-loss``
        take ``datadir`` (a private instance whose data lives there: a power-loss run's FUSE
        mount) and ``relaxed`` (its relaxed durability setting instead of an fsync per commit)."""
        return contextlib.nullcontext(None)

    def open(self, server: Any) -> AbstractAsyncContextManager[StoreUnderTest[Any]]:
        """A fresh, empty store for one conformance test on ``server`` (what ``server()`` gave),
        cleaned up on exit."""
        raise NotImplementedError(f"store kit {self.name!r} does not open a store for the suite")

    def replicated(self, *, synchronous: bool) -> AbstractContextManager[Replicated]:
        """Enter to have a private replicated deployment of this store (kits that provide
        ``failover``): a primary and a standby, ``synchronous`` when an acknowledged write must
        have reached the standby (where the store has the choice). ``worker_spec`` takes it as
        its ``server``."""
        raise KitError(f"store kit {self.name!r} cannot start a replicated deployment (no 'failover')")

    def replication_unavailable(self) -> str | None:
        """Why ``replicated`` cannot start here (a binary missing, with how to get it), or None.
        Starts nothing."""
        if "failover" not in self.provides:
            return f"store kit {self.name!r} does not provide failover"
        return None

    def worker_spec(self, server: Any, run_dir: Path, tag: str) -> Spec:
        """The spec every process of one wd-chaos run opens this store with: where it is (a file in
        ``run_dir``, or ``server``'s URL; a ``Replicated`` from ``replicated``: a client that
        follows its primary) and a namespace of its own (``tag``: a schema, a key prefix)."""
        raise KitError(f"store kit {self.name!r} cannot be opened by worker processes")

    def open_simulated(
        self, clock: Callable[[], datetime], lease_clock: Callable[[], int], wrap: Wrap | None = None
    ) -> SimulatedStore:
        """A fresh store in this process on the given wall clock and lease clock (microseconds),
        ``wrap`` (a mutant's) applied to its ``Durable``, for a simulator that runs every caller on
        one deterministic event loop (``wd-chaos sim``): every wait of it is the loop's. Kits that
        provide ``simulated``; the others raise ``KitError`` (a store that needs a server or a
        thread cannot)."""
        raise KitError(f"store kit {self.name!r} cannot run in the simulator (no 'simulated')")

    async def open_worker(self, spec: Spec) -> Opened:
        """Open the store ``spec`` names in this process, with its in-store ledger."""
        raise KitError(f"store kit {self.name!r} cannot be opened by worker processes")

    async def cleanup(self, spec: Spec) -> str | None:
        """Remove what the wd-chaos run that ``spec`` describes created in the store (a schema, a
        key prefix), once the harness has read the run's final state: a run on a user's server
        (``WD_POSTGRES_URL``, ``WD_REDIS_URL``) must not leave it behind. Returns one line saying
        what was removed, or None when there is nothing to remove (the store lives in the run's
        folder, or on a private server removed with the run). Raises (any exception) when
        removing failed; the harness then reports the namespace as kept, with the error. Must be
        safe to call when the run created nothing (a run that failed before ``prepare``). Never
        called for a conformance test: ``open`` cleans up on exit."""
        return None

    def clocks(self, spec: Spec, checkpointer: Any) -> dict[str, str]:
        """Which clocks decide this store's leases and stamps (``local_clocks`` by default)."""
        return local_clocks(spec, checkpointer)

    def lacks(self, needs: set[str] | frozenset[str]) -> list[str]:
        """The capabilities among ``needs`` this kit does not provide, in order."""
        return sorted(set(needs) - set(self.provides))

    @property
    def store_kind(self) -> str:
        """``family`` if set, else ``name``."""
        return self.family or self.name

    def factory(self) -> StoreFactory:
        """This kit as the conformance suite's ``StoreFactory``."""
        return StoreFactory(
            self.name,
            self.open,
            self.server,
            self.unavailable,
            self.description,
            self.family,
            server_key=self.server_key or self.name,
        )


_KITS: dict[str, StoreKit] | None = None
_BROKEN: dict[str, str] = {}


def _load(entry: Any) -> StoreKit:
    value = entry.load()
    kit = value() if callable(value) and not isinstance(value, StoreKit) else value
    if not isinstance(kit, StoreKit):
        raise KitError(
            f"entry point {entry.name} = {entry.value!r} in group {ENTRY_POINT_GROUP} gave "
            f"{type(kit).__name__}, not a StoreKit"
        )
    if kit.name != entry.name:
        raise KitError(
            f"entry point {entry.name} = {entry.value!r} gave the kit named {kit.name!r}: "
            "the entry's name must be the kit's name"
        )
    return kit


def kits() -> dict[str, StoreKit]:
    """Every installed kit by name, loaded once. A kit whose module fails to import is left out
    and ``broken_kits`` says why (so one broken package cannot hide the others)."""
    global _KITS
    if _KITS is None:
        found: dict[str, StoreKit] = {}
        for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            try:
                found[entry.name] = _load(entry)
            except KitError:
                raise
            except Exception as exc:
                _BROKEN[entry.name] = f"{entry.value}: {type(exc).__name__}: {exc}"
        _KITS = found
    return dict(_KITS)


def broken_kits() -> dict[str, str]:
    """Kits whose entry point failed to load, with why."""
    kits()
    return dict(_BROKEN)


def resolve(name: str) -> str:
    """The kit name ``name`` reaches (itself, or the kit it is an alias of); a ``KitError`` naming
    the installed kits when none."""
    found = kits()
    if name in found:
        return name
    for kit in found.values():
        if name in kit.aliases:
            return kit.name
    broken = f"; failed to load: {_BROKEN[name]}" if name in _BROKEN else ""
    raise KitError(
        f"no store kit {name!r}{broken}; installed: {', '.join(sorted(found)) or 'none'} "
        f"(a package registers one under the entry-point group {ENTRY_POINT_GROUP})"
    )


def default_kit() -> str:
    """The name of the kit a tool runs on when the user names no store (``wd-chaos run`` without
    ``--store``): the installed kit that declares ``default`` (the first by name if several do),
    else the first by name that provides ``workers`` and needs no server (no ``recipe``). A
    ``KitError`` naming the installed kits when none qualifies."""
    found = kits()
    declared = [name for name, kit in sorted(found.items()) if kit.default]
    serverless = [
        name for name, kit in sorted(found.items()) if "workers" in kit.provides and kit.recipe is None
    ]
    for name in (*declared, *serverless):
        return name
    raise KitError(
        f"no store kit declares itself the default or runs workers without a server; installed: "
        f"{', '.join(sorted(found)) or 'none'}: name one with --store"
    )


def server_recipes() -> list[ServerRecipe]:
    """The server recipe of every installed kit that has one (``StoreKit.recipe``), each once, in
    kit-name order: where a tool looks up what it knows about a server by its URL's scheme."""
    found: list[ServerRecipe] = []
    for _, kit in sorted(kits().items()):
        if kit.recipe is not None and kit.recipe not in found:
            found.append(kit.recipe)
    return found


def missing_driver(name: str) -> bool:
    """Whether ``name`` is a registered kit (or an alias-like prefix of one: ``redis`` of
    ``redis-set``) that failed to load here for want of its driver: a missing extra, not a typo."""
    return any(
        (kit == name or kit.startswith(name + "-")) and "ModuleNotFoundError" in why
        for kit, why in broken_kits().items()
    )


def resolve_or_missing(name: str) -> str:
    """``resolve(name)``, or ``name`` itself when it is a kit whose driver is missing here
    (``missing_driver``); a ``KitError`` only for a name no kit has."""
    try:
        return resolve(name)
    except KitError:
        if missing_driver(name):
            return name
        raise


def find_kit(name: str) -> StoreKit:
    """The kit called ``name`` (or an alias of it); ``KitError`` saying which exist when none."""
    return kits()[resolve(name)]


def load_mutant_module(path: str) -> Any:
    """Import the mutant module ``path`` a kit names, or a ``KitError`` naming the kit's mistake."""
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as exc:
        raise KitError(f"mutant module {path!r} cannot be imported: {exc}") from exc
