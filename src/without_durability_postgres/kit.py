"""The Postgres store's kit: for the suite, a fresh schema per test on a real server, a pool whose
connections live in that schema, and ledger effects over a table in it; for wd-chaos, one schema per
run that every worker process opens, with a ledger written inside each ``transact``."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager, asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from without_durability._values import Pass
from without_durability.testing.harness import EffectFailed, EffectKit, RealTestClock, StoreUnderTest
from without_durability.testing.kit import MutatePlan, Opened, Spec, StoreKit
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
async def open_postgres(server: Server) -> AsyncIterator[StoreUnderTest[PostgresEffect]]:
    """A fresh Postgres store in its own schema on the session's server (see ``suite_durable``)."""
    async with fresh_schema(server.url) as (pool, schema), suite_durable(pool) as durable:
        async with pool.connection() as conn:
            await conn.execute(CREATE_LEDGER)
        yield StoreUnderTest(
            "postgres",
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


async def open_postgres_worker(spec: Spec) -> Opened:
    """Open the run's schema ``spec["schema"]`` at ``spec["url"]`` with the chaos ledger (created,
    with the schema and its migrations, when ``spec["prepare"]``); with ``spec["fast_failover"]``,
    with fast failover (a presence held until ``close``)."""
    import psycopg
    from psycopg_pool import AsyncConnectionPool

    from . import PostgresCheckpointer, PostgresDurable, PostgresScheduler, PostgresWakeup, migrate, sweep
    from .holds import holds_opener
    from .timeouts import timed_connections

    schema = spec["schema"]
    if spec.get("prepare"):
        async with await psycopg.AsyncConnection.connect(spec["url"], autocommit=True) as c:
            await c.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')  # a name the harness made
    pool: Any = AsyncConnectionPool(
        spec["url"],
        open=False,
        min_size=1,
        max_size=int(spec.get("pool_size", 4)),
        # connect_timeout and the read timeout: a connection attempt or a call on a half-open
        # connection gives up (as Redis's socket_timeout makes it) instead of hanging for ever
        kwargs={
            "options": f"-c search_path={schema}",
            "connect_timeout": max(2, round(float(spec.get("timeout", 5)))),
        },
        timeout=float(spec.get("timeout", 5)),
        connection_class=timed_connections(float(spec.get("timeout", 5))),
    )
    await pool.open(wait=True, timeout=30)
    namespace = spec.get("namespace", "default")
    presence = None
    if spec.get("fast_failover"):  # see FAST_FAILOVER_ENV
        presence = PostgresWakeup(pool, namespace=namespace, presence=True)
        await presence.start()
    durable = PostgresDurable(
        PostgresCheckpointer(pool=pool, failover=presence),
        PostgresScheduler(pool=pool, namespace=namespace, reap_dead=presence is not None),
    )
    if spec.get("prepare"):
        await migrate(pool)
        async with pool.connection() as c:
            await c.execute(
                f"CREATE TABLE IF NOT EXISTS {CHAOS_LEDGER} (row BIGSERIAL PRIMARY KEY, "
                "workflow TEXT NOT NULL, key TEXT NOT NULL, token BIGINT NOT NULL)"
            )

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

    async def close() -> None:
        if presence is not None:
            await presence.close()
        await pool.close()

    async def sweep_older(older_than: timedelta) -> int:
        return int(await sweep(pool, older_than))

    holds = holds_opener(spec["url"], schema)
    opened = Opened(
        durable, close, ledger_effect, read_ledger, sweep=sweep_older, holds=holds, read_queue=read_queue
    )
    opened.pool_size = pool.max_size
    return opened


class PostgresKit(StoreKit):
    """PostgreSQL: a private server (or ``WD_POSTGRES_URL``), a schema per test or run."""

    name = "postgres"
    description = "PostgreSQL via psycopg 3 (a real server)"
    provides = frozenset({"workers", "restart", "proxy", "transact-pause", "failover", "power-loss"})
    mutant_modules = ("without_durability_postgres.mutants",)
    recipe = POSTGRES_SERVER
    mutate_plan = MutatePlan(
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
        return open_postgres(server)

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
        return await open_postgres_worker(spec)


KIT = PostgresKit()
