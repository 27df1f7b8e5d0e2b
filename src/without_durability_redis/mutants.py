"""Mutants of the Redis store: a script edited, or a read that forgets the recorded position.

Script mutants replace one script's text through the store's ``script_overrides``; each edit checks
that the text it changes is really there, so a change to the real script cannot quietly turn a
mutant into a copy of the real store.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from without_durability._values import Pass
from without_durability.testing.mutants import Mutant, Swap, Wrap, swap
from without_durability_redis import RedisCheckpointer, RedisSetScheduler, RedisStreamScheduler
from without_durability_redis._keys import check_id
from without_durability_redis._scripts import DRIVER_ERRORS, SCRIPTS, Scripts, script_source, text, translated

REDIS_TESTS = "tests/test_redis.py"


def _edit(source: str, old: str, new: str) -> str:
    if old not in source:
        raise ValueError(f"mutant edit target not found in the script: {old!r}")
    return source.replace(old, new)


class SwapScripts(Swap):
    """``Swap``, then rebuild the part's scripts so ``cls.script_overrides`` take effect."""

    def __call__(self, durable: Any) -> Any:
        durable = super().__call__(durable)
        target = getattr(durable, self.part)
        target._scripts = Scripts(
            target.client, getattr(self.cls, "script_overrides", {}), coalesce=target._scripts._coalesce
        )
        return durable


def swap_scripts(part: str, cls: type) -> Wrap:
    """A ``SwapScripts`` of ``part`` to ``cls``."""
    return SwapScripts(part, cls)


class LoadByHashIteration(RedisCheckpointer):
    """load returns records in the hash's own iteration order instead of by recorded position: right
    while the hash is a listpack, wrong once it converts to a hashtable."""

    async def _rows(self, workflow: str) -> list[tuple[int, str, int, str]]:
        check_id(workflow)
        raw = await self.client.hgetall(self.hash_key(workflow))
        rows = []
        for field_, stored in raw.items():
            if not field_:
                continue  # the latest stamp, not a record
            position, written, encoded = text(stored).split(":", 2)
            rows.append((int(position), text(field_), int(written), encoded))
        return rows


class TokenPlainCounter(RedisCheckpointer):
    """claim mints its token as the last one plus one (1 for a missing hash), so a claim hash that
    expired and was re-created starts again at 1, below tokens passes in flight still hold."""

    script_overrides = {  # noqa: RUF012 - the store reads it as a mapping, never mutated
        "claim": _edit(script_source("claim"), "local clock = math.floor(now / 1000)", "local clock = 1")
    }


class StreamWakeReinstatesCancelled(RedisStreamScheduler):
    """wake_at on the stream does not ask whether its entry is still there, so a delivery cancelled
    while its pass ran is put back."""

    script_overrides = {  # noqa: RUF012
        "stream_wake": _edit(
            _edit(
                script_source("stream_wake"),
                "if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then\n  return 0\nend",
                "",
            ),
            "if not timer or tonumber(timer) ~= tonumber(ARGV[3]) then\n  return 0\nend",
            "",
        )
    }


MUTANTS = [
    Mutant(
        "redis-load-by-hash-iteration",
        "redis-set",
        "load-order",
        "load orders records by hash iteration instead of the recorded position",
        (f"{REDIS_TESTS}::test_order_survives_listpack_to_hashtable_conversion", "chaos:append-storm:order"),
        swap("checkpointer", LoadByHashIteration),
    ),
    Mutant(
        "redis-token-plain-counter",
        "redis-set",
        "fencing-token",
        "the token is a plain counter that restarts when the claim hash expires",
        (f"{REDIS_TESTS}::test_expired_claim_hash_still_mints_a_higher_token", "chaos:long-wait:fencing"),
        swap_scripts("checkpointer", TokenPlainCounter),
    ),
    Mutant(
        "redis-stream-wake-reinstates-cancelled",
        "redis-stream",
        "wake-at-respects-cancel",
        "the stream's wake_at puts back a delivery cancelled since it was taken",
        ("test_wake_at_does_not_reinstate_a_cancelled_delivery", "chaos:take-storm:cancel-sticks"),
        swap_scripts("scheduler", StreamWakeReinstatesCancelled),
    ),
]


# -- lifecycle (issue 14) -------------------------------------------------------------------


def _expire_open(name: str) -> str:
    return _edit(
        script_source(name),
        "  else\n    keep(records, ms)\n  end",
        "  else\n    extend(records, ms)\n  end",
    )


class RecordsExpireAfterLastWrite(RedisCheckpointer):
    """Every write arms the records' TTL, terminal or not (the rule before issue 14): a workflow
    sleeping or waiting past ``ttl`` loses its records and its next pass starts from scratch."""

    script_overrides = {name: _expire_open(name) for name in ("record", "supply", "transact")}  # noqa: RUF012


MUTANTS.append(
    Mutant(
        "redis-records-expire-while-open",
        "redis-set",
        "nothing-live-expires",
        "every write arms the records' TTL, so a waiting workflow's records expire",
        (
            f"{REDIS_TESTS}::test_records_expire_only_once_the_workflow_is_terminal",
            f"{REDIS_TESTS}::test_a_sleep_past_the_ttl_does_not_restart_the_workflow",
            "chaos:long-wait:ledger-once",
            "chaos:long-wait:nothing-lost",
        ),
        swap_scripts("checkpointer", RecordsExpireAfterLastWrite),
    )
)


# -- the fence on record ----------------------------------------------------------------------


class RecordWithoutFence(RedisCheckpointer):
    """record skips its token check: a superseded pass's writes land (Redis's counterpart of the
    SQLite and Postgres record-without-fence mutants, and the Redis run the mutant gate shrinks)."""

    script_overrides = {  # noqa: RUF012 - the store reads it as a mapping, never mutated
        "record": _edit(
            script_source("record"),
            "if redis.call('HGET', KEYS[2], 'token') ~= ARGV[1] then\n  return {'fenced'}\nend",
            "",
        )
    }


MUTANTS.append(
    Mutant(
        "redis-record-without-fence",
        "redis-set",
        "fencing",
        "record ignores the token: a superseded pass's writes land",
        ("test_superseded_record_is_fenced_and_writes_nothing", "chaos:lease-stall:fencing"),
        swap_scripts("checkpointer", RecordWithoutFence),
    )
)


# -- clients as users write them (issue 29) ---------------------------------------------------

_AHEAD = "  if ahead_ms > ms then\n    ms = ahead_ms\n  end\n"


class ClaimHashExpiresAheadOfItsToken(RedisCheckpointer):
    """The claim hash's TTL is the budget left plus ``ttl`` whatever its token, as before issue 29:
    after claims faster than one a millisecond ran the tokens ahead of the server's clock, a short
    ``ttl`` expires the hash and the next claim mints the bare clock, a token already handed out."""

    script_overrides = {  # noqa: RUF012
        name: _edit(script_source(name), _AHEAD, "")
        for name in ("append", "claim", "discard", "record", "release", "renew", "supply", "transact")
    }


class CancelSwallowed(RedisCheckpointer):
    """A call whose task was cancelled returns the reply redis-py handed back (its ``wait_for`` on
    Python 3.11 does when the cancel lands as the reply arrives), so the caller goes on as if it
    had not cancelled; a Worker's renewal tick so cancelled ran for ever before issue 29."""

    async def _run(self, what: str, name: str, keys: Any, args: Any) -> Any:
        # each call alone, through redis-py's own send (its wait_for), as before calls were sent
        # together: a coalesced call awaits a future of ours, which never swallows a cancel
        alone = self.__dict__.get("_alone")
        if alone is None:
            alone = self.__dict__["_alone"] = Scripts(self.client, self.script_overrides)
        try:
            await self._first_contact()
            return await alone.run(name, keys, args)
        except DRIVER_ERRORS as exc:
            raise translated(self.client, what, exc) from exc


MUTANTS += [
    Mutant(
        "redis-claim-hash-expires-ahead-of-its-token",
        "redis-set",
        "fencing-token",
        "the claim hash may expire while its token is still ahead of the server's clock",
        (
            f"{REDIS_TESTS}::test_a_claim_storm_under_a_short_ttl_never_sees_a_token_again",
            # a burst of claims sent together runs the tokens ahead of the clock by more than the
            # 1 s retention; the claim after the quiet spell gets a token the burst was handed
            "chaos:claim-burst:tokens-unique",
        ),
        swap_scripts("checkpointer", ClaimHashExpiresAheadOfItsToken),
    ),
    Mutant(
        "redis-cancel-swallowed",
        "redis-set",
        "cancelled-calls",
        "a cancelled call returns its reply instead of raising CancelledError (Python 3.11's wait_for)",
        (
            f"{REDIS_TESTS}::test_a_cancelled_call_raises_cancelled_even_when_its_reply_arrived",
            "chaos:careless-clients:cancelled-calls",
        ),
        swap("checkpointer", CancelSwallowed),
    ),
]


# -- a bad network (slow-network's half-open fault, judged by half-open-gives-up) ------------------

NETWORK_KILLERS = ("chaos:slow-network:half-open-gives-up",)


def redis_without_socket_timeout(durable: Any) -> Any:
    """The client's connections wait on the server for ever (redis-py's default): no
    ``socket_timeout`` on the connections open now or opened later."""
    pools = {
        id(p): p
        for p in (durable.checkpointer.client.connection_pool, durable.scheduler.client.connection_pool)
    }
    for pool in pools.values():
        if pool.connection_kwargs.get("socket_timeout") is None:
            raise TypeError("the client has no socket_timeout to take away")
        pool.connection_kwargs["socket_timeout"] = None
        for conn in [*getattr(pool, "_available_connections", ()), *getattr(pool, "_in_use_connections", ())]:
            conn.socket_timeout = None
    return durable


MUTANTS += [
    Mutant(
        "redis-no-socket-timeout",
        "redis-set",
        "calls-give-up",
        "the client has no socket_timeout: a call on a half-open connection hangs",
        NETWORK_KILLERS,
        redis_without_socket_timeout,
    ),
]


# -- power loss (issue 35) ------------------------------------------------------------------


class AppendFsyncEverySec(RedisCheckpointer):
    """Every claim sets the server's ``appendfsync`` to ``everysec`` (Redis's default for the log),
    again after a restart brought back the kit's ``always``: writes are acknowledged up to a second
    before they are fsynced, while the store and its kit claim an fsync per write. Only a power
    loss (not a kill) can show it."""

    async def claim(self, workflow: str, *, alive: timedelta, budget: timedelta) -> Pass:
        await self.client.config_set("appendfsync", "everysec")
        return await super().claim(workflow, alive=alive, budget=budget)


MUTANTS.append(
    Mutant(
        "redis-appendfsync-everysec",
        "redis-set",
        "durability",
        "the server fsyncs its append-only log once a second, not per write: a power loss drops acknowledged writes",
        ("chaos:power-loss:durability",),
        swap("checkpointer", AppendFsyncEverySec),
    )
)


# -- the queue judged as hard as the records (issue 44) ---------------------------------------------


class SetAnswerIgnoresReceipt(RedisSetScheduler):
    """The sorted set's wake_at answers for whatever score and take number the member has: a
    superseded holder's late answer removes or moves the delivery a newer take holds, and removes
    a wakeup since."""

    script_overrides = {  # noqa: RUF012
        "set_wake": _edit(
            script_source("set_wake"),
            "if not score or tonumber(score) ~= tonumber(ARGV[2]) or redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[3] then",
            "if not score then",
        )
    }


class SetWakeupWhileHeldDropped(RedisSetScheduler):
    """schedule adds a member only when it is missing (ZADD NX), so a wakeup that lands while a
    delivery is held is dropped and the holder's answer removes the workflow's only entry."""

    script_overrides = {  # noqa: RUF012
        "set_schedule": _edit(
            script_source("set_schedule"),
            "redis.call('ZADD', KEYS[1], 'LT', at, ARGV[1])",
            "redis.call('ZADD', KEYS[1], 'NX', at, ARGV[1])",
        )
    }


MUTANTS += [
    Mutant(
        "redis-set-answer-ignores-receipt",
        "redis-set",
        "wake-at-acts-on-its-own-receipt",
        "the sorted set's wake_at acts on the member whatever its score (its receipt)",
        (
            "test_stale_delivery_cannot_answer_for_a_newer_take",
            "chaos:lease-stall:stale-answer",
            "chaos:lease-stall:wakeup-stands",
        ),
        swap_scripts("scheduler", SetAnswerIgnoresReceipt),
    ),
    Mutant(
        "redis-set-wakeup-while-held-dropped",
        "redis-set",
        "wakeup-since-the-take-stands",
        "schedule of a queued (or held) workflow changes nothing, so a wakeup while held is lost",
        ("test_a_wakeup_while_held_survives_each_answer_kind", "chaos:lease-stall:wakeup-stands"),
        swap_scripts("scheduler", SetWakeupWhileHeldDropped),
    ),
]


_MAKE_READY = (
    "  redis.call('ZREM', KEYS[2], workflow)\n  drop_entry(workflow)\n  local id = redis.call('XADD'"
)


class StreamMakeReadyKeepsOlderEntry(RedisStreamScheduler):
    """The stream's make_ready adds a fresh entry without dropping the workflow's older one (the
    ``drop_entry`` left out when the helper was written): every redelivery and every wakeup of a
    held workflow leaves one more entry in the stream and its pending list, so the queue grows by
    one entry per redelivery and never shrinks."""

    script_overrides = {  # noqa: RUF012
        name: _edit(
            script_source(name),
            _MAKE_READY,
            "  redis.call('ZREM', KEYS[2], workflow)\n  local id = redis.call('XADD'",
        )
        for name, prelude in SCRIPTS.items()
        if prelude == "stream"  # every stream script carries the helpers
    }


MUTANTS += [
    Mutant(
        "redis-stream-second-entry-per-workflow",
        "redis-stream",
        "one-queue-entry-per-workflow",
        "the stream's make_ready adds a workflow's fresh entry and keeps its older one",
        (
            f"{REDIS_TESTS}::test_stream_redelivery_and_a_wakeup_while_held_leave_one_entry",
            "chaos:lease-stall:queue-bounded",
        ),
        swap_scripts("scheduler", StreamMakeReadyKeepsOlderEntry),
    ),
]


class StreamNeverRereads(RedisStreamScheduler):
    """Once a blocking read of ``wait`` is lost (given up unanswered, or failed), ``wait`` never
    blocks on the stream again: it sleeps out ``at_most``, so pickup falls back to the poll
    interval for good, with no error anywhere."""

    async def _blocking_read(self, after: str, block: int) -> None:
        if getattr(self, "_gave_up", False):
            await asyncio.sleep(block / 1000)
            return
        lost = self.reads_lost
        try:
            await super()._blocking_read(after, block)
        finally:
            self._gave_up = self.reads_lost > lost


MUTANTS.append(
    Mutant(
        "redis-stream-wait-never-rereads",
        "redis-stream",
        "a-dead-wakeup-is-replaced",
        "once a blocking read is lost, wait never reads the stream again: pickup falls back to the poll interval",
        (
            "tests/test_wakeup_loss.py::test_a_stream_wait_whose_connection_went_silent_reads_again",
            "chaos:dead-wakeup:wakeup-pickup",
        ),
        swap("scheduler", StreamNeverRereads),
    )
)
