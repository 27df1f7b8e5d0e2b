"""The Postgres store's kit: for the suite, a fresh schema per test on a real server, a pool whose
connections live in that schema, and ledger effects over a table in it; for wd-chaos, one schema per
run that every worker process opens, with a ledger written inside each ``transact``."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from without_durability._values import Pass
from without_durability.protocols import Scheduler
from without_durability.testing.harness import EffectFailed, EffectKit, RealTestClock, StoreUnderTest
from without_durability.testing.kit import Capability, MutatePlan, Opened, Spec, StoreKit
from without_durability.testing.replicated import Replicated
from without_durability.testing.servers import Server, provide, why_unavailable

from .local_server import POSTGRES_SERVER

if TYPE_CHECKING:
    from psycopg import AsyncCursor
    from psycopg_pool import AsyncConnectionPool

    from without_durability_postgres import PostgresDurable, PostgresEffect

# The ledger the exactly-once tests move: application data in the same database as the records.
CREATE_LEDGER = "CREATE TABLE wd_ledger (name text PRIMARY KEY, total bigint NOT NULL)"
LEDGER_ADD = """
INSERT INTO wd_ledger AS l (name, total) VALUES (%(name)s, %(amount)s)
ON CONFLICT (name) DO UPDATE SET total = l.total + EXCLUDED.total
RETURNING total
"""
LEDGER_READ = "SELECT total FROM wd_ledger WHERE name = %(name)s"

# A newer claim, committed from another connection while the effect's transaction is still open:
# the token goes up and the claim lapses, as a discard (or a takeover after a lapse) would do.
SUPERSEDE = """
UPDATE workflow_claim
   SET token = GREATEST(token + 1, nextval('workflow_token_seq')), held_until = LEAST(held_until, now()),
       alive_until = LEAST(alive_until, now())
 WHERE workflow = %(workflow)s
"""


def _server_name(url: str) -> str:
    """``url``'s hosts, ports and database, for a message (no user, no password)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:  # a message must not fail over a URL it only names
        return "the run's server"
    return f"{params.get('host', 'localhost')}:{params.get('port', 5432)}/{params.get('dbname', '')}"


def unavailable() -> str | None:
    """Why the Postgres store cannot run here, or None."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        return f"psycopg is not installed ({exc}); pip install 'without-durability[postgres]'"
    return why_unavailable(POSTGRES_SERVER)


def postgres_effects(pool: AsyncConnectionPool[Any]) -> EffectKit[PostgresEffect]:
    """Ledger effects over ``wd_ledger`` in the pool's schema."""

    def ledger_add(name: str, amount: int) -> PostgresEffect:
        async def effect(cursor: AsyncCursor[Any]) -> object:
            await cursor.execute(LEDGER_ADD, {"name": name, "amount": amount})
            row = await cursor.fetchone()
            assert row is not None
            return int(row[0])

        return effect

    async def ledger_read(name: str) -> int:
        async with pool.connection() as conn:
            row = await (await conn.execute(LEDGER_READ, {"name": name})).fetchone()
        return 0 if row is None else int(row[0])

    def superseding(pass_: Pass, inner: PostgresEffect) -> PostgresEffect:
        async def effect(cursor: AsyncCursor[Any]) -> object:
            result = await inner(cursor)
            # Another pooled connection commits the newer claim while this transaction is open.
            async with pool.connection() as other:
                await other.execute(SUPERSEDE, {"workflow": pass_.workflow})
            return result

        return effect

    def failing(inner: PostgresEffect) -> PostgresEffect:
        async def effect(cursor: AsyncCursor[Any]) -> object:
            await inner(cursor)
            raise EffectFailed("effect failed after performing its write")

        return effect

    return EffectKit(ledger_add, ledger_read, superseding, failing)


# The messages after which a client waits for the server: the end of an extended-protocol batch,
# a flush request inside a pipeline, a simple query.
_ASKS = frozenset({"Sync", "Flush", "Query"})


def server_waits(trace: str) -> int:
    """How many times the client waited for the server in ``trace``, a libpq protocol trace
    (``pgconn.trace`` with ``REGRESS_MODE``): each switch from lines the client sent (``F``) to
    lines the server sent (``B``) where the client's lines asked for an answer (a Sync, a Flush
    or a simple Query). Results read while a pipeline is still being sent, which arrive whenever
    the server is quick enough, are not a wait and are not counted. Tests count round trips with
    it."""
    waits, last, asked = 0, "", False
    for line in trace.splitlines():
        fields = line.split("\t", 3)
        direction = fields[0]
        if direction == "F":
            if last != "F":
                asked = False
            asked = asked or (len(fields) > 2 and fields[2] in _ASKS)
        elif direction == "B" and last == "F" and asked:
            waits += 1
        if direction in ("F", "B"):
            last = direction
    return waits


@asynccontextmanager
async def fresh_schema(
    url: str, *, min_size: int = 1, max_size: int = 20
) -> AsyncIterator[tuple[AsyncConnectionPool[Any], str]]:
    """A new, migrated schema with a unique name and an open pool whose connections use it (via
    search_path); the schema is dropped afterwards. ``min_size`` connections are open before it
    yields, so that many callers really run in parallel."""
    import psycopg
    from psycopg_pool import AsyncConnectionPool

    from without_durability_postgres import migrate

    schema = f"wd_test_{uuid.uuid4().hex[:16]}"
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        await admin.execute(f'CREATE SCHEMA "{schema}"')  # a name generated here
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        url,
        min_size=min_size,
        max_size=max(min_size, max_size),
        open=False,
        kwargs={"options": f"-c search_path={schema}"},
    )
    try:
        await pool.open(wait=True)
        await migrate(pool)
        yield pool, schema
    finally:
        await pool.close()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@asynccontextmanager
async def suite_durable(pool: AsyncConnectionPool[Any]) -> AsyncIterator[PostgresDurable]:
    """A durable on ``pool`` for the test suite: with fast failover (a presence of its own, claims
    that record it, takes that reap) when ``FAST_FAILOVER_ENV`` asks, so the whole suite can be run
    against the fast-failover statements too; plain otherwise."""
    from without_durability_postgres import (
        PostgresCheckpointer,
        PostgresDurable,
        PostgresScheduler,
        PostgresWakeup,
    )

    if not fast_failover_wanted():
        yield PostgresDurable(PostgresCheckpointer(pool=pool), PostgresScheduler(pool=pool))
        return
    async with PostgresWakeup(pool, presence=True) as presence:
        yield PostgresDurable(
            PostgresCheckpointer(pool=pool, failover=presence),
            PostgresScheduler(pool=pool, reap_dead=True),
        )


@asynccontextmanager
async def open_postgres(
    server: Server, *, scheduler: SchedulerOpener | None = None, name: str = "postgres"
) -> AsyncIterator[StoreUnderTest[PostgresEffect]]:
    """A fresh Postgres store in its own schema on the session's server, dropped afterwards (see
    ``suite_durable``); with ``scheduler``, a ``PostgresCheckpointer`` and your scheduler (opened
    with ``prepare`` true on the fresh schema) in a ``SplitDurable``."""
    async with fresh_schema(server.url) as (pool, schema), contextlib.AsyncExitStack() as stack:
        durable: Any
        if scheduler is None:
            durable = await stack.enter_async_context(suite_durable(pool))
        else:
            from without_durability.durable import SplitDurable
            from without_durability_postgres import PostgresCheckpointer

            store = WorkerStore(
                pool, schema, "default", {"url": server.url, "schema": schema, "prepare": True}
            )
            durable = SplitDurable(
                PostgresCheckpointer(pool=pool), await stack.enter_async_context(scheduler(store))
            )
        async with pool.connection() as conn:
            await conn.execute(CREATE_LEDGER)
        yield StoreUnderTest(
            name,
            durable,
            RealTestClock(),
            postgres_effects(pool),
            extra={
                "pool": pool,
                "schema": schema,
                "url": server.url,
                "server": server,
                "fast_failover": fast_failover_wanted(),
            },
        )


# -- wd-chaos: one schema shared by the run's processes --------------------------------------------

CHAOS_LEDGER = "chaos_ledger"

FAST_FAILOVER_ENV = "WD_POSTGRES_FAST_FAILOVER"
"""Set to 1 in the environment of a wd-chaos run (``WD_POSTGRES_FAST_FAILOVER=1 wd-chaos run
SCENARIO --store postgres``) and every worker process opens the store with fast failover
(``failover``): a presence of its own, claims that record it and take over a dead owner's, takes
that reap. Unset or 0: leases only, as shipped."""


def fast_failover_wanted() -> bool:
    """Whether ``FAST_FAILOVER_ENV`` asks for fast failover."""
    return os.environ.get(FAST_FAILOVER_ENV, "") not in ("", "0")


SchedulerOpener = Callable[["WorkerStore"], AbstractAsyncContextManager[Scheduler]]
"""Your own scheduler for a kit built on this one: called with the ``WorkerStore`` a process opened
(the run's pool and schema, or a fresh test schema's), it is entered as an async context manager
that yields the ``Scheduler`` and, on exit, closes whatever it opened. With
``store.prepare`` true (once per run, before any worker; and for each conformance test's fresh
schema) it creates its tables first."""


@dataclass(frozen=True)
class WorkerStore:
    """What a process opened for a run (or a conformance test), as a ``SchedulerOpener`` sees it."""

    pool: AsyncConnectionPool[Any]
    """Open, its connections' ``search_path`` the schema: unqualified table names land there."""
    schema: str
    """The schema every process of the run shares (a fresh one per conformance test)."""
    namespace: str
    """The queue namespace the harness asks for (``"chaos"`` in a run)."""
    spec: Spec
    """The whole spec, for a key of your own that your kit's ``worker_spec`` put there."""

    @property
    def prepare(self) -> bool:
        """True once per run, before any worker starts: create your tables now."""
        return bool(self.spec.get("prepare"))


async def create_schema(url: str, schema: str, *, connect_timeout: int = 10) -> None:
    """Create ``schema`` at ``url`` if it does not exist (an admin connection of its own, which
    gives up connecting after ``connect_timeout`` seconds)."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=connect_timeout) as conn:
        await conn.execute(
            psycopg.sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(psycopg.sql.Identifier(schema))
        )


async def drop_schema(url: str, schema: str) -> bool:
    """Drop ``schema`` at ``url`` with everything in it (``CASCADE``); True when it existed. Refuses
    ``public`` and the system schemas (``InvalidInput``): a run drops only a schema it made."""
    import psycopg

    from without_durability.errors import InvalidInput

    if schema in ("public", "information_schema") or schema.startswith("pg_"):
        raise InvalidInput(
            f"refusing to drop schema {schema!r}: only a schema a run or test created is dropped"
        )
    async with await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=10) as conn:
        found = await (
            await conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
        ).fetchone()
        await conn.execute(
            psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(psycopg.sql.Identifier(schema))
        )
    return found is not None


async def open_schema_pool(spec: Spec) -> AsyncConnectionPool[Any]:
    """An open pool on the run's schema ``spec["schema"]`` at ``spec["url"]`` (created first when
    ``spec["prepare"]``), sized by ``spec["pool_size"]`` (default 4), whose connection attempts and
    reads give up after ``spec["timeout"]`` seconds (default 5) instead of hanging on a half-open
    connection, as a partition leaves one."""
    from psycopg_pool import AsyncConnectionPool

    from .timeouts import timed_connections

    schema, timeout = spec["schema"], float(spec.get("timeout", 5))
    if spec.get("prepare"):
        # a wrong server fails within the spec's timeout, never hangs
        await create_schema(spec["url"], schema, connect_timeout=max(2, round(timeout)))
    pool: Any = AsyncConnectionPool(
        spec["url"],
        open=False,
        min_size=1,
        max_size=int(spec.get("pool_size", 4)),
        # connect_timeout and the read timeout: a connection attempt or a call on a half-open
        # connection gives up (as Redis's socket_timeout makes it) instead of hanging for ever
        kwargs={"options": f"-c search_path={schema}", "connect_timeout": max(2, round(timeout))},
        timeout=timeout,
        connection_class=timed_connections(timeout),
    )
    await pool.open(wait=True, timeout=30)
    return cast("AsyncConnectionPool[Any]", pool)


async def create_chaos_ledger(pool: AsyncConnectionPool[Any]) -> None:
    """Create the run's ledger table (``CHAOS_LEDGER``) in the pool's schema, if absent."""
    async with pool.connection() as c:
        await c.execute(
            f"CREATE TABLE IF NOT EXISTS {CHAOS_LEDGER} (row BIGSERIAL PRIMARY KEY, "
            "workflow TEXT NOT NULL, key TEXT NOT NULL, token BIGINT NOT NULL)"
        )


def chaos_opened(
    pool: AsyncConnectionPool[Any],
    durable: Any,
    close: Callable[[], Awaitable[None]],
    *,
    url: str,
    schema: str,
    sweep: bool = True,
) -> Opened:
    """The ``Opened`` a kit returns for a durable whose checkpointer is a ``PostgresCheckpointer``
    on ``pool``: the chaos ledger's effect (one row inserted inside ``transact``'s transaction,
    then ``Opened.pause`` and the failpoint, with the transaction still open) and its reader, the
    row-lock holds a landing probe needs, and (with ``sweep``) the retention sweep, which reads our
    queue table and so is only right with our scheduler."""
    from . import sweep as sweep_older_than
    from .holds import holds_opener

    def ledger_effect(
        workflow: str, key: str, token: int, failpoint: Callable[[], None]
    ) -> Callable[[Any], Awaitable[object]]:
        async def effect(cur: Any) -> object:
            await cur.execute(
                f"INSERT INTO {CHAOS_LEDGER} (workflow, key, token) VALUES (%s, %s, %s) RETURNING row",
                (workflow, key, token),
            )
            row = (await cur.fetchone())[0]
            if opened.pause is not None:
                await opened.pause(workflow, token)
            failpoint()
            return {"row": int(row), "token": token}

        return effect

    async def read_ledger(workflows: list[str]) -> list[dict[str, Any]]:
        async with pool.connection() as c:
            cur = await c.execute(
                f"SELECT row, workflow, key, token FROM {CHAOS_LEDGER} WHERE workflow = ANY(%s) ORDER BY row",
                (workflows,),
            )
            return [
                {"row": int(r), "workflow": w, "key": k, "token": int(t)}
                for r, w, k, t in await cur.fetchall()
            ]

    async def read_queue() -> dict[str, int]:
        async with pool.connection() as c:
            cur = await c.execute(
                "SELECT workflow, count(*) FROM workflow_queue WHERE namespace = %s GROUP BY workflow",
                (durable.scheduler.namespace,),
            )
            return {str(w): int(n) for w, n in await cur.fetchall()}

    async def sweep_older(older_than: timedelta) -> int:
        return int(await sweep_older_than(pool, older_than))

    opened = Opened(
        durable,
        close,
        ledger_effect,
        read_ledger,
        sweep=sweep_older if sweep else None,
        holds=holds_opener(url, schema),
        read_queue=read_queue if sweep else None,  # our queue table: only with our scheduler
    )
    opened.pool_size = pool.max_size
    return opened


WAKEUP_HEALTH = 1.0
"""Seconds, with ``spec["wakeup"]``: the ``PostgresWakeup``'s ``health_every`` and ``health_timeout``
(``spec["wakeup_health"]`` to change it), so a dead LISTEN connection is replaced within its
``resubscribe_bound`` of 5 s; the writers NOTIFY (``notify=True``)."""


async def open_postgres_worker(spec: Spec, *, scheduler: SchedulerOpener | None = None) -> Opened:
    """Open the run's schema ``spec["schema"]`` at ``spec["url"]`` (see ``open_schema_pool``) with
    the chaos ledger (created, with the schema and its migrations, when ``spec["prepare"]``); with
    ``spec["fast_failover"]``, with fast failover (a presence held until ``close``).

    The checkpointer is always a ``PostgresCheckpointer`` (the ledger effect runs inside its
    ``transact``). The scheduler is a ``PostgresScheduler`` in ``spec["namespace"]``, in one
    ``PostgresDurable``; or, with ``scheduler``, yours (see ``SchedulerOpener``), paired with the
    checkpointer in a ``SplitDurable`` (records first, then schedules), without the retention
    sweep, and with fast failover (when asked) on the checkpointer's claims only."""
    from contextlib import AsyncExitStack

    from without_durability.durable import SplitDurable

    from . import PostgresCheckpointer, PostgresDurable, PostgresScheduler, PostgresWakeup, migrate

    pool = await open_schema_pool(spec)
    stack = AsyncExitStack()
    try:
        stack.push_async_callback(pool.close)
        namespace = spec.get("namespace", "default")
        presence = None
        if spec.get("fast_failover"):  # see FAST_FAILOVER_ENV
            presence = await stack.enter_async_context(
                PostgresWakeup(pool, namespace=namespace, presence=True)
            )
        if spec.get("prepare"):
            await migrate(pool)
            await create_chaos_ledger(pool)
        checkpointer = PostgresCheckpointer(pool=pool, failover=presence)
        durable: Any
        wakeup = None
        if scheduler is None:
            notify = bool(spec.get("wakeup"))  # see WAKEUP_HEALTH
            durable = PostgresDurable(
                checkpointer,
                PostgresScheduler(pool=pool, namespace=namespace, reap_dead=presence is not None, notify=notify),
            )
            if notify:  # idle workers LISTEN, through their own proxy when the run gives one
                health = timedelta(seconds=float(spec.get("wakeup_health", WAKEUP_HEALTH)))
                wakeup = PostgresWakeup(
                    pool,
                    namespace=namespace,
                    conninfo=spec.get("wakeup_url"),
                    health_every=health,
                    health_timeout=health,
                )
                stack.push_async_callback(wakeup.close)
                durable.wakeup = wakeup  # what a mutant of the wakeup swaps
        else:
            store = WorkerStore(pool, spec["schema"], namespace, spec)
            durable = SplitDurable(checkpointer, await stack.enter_async_context(scheduler(store)))
    except BaseException:
        await stack.aclose()
        raise
    opened = chaos_opened(
        pool, durable, stack.aclose, url=spec["url"], schema=spec["schema"], sweep=scheduler is None
    )
    opened.wakeup = wakeup
    return opened


class PostgresKit(StoreKit):
    """PostgreSQL: a private server (or ``WD_POSTGRES_URL``), a schema per test or run.

    Also the base of a kit of your own over Postgres: ``PostgresKit("my-queue",
    scheduler=my_opener)`` is a kit whose store is a ``PostgresCheckpointer`` and your scheduler
    (see ``SchedulerOpener``), on the same servers (``server_key`` ``"postgres"``: one server per
    test session for both kits), each conformance test in a fresh schema and each run in a schema
    of its own that ``cleanup`` drops. Without mutants or a mutate plan of ours (they break our
    scheduler); ``provides`` defaults to workers, restart, proxy and transact-pause."""

    name = "postgres"
    description = "PostgreSQL via psycopg 3 (a real server)"
    provides = frozenset({"workers", "restart", "proxy", "transact-pause", "failover", "power-loss"})
    mutant_modules: tuple[str, ...] = ("without_durability_postgres.mutants",)
    recipe = POSTGRES_SERVER
    mutate_plan: MutatePlan | None = MutatePlan(
        statements=("without_durability_postgres",),
        equivalents="without_durability_postgres:equivalent.toml",
        tests=(
            "tests/test_conformance.py",
            "tests/test_postgres.py",
            "tests/test_postgres_answer_and_take.py",
            "tests/test_postgres_batch.py",
            "tests/test_postgres_flight.py",
            "tests/test_postgres_take_and_claim.py",
            "tests/test_postgres_failover.py",
            "tests/test_postgres_sweep.py",
            "tests/test_receipt_numbers.py",
            "tests/test_postgres_holds.py",
        ),
        server_env=POSTGRES_SERVER.env,
        # budget-overrun runs the library Worker, the only client whose take reaches TAKE_AND_CLAIM
        # (the harness client's lease-stall passes a mutant that mints a token twice there)
        scenarios=("lease-stall", "budget-overrun", "append-storm", "take-storm"),
        # the claim, fence, record and take decisions around the SQL (wd-chaos mutate --python)
        python=(
            "src/without_durability_postgres/checkpointer.py",
            "src/without_durability_postgres/scheduler.py",
        ),
    )

    def __init__(
        self,
        name: str = "postgres",
        *,
        scheduler: SchedulerOpener | None = None,
        description: str | None = None,
        provides: frozenset[Capability] | None = None,
    ) -> None:
        self.name = name
        self.scheduler = scheduler
        """Your scheduler's opener, or None for ours."""
        if scheduler is not None:
            self.description = description or f"PostgresCheckpointer with {name}'s own scheduler"
            self.provides = frozenset({"workers", "restart", "proxy", "transact-pause"})
            self.mutant_modules = ()
            self.mutate_plan = None
            self.server_key = "postgres"  # the built-in kit's server serves both in one session
        elif description is not None:
            self.description = description
        if provides is not None:
            self.provides = provides

    def unavailable(self) -> str | None:
        """Why Postgres cannot run here (driver or server missing), or None."""
        return unavailable()

    server_binary = "postgres"

    def server(
        self,
        *,
        restartable: bool = False,
        env: dict[str, str] | None = None,
        datadir: Path | None = None,
        relaxed: bool = False,
    ) -> AbstractContextManager[Server]:
        """A Postgres server (every private one is restartable: it keeps its WAL fsynced; a
        ``restartable`` one is never a container, which the run could not signal). ``datadir``:
        a private one whose data directory is there; ``relaxed``: ``synchronous_commit=off``."""
        if datadir is not None or relaxed:
            return provide(POSTGRES_SERVER, private=True, datadir=datadir, relaxed=relaxed, env=env)
        if env is not None:
            return provide(POSTGRES_SERVER, env=env)
        return provide(POSTGRES_SERVER, private=restartable)

    def open(self, server: Server) -> Any:
        """A fresh store in its own schema on ``server``."""
        return open_postgres(server, scheduler=self.scheduler, name=self.name)

    def replicated(self, *, synchronous: bool) -> AbstractContextManager[Replicated]:
        """A private primary with a streaming standby, synchronous or not (see ``replicated.py``)."""
        from .replicated import replicated_postgres

        return replicated_postgres(synchronous=synchronous)

    def replication_unavailable(self) -> str | None:
        """Which of the binaries a replicated pair needs is missing, or None."""
        from .replicated import unavailable as replication_unavailable

        return replication_unavailable()

    def worker_spec(self, server: Server | Replicated, run_dir: Path, tag: str) -> Spec:
        """The server's URL (a replicated pair's: the multi-host one that follows the primary),
        the run's own schema, and whether ``FAST_FAILOVER_ENV`` asks for fast failover."""
        return {"url": server.url, "schema": tag, "fast_failover": fast_failover_wanted()}

    async def open_worker(self, spec: Spec) -> Opened:
        """Open the run's schema (see ``open_postgres_worker``)."""
        return await open_postgres_worker(spec, scheduler=self.scheduler)

    async def cleanup(self, spec: Spec) -> str | None:
        """Drop the run's schema (``drop_schema``) and say so, naming the server without its
        password."""
        dropped = await drop_schema(spec["url"], spec["schema"])
        where = _server_name(spec["url"])
        if dropped:
            return f"dropped schema {spec['schema']!r} on {where}"
        return f"schema {spec['schema']!r} was not on {where}: nothing to drop"


KIT = PostgresKit()
