"""Mutants of the Postgres store: each a subclass with one statement (or one transaction) changed.

The store reads its SQL from class attributes, so most mutants here are a single overridden
statement, written out in full so the difference from the real one can be read side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import psycopg

from without_durability._values import Pass, Recorded
from without_durability.errors import Fenced, InvalidInput, StoreError, StoreUnavailable
from without_durability.rules import INBOX_DIGITS, INBOX_PREFIX, lifecycle_writes
from without_durability.testing.mutants import Mutant, Swap, swap
from without_durability_postgres import PostgresCheckpointer, PostgresScheduler, PostgresWakeup
from without_durability_postgres._appends import AppendBatcher
from without_durability_postgres._boundary import connect, one_flight
from without_durability_postgres.checkpointer import CLAIM, PostgresEffect
from without_durability_postgres.scheduler import RECEIPT_HOLDS, TAKE_SETS

PG_TESTS = "tests/test_postgres.py"
AAT_TESTS = "tests/test_postgres_answer_and_take.py"


class RecordWithoutRowLock(PostgresCheckpointer):
    """record reads the fence with a plain SELECT from its snapshot, so a claim committing while
    the statement runs goes unseen and the superseded pass's write lands. (It still renews, in a
    statement of its own after the write, so only the lock is missing.)"""

    RECORD = """
WITH fence AS (
    SELECT workflow FROM workflow_claim WHERE workflow = %(workflow)s AND token = %(token)s
)
INSERT INTO workflow_checkpoint AS cp (workflow, key, value)
SELECT fence.workflow, %(key)s, %(value)s::jsonb FROM fence
ON CONFLICT (workflow, key) DO UPDATE SET value = cp.value
RETURNING cp.value::text, cp.value::text = %(value)s::jsonb::text
"""

    async def record(self, pass_: Pass, key: str, value: object) -> Recorded:
        got = await super().record(pass_, key, value)
        with contextlib.suppress(Fenced):
            await self.renew(pass_)
        return got


class RecordWithoutFence(PostgresCheckpointer):
    """record writes without looking at the token at all (and renews nobody)."""

    RECORD = """
INSERT INTO workflow_checkpoint AS cp (workflow, key, value)
VALUES (%(workflow)s, %(key)s, %(value)s::jsonb)
ON CONFLICT (workflow, key) DO UPDATE SET value = cp.value
RETURNING cp.value::text, cp.value::text = %(value)s::jsonb::text
"""


class ClaimWithoutLivenessWhere(PostgresCheckpointer):
    """The claim upsert's DO UPDATE has no WHERE, so a live claim is taken over."""

    CLAIM = """
INSERT INTO workflow_claim AS held (workflow, token, held_until, alive_until, alive_for)
VALUES (
    %(workflow)s, 1,
    now() + %(budget)s, LEAST(now() + %(alive)s, now() + %(budget)s), %(alive)s
)
ON CONFLICT (workflow) DO UPDATE
    SET token = held.token + 1,
        held_until = now() + %(budget)s,
        alive_until = LEAST(now() + %(alive)s, now() + %(budget)s),
        alive_for = %(alive)s
RETURNING token
"""


class RefusedWriteRenews(PostgresCheckpointer):
    """record's fence renews the claim by workflow and checks the token only afterwards, so a
    superseded pass's refused write keeps the holder alive."""

    RECORD = """
WITH fence AS (
    UPDATE workflow_claim
       SET alive_until = LEAST(now() + alive_for, held_until)
     WHERE workflow = %(workflow)s
    RETURNING workflow, token
)
INSERT INTO workflow_checkpoint AS cp (workflow, key, value)
SELECT fence.workflow, %(key)s, %(value)s::jsonb FROM fence WHERE fence.token = %(token)s
ON CONFLICT (workflow, key) DO UPDATE SET value = cp.value
RETURNING cp.value::text, cp.value::text = %(value)s::jsonb::text
"""


class AppendFromHighestSeq(PostgresCheckpointer):
    """append names its key from the highest seq already in the table instead of the sequence:
    two concurrent appends read the same maximum, and the loser's message vanishes into
    first-writer-wins without an error."""

    APPEND = f"""
WITH top AS (SELECT COALESCE(max(seq), 0) + 1 AS n FROM workflow_checkpoint)
INSERT INTO workflow_checkpoint AS cp (workflow, key, value, seq)
SELECT %(workflow)s, '{INBOX_PREFIX}' || lpad(top.n::text, {INBOX_DIGITS}, '0'),
       %(value)s::jsonb, nextval('workflow_seq')
  FROM top
ON CONFLICT (workflow, key) DO UPDATE SET value = cp.value
RETURNING key
"""


class AppendTwoCounters(PostgresCheckpointer):
    """append draws the key and the seq as two numbers, so concurrent appends can take them in
    opposite orders and key order stops matching load order. (A short random pause between the
    draws widens the race the way a busy server would.)"""

    APPEND = f"""
WITH k AS (SELECT nextval('workflow_seq') AS n),
     pause AS (SELECT pg_sleep(random() * 0.02) FROM k)
INSERT INTO workflow_checkpoint (workflow, key, value)
SELECT %(workflow)s, '{INBOX_PREFIX}' || lpad(k.n::text, {INBOX_DIGITS}, '0'), %(value)s::jsonb
  FROM k, pause
RETURNING key
"""


class SeqOutOfCommitOrder(PostgresCheckpointer):
    """Every insert draws its seq without taking the workflow's turn (the statements as they were
    before issue 13): concurrent writers of one workflow commit out of seq order, and a load between
    two commits shows a record before one that an earlier load returned."""

    RECORD = """
WITH fence AS (
    UPDATE workflow_claim
       SET alive_until = LEAST(now() + alive_for, held_until)
     WHERE workflow = %(workflow)s AND token = %(token)s
    RETURNING workflow
)
INSERT INTO workflow_checkpoint AS cp (workflow, key, value)
SELECT fence.workflow, %(key)s, %(value)s::jsonb FROM fence
ON CONFLICT (workflow, key) DO UPDATE SET value = cp.value
RETURNING cp.value::text, cp.value::text = %(value)s::jsonb::text
"""
    SUPPLY = """
INSERT INTO workflow_checkpoint AS cp (workflow, key, value)
VALUES (%(workflow)s, %(key)s, %(value)s::jsonb)
ON CONFLICT (workflow, key) DO UPDATE SET value = cp.value
RETURNING cp.value::text, cp.value::text = %(value)s::jsonb::text
"""
    APPEND = f"""
WITH drawn AS (SELECT nextval('workflow_seq') AS seq)
INSERT INTO workflow_checkpoint (workflow, key, value, seq)
SELECT %(workflow)s, '{INBOX_PREFIX}' || lpad(drawn.seq::text, {INBOX_DIGITS}, '0'),
       %(value)s::jsonb, drawn.seq
  FROM drawn
RETURNING key
"""
    TRANSACT_PUT = """
INSERT INTO workflow_checkpoint (workflow, key, value)
VALUES (%(workflow)s, %(key)s, %(value)s::jsonb)
ON CONFLICT (workflow, key) DO NOTHING
RETURNING value::text
"""


class StampsLosingWrites(PostgresCheckpointer):
    """A losing record or supply keeps the winner's value but moves written_at to now."""

    RECORD = PostgresCheckpointer.RECORD.replace(
        "DO UPDATE SET value = cp.value", "DO UPDATE SET value = cp.value, written_at = clock_timestamp()"
    )
    SUPPLY = PostgresCheckpointer.SUPPLY.replace(
        "DO UPDATE SET value = cp.value", "DO UPDATE SET value = cp.value, written_at = clock_timestamp()"
    )


class StampsTransactAtItsStart(PostgresCheckpointer):
    """transact's record is stamped with now(), the transaction's start, so a slow effect's record
    claims to have landed before its effect ran."""

    TRANSACT_PUT = """
INSERT INTO workflow_checkpoint (workflow, key, value, written_at)
VALUES (%(workflow)s, %(key)s, %(value)s::jsonb, now())
ON CONFLICT (workflow, key) DO NOTHING
RETURNING value::text
"""


class TransactCommitsSeparately(PostgresCheckpointer):
    """transact commits the effect in a transaction of its own, then records: a pass superseded
    meanwhile keeps its effect, as does one whose record fails."""

    async def transact(self, pass_: Pass, key: str, effect: PostgresEffect) -> Recorded:
        params: dict[str, Any] = {"workflow": pass_.workflow, "key": key, "token": pass_.token}
        async with connect(self.pool, "mutant transact", pass_.workflow, key) as conn:
            row = await (await conn.execute(self.LOOKUP, params)).fetchone()
            if row is not None:
                return Recorded(self.codec.decode(row[0]), False)
            row = await (await conn.execute(self.PEEK_FENCE, params)).fetchone()
            if row is None or int(row[0]) != pass_.token:
                raise Fenced(pass_.workflow, pass_.token)
            async with conn.cursor() as cursor:
                result = await effect(cursor)
        return await self.record(pass_, key, result)


class TransactWithoutGuard(PostgresCheckpointer):
    """transact opens no guard row around its effect, so nothing stops the effect's own COMMIT:
    an effect that commits and then fails keeps its write with nothing recorded (a retry runs it
    again). Only the client-side check that the transaction ended is left."""

    GUARD_OPEN = "SELECT %(nonce)s"
    GUARD_CLOSE = "SELECT %(nonce)s"


class TakeWithoutLock(PostgresScheduler):
    """take picks the next row with a plain SELECT (no FOR UPDATE SKIP LOCKED): two takers read the
    same row, and the second's UPDATE, re-checked after the first commits, still matches it."""

    TAKE = PostgresScheduler.TAKE.replace("\n     FOR UPDATE SKIP LOCKED", "")
    assert TAKE != PostgresScheduler.TAKE, "TAKE changed: the mutant no longer applies"


def _answer_and_take(answer: str, *, exclude_answered: bool = True, answer_first: bool = True) -> str:
    """An answer_and_take statement with ``answer`` as its first CTE, written out the long way."""
    return f"""
WITH answered AS (
{answer}
    RETURNING 1
), next AS (
    SELECT workflow FROM workflow_queue
     WHERE namespace = %(namespace)s AND visibility <= now()
       {"AND workflow <> %(workflow)s" if exclude_answered else ""}
       {"AND (SELECT count(*) FROM answered) >= 0" if answer_first else ""}
     ORDER BY visibility, workflow
     LIMIT 1
     FOR UPDATE SKIP LOCKED
)
UPDATE workflow_queue AS q
   SET {TAKE_SETS}
  FROM next
 WHERE q.namespace = %(namespace)s AND q.workflow = next.workflow
RETURNING q.workflow, q.visibility, q.took
"""


_FINISH = f"""    DELETE FROM workflow_queue
     WHERE namespace = %(namespace)s AND workflow = %(workflow)s{RECEIPT_HOLDS}"""
_WAKE_AT = f"""    UPDATE workflow_queue SET visibility = %(at)s
     WHERE namespace = %(namespace)s AND workflow = %(workflow)s{RECEIPT_HOLDS}"""


class AnswerAndTakeIgnoresReceipt(PostgresScheduler):
    """answer_and_take's answer acts on the workflow whatever its receipt: a stale answer removes or
    moves a newer delivery."""

    FINISH_AND_TAKE = _answer_and_take(_FINISH.replace(RECEIPT_HOLDS, ""))
    WAKE_AT_AND_TAKE = _answer_and_take(_WAKE_AT.replace(RECEIPT_HOLDS, ""))


class AnswerAndTakeHandsBackTheAnswered(PostgresScheduler):
    """answer_and_take's take may pick the workflow it is answering (one statement then writes the
    row twice, and the answer is lost)."""

    FINISH_AND_TAKE = _answer_and_take(_FINISH, exclude_answered=False)
    WAKE_AT_AND_TAKE = _answer_and_take(_WAKE_AT, exclude_answered=False)


class AnswerAndTakeLocksFirst(PostgresScheduler):
    """answer_and_take lets its take lock a row before its answer has finished waiting for one: two
    workers can deadlock."""

    FINISH_AND_TAKE = _answer_and_take(_FINISH, answer_first=False)
    WAKE_AT_AND_TAKE = _answer_and_take(_WAKE_AT, answer_first=False)


MUTANTS = [
    Mutant(
        "postgres-record-without-row-lock",
        "postgres",
        "fencing",
        "record reads the fence from its snapshot without locking the claim row",
        (
            f"{PG_TESTS}::test_claim_committing_mid_record_refuses_the_stale_record",
            "chaos:take-storm:stale-landing",
        ),
        swap("checkpointer", RecordWithoutRowLock),
    ),
    Mutant(
        "postgres-record-without-fence",
        "postgres",
        "fencing",
        "record ignores the token: a superseded pass's writes land",
        ("test_superseded_record_is_fenced_and_writes_nothing", "chaos:lease-stall:fencing"),
        swap("checkpointer", RecordWithoutFence),
    ),
    Mutant(
        "postgres-claim-without-liveness-where",
        "postgres",
        "exclusive-claim",
        "the claim upsert's DO UPDATE has no liveness WHERE",
        (
            "test_claim_live_is_contended",
            "test_exactly_one_of_concurrent_claims_wins",
            "chaos:lease-stall:fencing",
        ),
        swap("checkpointer", ClaimWithoutLivenessWhere),
    ),
    Mutant(
        "postgres-refused-write-renews",
        "postgres",
        "refused-write-renews-nobody",
        "record's fence renews by workflow before it checks the token",
        ("test_refused_write_renews_nobody", "chaos:take-storm:lease-lapses"),
        swap("checkpointer", RefusedWriteRenews),
    ),
    Mutant(
        "postgres-append-from-highest-seq",
        "postgres",
        "append-loses-nothing",
        "append names its key from the highest existing seq instead of the sequence",
        (
            "test_concurrent_appends_lose_nothing_and_agree_with_load",
            f"{PG_TESTS}::test_sixteen_parallel_appends_lose_nothing_and_sort_in_load_order",
            "chaos:append-storm:order",
        ),
        swap("checkpointer", AppendFromHighestSeq),
    ),
    Mutant(
        "postgres-append-two-counters",
        "postgres",
        "append-order",
        "append draws the key and the seq as two different numbers",
        (
            "test_concurrent_appends_lose_nothing_and_agree_with_load",
            f"{PG_TESTS}::test_sixteen_parallel_appends_lose_nothing_and_sort_in_load_order",
            "chaos:append-storm:order",
        ),
        swap("checkpointer", AppendTwoCounters),
    ),
    Mutant(
        "postgres-seq-out-of-commit-order",
        "postgres",
        "monotonic-loads",
        "inserts draw seq without the workflow's turn: commits land out of seq order",
        ("test_loads_only_grow_under_concurrent_writers_and_readers", "chaos:append-storm:monotonic-loads"),
        swap("checkpointer", SeqOutOfCommitOrder),
    ),
    Mutant(
        "postgres-written-at-moves",
        "postgres",
        "history-stamps-winner",
        "a losing write moves the record's written_at",
        ("test_history_stamps_the_winning_write_only", "chaos:lease-stall:order"),
        swap("checkpointer", StampsLosingWrites),
    ),
    Mutant(
        "postgres-transact-stamped-at-start",
        "postgres",
        "history-stamps-winner",
        "transact stamps its record with now() (transaction start), not when it landed",
        (
            f"{PG_TESTS}::test_slow_transact_renews_and_stamps_with_the_commit_time",
            "chaos:transact-stall:written-at",
        ),
        swap("checkpointer", StampsTransactAtItsStart),
    ),
    Mutant(
        "postgres-transact-commits-separately",
        "postgres",
        "exactly-once-transact",
        "transact commits the effect and the record separately",
        (
            "test_transact_superseded_mid_effect_rolls_back",
            "test_transact_whose_effect_fails_rolls_back",
            "chaos:transact-stall:exactly-once",
        ),
        swap("checkpointer", TransactCommitsSeparately),
    ),
    Mutant(
        "postgres-transact-without-guard",
        "postgres",
        "exactly-once-transact",
        "transact lets its effect COMMIT on its own: no guard row refuses the commit",
        (
            f"{PG_TESTS}::test_an_effect_that_ends_its_transaction_lands_nothing",
            "chaos:lease-stall:misuse",
            "chaos:lease-stall:exactly-once",
        ),
        swap("checkpointer", TransactWithoutGuard),
    ),
    Mutant(
        "postgres-take-without-lock",
        "postgres",
        "take-exclusive",
        "take can hand one delivery to two takers (no FOR UPDATE SKIP LOCKED)",
        ("test_concurrent_takes_never_share_a_delivery", "chaos:take-storm:take-exclusive"),
        swap("scheduler", TakeWithoutLock),
    ),
    Mutant(
        "postgres-answer-and-take-ignores-receipt",
        "postgres",
        "wake-at-acts-on-its-own-receipt",
        "answer_and_take answers whatever the row's receipt",
        ("test_a_stale_answer_and_take_leaves_the_newer_delivery_alone", "chaos:take-storm:own-receipt"),
        swap("scheduler", AnswerAndTakeIgnoresReceipt),
    ),
    Mutant(
        "postgres-answer-and-take-hands-back-the-answered",
        "postgres",
        "answer-then-take",
        "answer_and_take's take may pick the workflow it answers",
        ("test_answer_and_take_acts_only_while_its_receipt_is_current", "chaos:take-storm:answer-then-take"),
        swap("scheduler", AnswerAndTakeHandsBackTheAnswered),
    ),
    Mutant(
        "postgres-answer-and-take-locks-first",
        "postgres",
        "answer-and-take-never-deadlocks",
        "answer_and_take's take locks a row before its answer has waited (deadlock)",
        (f"{AAT_TESTS}::test_the_answer_waits_for_a_row_lock_before_the_take_locks_anything",),
        swap("scheduler", AnswerAndTakeLocksFirst),
        unseen_by_chaos="the take storm's probe calls answer_and_take, but the deadlock needs two calls' takes to lock before either's answer, inside one statement's microseconds: eight calls at once never deadlocked in 120 tries, so only the unit test's held row lock shows it",
    ),
]


# -- lifecycle (issue 14) -------------------------------------------------------------------


class ReservedKeysAccepted(PostgresCheckpointer):
    """record, supply and arrive let a caller write ``wd/`` keys, so a body or a client can forge a
    finished or failed workflow."""

    def _key(self, workflow: str, key: str) -> str:
        with lifecycle_writes():
            return super()._key(workflow, key)


MUTANTS.append(
    Mutant(
        "postgres-reserved-keys-accepted",
        "postgres",
        "reserved-keys",
        "record, supply and arrive accept wd/ lifecycle keys from callers",
        ("test_reserved_keys_are_refused_to_record_supply_and_arrive", "chaos:lease-stall:misuse"),
        swap("checkpointer", ReservedKeysAccepted),
    )
)


# -- clients as users write them (issue 29) ---------------------------------------------------


class _BatcherSendsCancelled(AppendBatcher):
    """The batcher as it was before issue 29: a batch is cut from its waiting callers only before
    it waits for a connection, so callers that time out while it waits are sent anyway."""

    async def _alone(self, waiting: Any) -> None:
        workflow, encoded, done = waiting
        try:
            key = await self._cp._append_alone(workflow, encoded)
        except Exception as exc:
            if not done.done():
                done.set_exception(exc)
        else:
            if not done.done():
                done.set_result(key)

    async def _together(self, batch: list[Any]) -> None:
        ordered = sorted(batch, key=lambda w: w[0])
        cp = self._cp
        try:
            async with one_flight(cp.pool, f"appending {len(ordered)} values together") as flight:
                cursors = [
                    await flight.conn.execute(cp.APPEND, {"workflow": workflow, "value": encoded})
                    for workflow, encoded, _ in ordered
                ]
            rows = [await c.fetchone() for c in cursors]
            keys = [str(row[0]) for row in rows if row is not None]
        except StoreUnavailable as exc:
            for _, _, done in ordered:
                if not done.done():
                    done.set_exception(exc)
            return
        except (StoreError, InvalidInput):
            for waiting in ordered:
                if not waiting[2].done():
                    await self._alone(waiting)
            return
        for (_, _, done), key in zip(ordered, keys, strict=True):
            if not done.done():
                done.set_result(key)


class AppendSendsCancelled(PostgresCheckpointer):
    """Group commit sends the appends of callers that gave up (timed out, cancelled) while their
    batch waited for a pooled connection: a caller that retries after its timeout appends twice."""

    @property  # a data descriptor: it wins over the instance's own _appends
    def _appends(self) -> AppendBatcher:
        batcher: AppendBatcher = self.__dict__["_appends"]
        batcher.__class__ = _BatcherSendsCancelled
        return batcher

    @_appends.setter
    def _appends(self, batcher: AppendBatcher) -> None:
        self.__dict__["_appends"] = batcher


def _unreachable_on_limits(method: Any) -> Any:
    async def mutated(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await method(self, *args, **kwargs)
        except InvalidInput as exc:
            cause = exc.__cause__
            if isinstance(cause, psycopg.Error) and (getattr(cause, "sqlstate", "") or "").startswith("54"):
                raise StoreUnavailable(f"Postgres could not be reached: {cause}") from cause
            raise

    return mutated


class LimitsReportedUnreachable(PostgresCheckpointer):
    """Input the server refuses for its limits (SQLSTATE class 54) is reported as
    ``StoreUnavailable``, as psycopg files it, instead of as a refusal of that input."""

    claim = _unreachable_on_limits(PostgresCheckpointer.claim)
    record = _unreachable_on_limits(PostgresCheckpointer.record)
    supply = _unreachable_on_limits(PostgresCheckpointer.supply)
    _append_alone = _unreachable_on_limits(PostgresCheckpointer._append_alone)


class TokenFromClaimRow(PostgresCheckpointer):
    """claim counts tokens on the claim row (1 for a new row), as before issue 29: once the sweep
    drops a lapsed row beside a pass still running, the next claim hands that pass's token out
    again."""

    CLAIM = """
INSERT INTO workflow_claim AS held (workflow, token, held_until, alive_until, alive_for)
VALUES (
    %(workflow)s, 1,
    now() + %(budget)s, LEAST(now() + %(alive)s, now() + %(budget)s), %(alive)s
)
ON CONFLICT (workflow) DO UPDATE
    SET token = held.token + 1,
        held_until = now() + %(budget)s,
        alive_until = LEAST(now() + %(alive)s, now() + %(budget)s),
        alive_for = %(alive)s
    WHERE held.alive_until <= now()
RETURNING token
"""


MUTANTS += [
    Mutant(
        "postgres-append-sends-cancelled",
        "postgres",
        "cancelled-calls",
        "group commit sends the appends of callers that timed out while their batch waited for a connection",
        (
            "tests/test_postgres_appends.py::test_callers_that_time_out_while_their_batch_waits_for_a_connection_append_nothing",
            "chaos:careless-clients:cancelled-calls",
        ),
        swap("checkpointer", AppendSendsCancelled),
    ),
    Mutant(
        "postgres-limits-reported-unreachable",
        "postgres",
        "errors-classified",
        "input over the server's limits (SQLSTATE 54) is reported as StoreUnavailable",
        (
            f"{PG_TESTS}::test_input_over_the_servers_limits_is_refused_not_unreachable",
            "chaos:careless-clients:errors-classified",
        ),
        swap("checkpointer", LimitsReportedUnreachable),
    ),
    Mutant(
        "postgres-token-from-claim-row",
        "postgres",
        "fencing-token",
        "claim counts tokens on the claim row, which the sweep may drop beside a running pass",
        (
            f"{PG_TESTS}::test_a_sweep_beside_a_renewing_pass_never_hands_its_token_out_again",
            "chaos:careless-clients:tokens-unique",
        ),
        swap("checkpointer", TokenFromClaimRow),
    ),
]


# -- a bad network (slow-network's half-open fault, judged by half-open-gives-up) ------------------

NETWORK_KILLERS = ("chaos:slow-network:half-open-gives-up",)


def postgres_without_timeouts(durable: Any) -> Any:
    """The pool's connections wait on the server for ever (psycopg's default): no read timeout on
    the pool's connection class, and no ``connect_timeout`` for the connections it opens."""
    pool = durable.pool
    if not hasattr(pool.connection_class, "read_timeout"):
        raise TypeError(f"{pool.connection_class.__name__} has no read timeout to take away")
    pool.connection_class.read_timeout = None  # the class is this pool's own (timed_connections)
    pool.kwargs.pop("connect_timeout", None)
    return durable


MUTANTS += [
    Mutant(
        "postgres-pool-waits-for-ever",
        "postgres",
        "calls-give-up",
        "the pool's connections have no read or connect timeout: a call on a half-open connection hangs",
        NETWORK_KILLERS,
        postgres_without_timeouts,
    ),
]


# -- mixed fleets (issue #45): a plain claim must not keep a previous holder's owner ---------------


class PlainClaimKeepsOwner(PostgresCheckpointer):
    """A claim made without fast failover takes the row over and leaves ``owner`` as the last
    fast-failover holder set it. Once that worker's presence ends, a fast-failover claim takes the
    plain worker's live pass over, and a reaping take lapses it and hands its delivery out. The
    class's CLAIM differs from the real one, so ``take_and_claim`` claims through it too."""

    CLAIM = CLAIM.replace(",\n        owner = NULL\n", "\n")


class ReapTakesOwnerlessClaims(PostgresScheduler):
    """A reaping take reads a live claim with no owner as one whose owner is gone: in a fleet with
    fast failover alone nearly every claim has an owner, but beside plain workers (whose claims
    carry none) each reaping take lapses their live passes and hands their deliveries out."""

    REAP = PostgresScheduler.REAP.replace(
        "WHERE held.owner IS NOT NULL AND held.alive_until > now() AND ",
        "WHERE held.alive_until > now() AND held.owner IS NULL OR ",
    )
    assert REAP != PostgresScheduler.REAP, "REAP changed: the mutant no longer applies"


# -- the queue judged as hard as the records (issue 44) ---------------------------------------------


class AnswerIgnoresReceipt(PostgresScheduler):
    """wake_at acts on the workflow's row whatever its visibility (its receipt): a superseded
    holder's late answer deletes or moves the delivery a newer take holds."""

    FINISH = _FINISH.replace(RECEIPT_HOLDS, "")
    WAKE_AT = _WAKE_AT.replace(RECEIPT_HOLDS, "")


class WakeupWhileHeldDropped(PostgresScheduler):
    """schedule leaves a queued row as it is, so a wakeup that lands while a delivery is held is
    dropped and the holder's answer removes the workflow's only entry."""

    SCHEDULE = """
INSERT INTO workflow_queue AS q (namespace, workflow, visibility)
VALUES (%(namespace)s, %(workflow)s, COALESCE(%(at)s::timestamptz, now()))
ON CONFLICT (namespace, workflow) DO NOTHING
"""


MUTANTS += [
    Mutant(
        "postgres-plain-claim-keeps-owner",
        "postgres",
        "mixed-fleet",
        "a claim without fast failover keeps the last fast-failover holder's owner: its live pass is taken over once that worker is gone",
        (
            "tests/test_postgres_failover.py::test_a_plain_claim_does_not_inherit_the_last_fast_failover_holders_owner",
            "chaos:mixed-fleet:fencing",
            "chaos:mixed-fleet:take-exclusive",
        ),
        swap("checkpointer", PlainClaimKeepsOwner),
    ),
    Mutant(
        "postgres-reap-takes-ownerless-claims",
        "postgres",
        "mixed-fleet",
        "a reaping take reads a claim with no owner (a plain worker's) as one whose owner is gone: it lapses live plain passes",
        (
            "tests/test_postgres_failover.py::test_a_reaping_take_leaves_a_plain_workers_live_claim_alone",
            "chaos:mixed-fleet:fencing",
            "chaos:mixed-fleet:take-exclusive",
        ),
        swap("scheduler", ReapTakesOwnerlessClaims),
    ),
    Mutant(
        "postgres-answer-ignores-receipt",
        "postgres",
        "wake-at-acts-on-its-own-receipt",
        "wake_at acts by workflow, without checking that its receipt is still current",
        (
            "test_stale_delivery_cannot_answer_for_a_newer_take",
            "chaos:lease-stall:stale-answer",
            "chaos:lease-stall:wakeup-stands",
        ),
        swap("scheduler", AnswerIgnoresReceipt),
    ),
    Mutant(
        "postgres-wakeup-while-held-dropped",
        "postgres",
        "wakeup-since-the-take-stands",
        "schedule of a queued (or held) workflow changes nothing, so a wakeup while held is lost",
        ("test_a_wakeup_while_held_survives_each_answer_kind", "chaos:lease-stall:wakeup-stands"),
        swap("scheduler", WakeupWhileHeldDropped),
    ),
]


class WakeupNeverResubscribes(PostgresWakeup):
    """The LISTEN connection, once lost (an error, or its health check unanswered), is closed and
    never replaced: every waiter falls back to its poll interval for good, with no error anywhere."""

    async def _lost(self, conn: psycopg.AsyncConnection[Any] | None, exc: Exception) -> None:
        with contextlib.suppress(Exception):
            if conn is not None:
                await conn.close()
        self._conn = None
        await asyncio.Event().wait()  # the reader stays here until close() cancels it


class _SwapWakeup(Swap):
    """A ``Swap`` of the durable's ``wakeup`` (a ``PostgresWakeup`` the chaos kit opened with
    ``spec["wakeup"]``); a durable without one (the controller's, a test's) is left as it is."""

    def __call__(self, durable: Any) -> Any:
        if getattr(durable, self.part, None) is None:
            return durable
        return super().__call__(durable)


MUTANTS.append(
    Mutant(
        "postgres-wakeup-never-resubscribes",
        "postgres",
        "a-dead-wakeup-is-replaced",
        "the LISTEN connection, once lost, is never replaced: pickup falls back to the poll interval",
        (
            "tests/test_wakeup_loss.py::test_a_postgres_listener_whose_connection_went_silent_listens_again",
            "chaos:dead-wakeup:wakeup-pickup",
        ),
        _SwapWakeup("wakeup", WakeupNeverResubscribes),
    )
)
