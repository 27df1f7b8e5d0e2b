"""Mutants of the SQLite store: each a subclass whose one statement (or one step) drops a guarantee."""

from __future__ import annotations

import dataclasses
import sqlite3
from datetime import datetime, timedelta
from typing import Any

from without_durability import sqlite as store
from without_durability._values import Delivery, Pass, Recorded
from without_durability.errors import Contended, StoreError
from without_durability.rules import check_key
from without_durability.sqlite import SqliteCheckpointer, SqliteEffect, SqliteScheduler
from without_durability.sqlite.checkpointer import _fenced_unless
from without_durability.sqlite.connection import _EffectRaised
from without_durability.sqlite.schema import _micros

from ..testing.mutants import Mutant, swap
from . import LEASE_CLOCK_KILLERS


class RenewPastBudget(SqliteCheckpointer):
    """renew sets liveness to now + alive, without the min() that holds it under the budget."""

    async def renew(self, pass_: Pass) -> None:
        def job(cur: sqlite3.Cursor) -> None:
            row = cur.execute(
                "UPDATE claim SET alive_until = :now + alive_for"
                " WHERE workflow = :workflow AND token = :token RETURNING token",
                {"workflow": pass_.workflow, "token": pass_.token, "now": self._lease_now()},
            ).fetchone()
            _fenced_unless(row, pass_)

        await self.conn.write(job)


class LeasesOnWallClock(SqliteCheckpointer):
    """Measures claim deadlines on the wall clock, so a step of it lapses a live pass early (or
    keeps a dead one holding)."""

    def _lease_now(self) -> int:
        return _micros(self.clock())


class ClaimIgnoresRestart(SqliteCheckpointer):
    """The claim statement without its restart clause: after a reboot the monotonic clock starts
    again near zero, and a claim row written before it blocks its workflow for the old uptime."""

    CLAIM = store.CLAIM.replace(" OR claim.alive_until > :now + claim.alive_for", "")


class StampsBeforeTheLatest(SqliteCheckpointer):
    """Stamps each record with the wall clock as it reads, so a clock stepped back stamps a record
    before the one loaded ahead of it."""

    def _put(self, cur: sqlite3.Cursor, workflow: str, key: str, encoded: str, now: int) -> Recorded:
        got = super()._put(cur, workflow, key, encoded, now)
        if got.won:
            cur.execute(
                "UPDATE checkpoint SET written_at = :now WHERE workflow = :workflow AND key = :key",
                {"workflow": workflow, "key": key, "now": now},
            )
        return got


class RefusedWriteRenews(SqliteCheckpointer):
    """record renews the claim by workflow before it checks the token, so a superseded pass's stray
    write keeps the holder's claim alive."""

    async def record(self, pass_: Pass, key: str, value: object) -> Recorded:
        def job(cur: sqlite3.Cursor) -> None:
            cur.execute(
                "UPDATE claim SET alive_until = min(:now + alive_for, held_until) WHERE workflow = :workflow",
                {"workflow": pass_.workflow, "now": self._lease_now()},
            )

        await self.conn.write(job)
        return await super().record(pass_, key, value)


class SupplyGatedOnClaim(SqliteCheckpointer):
    """supply refuses (Contended) while a live pass holds the workflow."""

    async def supply(self, workflow: str, key: str, value: object) -> Recorded:
        def job(cur: sqlite3.Cursor) -> bool:
            row = cur.execute(
                "SELECT 1 FROM claim WHERE workflow = :w AND alive_until > :now",
                {"w": workflow, "now": self._lease_now()},
            ).fetchone()
            return row is not None

        if await self.conn.read(job):
            raise Contended(workflow)
        return await super().supply(workflow, key, value)


class StampsLosingWrites(SqliteCheckpointer):
    """A losing write keeps the winner's value but moves written_at to its own time."""

    def _put(self, cur: sqlite3.Cursor, workflow: str, key: str, encoded: str, now: int) -> Recorded:
        got = super()._put(cur, workflow, key, encoded, now)
        cur.execute(
            "UPDATE checkpoint SET written_at = :now WHERE workflow = :workflow AND key = :key",
            {"workflow": workflow, "key": key, "now": now},
        )
        return got


class DiscardDeletesClaim(SqliteCheckpointer):
    """discard deletes the claim row instead of raising its token, so the next claim mints token 1
    again and a pass in flight outranks it."""

    async def discard(self, workflow: str) -> None:
        def job(cur: sqlite3.Cursor) -> None:
            cur.execute(store.DISCARD_RECORDS, {"workflow": workflow})
            cur.execute("DELETE FROM claim WHERE workflow = :workflow", {"workflow": workflow})

        await self.conn.write(job)


class TransactCommitsSeparately(SqliteCheckpointer):
    """transact commits the effect in one transaction and records in another, so an effect whose
    pass was superseded (or whose record failed) is kept."""

    async def transact(self, pass_: Pass, key: str, effect: SqliteEffect) -> Recorded:
        names = {"workflow": pass_.workflow, "key": key, "token": pass_.token}

        def perform(cur: sqlite3.Cursor) -> object:
            stored = cur.execute(store.STORED, names).fetchone()
            if stored is not None:
                return Recorded(self.codec.decode(stored[0]), False)
            _fenced_unless(cur.execute(store.FENCE_HOLDS, names).fetchone(), pass_)
            try:
                return ("done", effect(cur))
            except Exception as exc:
                return ("raised", exc)

        outcome = await self.conn.write(perform)  # commits the effect on its own
        if isinstance(outcome, Recorded):
            return outcome
        assert isinstance(outcome, tuple)
        if outcome[0] == "raised":
            raise outcome[1]
        return await self.record(pass_, key, outcome[1])


class TransactEffectMayEndIt(SqliteCheckpointer):
    """transact runs its effect with no authorizer and no savepoint, checking only that a
    transaction is open afterwards: an effect that commits and begins again gets past it, and its
    write is kept with nothing recorded."""

    def _perform(self, cur: sqlite3.Cursor, effect: SqliteEffect, workflow: str, key: str) -> object:
        try:
            result = effect(cur)
        except BaseException as exc:
            raise _EffectRaised(exc) from exc
        if not cur.connection.in_transaction:
            raise StoreError(f"workflow {workflow!r}, key {key!r}: the effect ended the transaction")
        return result


class WakeReinstatesCancelled(SqliteScheduler):
    """wake_at writes its time whether or not the delivery is still queued, so a workflow cancelled
    while its pass ran comes back."""

    async def wake_at(self, delivery: Delivery, at: datetime | None) -> None:
        params = {
            "namespace": self.namespace,
            "workflow": delivery.workflow,
            "at": None if at is None else _micros(at),
        }

        def job(cur: sqlite3.Cursor) -> None:
            if at is None:
                cur.execute(store.CANCEL, params)
            else:
                cur.execute(
                    "INSERT INTO queue (namespace, workflow, visibility) VALUES (:namespace, :workflow, :at)"
                    " ON CONFLICT (namespace, workflow) DO UPDATE SET visibility = excluded.visibility",
                    params,
                )

        await self.conn.write(job)


MUTANTS = [
    Mutant(
        "sqlite-leases-on-wall-clock",
        "sqlite",
        "lease-clock",
        "claim deadlines on the wall clock, which a step (NTP, a resumed VM) moves",
        (
            *LEASE_CLOCK_KILLERS,
            "chaos:lease-stall:fencing",
            "chaos:clock-step:fencing",
            "sim:lease-stall:fencing",  # seeds 1, 3, 12, 14 of the gate's 24
        ),
        swap("checkpointer", LeasesOnWallClock),
    ),
    Mutant(
        "sqlite-renew-past-budget",
        "sqlite",
        "budget",
        "renew carries liveness past the budget",
        ("test_renew_never_passes_the_budget", "chaos:budget-overrun:fencing"),
        swap("checkpointer", RenewPastBudget),
    ),
    Mutant(
        "sqlite-claim-ignores-restart",
        "sqlite",
        "lease-clock",
        "a claim row from before a reboot blocks its workflow for the old uptime",
        (
            "tests/test_lease_clock.py::test_a_claim_from_before_the_lease_clock_restarted_is_free",
            "chaos:reboot:liveness",
            # a simulated reboot restarts the lease clock under the same file: every workflow
            # claimed before it stays refused for the old uptime
            "sim:lease-stall:liveness",
        ),
        swap("checkpointer", ClaimIgnoresRestart),
    ),
    Mutant(
        "sqlite-stamps-before-the-latest",
        "sqlite",
        "history-order",
        "a wall clock stepped back stamps a record before the one loaded ahead of it",
        (
            "tests/test_lease_clock.py::test_a_wall_clock_stepped_back_keeps_history_in_order",
            "chaos:lease-stall:order",
            "sim:lease-stall:order",  # seeds 3, 4, 10, 20, 21, 22 of the gate's 24
        ),
        swap("checkpointer", StampsBeforeTheLatest),
    ),
    Mutant(
        "sqlite-refused-write-renews",
        "sqlite",
        "refused-write-renews-nobody",
        "a fenced record still renews the holder's claim",
        ("test_refused_write_renews_nobody", "chaos:take-storm:lease-lapses"),
        swap("checkpointer", RefusedWriteRenews),
    ),
    Mutant(
        "sqlite-supply-gated-on-claim",
        "sqlite",
        "supply-not-gated",
        "supply refuses while a pass holds the claim",
        (
            "test_supply_works_while_a_pass_holds_the_claim",
            "chaos:budget-overrun:first-writer-wins",
            "sim:lease-stall:first-writer-wins",  # every seed
        ),
        swap("checkpointer", SupplyGatedOnClaim),
    ),
    Mutant(
        "sqlite-written-at-moves",
        "sqlite",
        "history-stamps-winner",
        "a losing write moves the record's written_at",
        ("test_history_stamps_the_winning_write_only", "chaos:lease-stall:order", "sim:lease-stall:order"),
        swap("checkpointer", StampsLosingWrites),
    ),
    Mutant(
        "sqlite-discard-deletes-claim",
        "sqlite",
        "discard-raises-fence",
        "discard deletes the claim row instead of raising the token",
        (
            "test_discard_raises_the_fence_and_leaves_the_id_claimable",
            "test_tokens_strictly_increase_across_discards",
            "chaos:take-storm:tokens-rise",
        ),
        swap("checkpointer", DiscardDeletesClaim),
    ),
    Mutant(
        "sqlite-transact-commits-separately",
        "sqlite",
        "exactly-once-transact",
        "transact commits the effect and the record in two transactions",
        (
            "test_transact_superseded_mid_effect_rolls_back",
            "test_transact_whose_effect_fails_rolls_back",
            "chaos:lease-stall:misuse",
            "chaos:lease-stall:exactly-once",
        ),
        swap("checkpointer", TransactCommitsSeparately),
    ),
    Mutant(
        "sqlite-transact-effect-may-end-it",
        "sqlite",
        "exactly-once-transact",
        "transact lets its effect COMMIT and BEGIN again: only in_transaction is checked after it",
        (
            "tests/test_sqlite.py::test_an_effect_that_ends_the_transaction_lands_nothing",
            "chaos:lease-stall:misuse",
            "chaos:lease-stall:exactly-once",
        ),
        swap("checkpointer", TransactEffectMayEndIt),
    ),
    Mutant(
        "sqlite-wake-reinstates-cancelled",
        "sqlite",
        "wake-at-respects-cancel",
        "wake_at reinstates a delivery cancelled since it was taken",
        (
            "test_wake_at_does_not_reinstate_a_cancelled_delivery",
            "chaos:take-storm:cancel-sticks",
            # a stale pass's wake_at moves a workflow's newer schedule: it is not run again in time
            "sim:lease-stall:liveness",  # 22 of seeds 0-29, seeds 1 and 2 among them
        ),
        swap("scheduler", WakeReinstatesCancelled),
    ),
]


# -- lifecycle (issue 14) -------------------------------------------------------------------


class LoadHidesLifecycle(SqliteCheckpointer):
    """load leaves out the ``wd/`` lifecycle records, so a finished or failed workflow looks open and
    runs its body again."""

    async def load(self, workflow: str) -> dict[str, object]:
        return {k: v for k, v in (await super().load(workflow)).items() if not k.startswith("wd/")}


MUTANTS.append(
    Mutant(
        "sqlite-load-hides-lifecycle",
        "sqlite",
        "lifecycle-visible",
        "load leaves out wd/ lifecycle records, so terminal workflows run again",
        (
            "test_lifecycle_records_are_written_through_the_store_and_loaded",
            "test_a_finished_workflow_records_its_result_and_never_runs_again",
            "test_maximum_attempts_runs_the_body_exactly_that_often_across_workers",
            "chaos:long-wait:attempt-limit",
            "sim:lease-stall:monotonic-loads",  # every seed: a finished workflow's load loses keys
        ),
        swap("checkpointer", LoadHidesLifecycle),
    )
)


# -- fencing (the chaos gate's broken store, once a --checkpointer-class of its own) ---------


class RecordWithoutFence(SqliteCheckpointer):
    """``record`` writes first-writer-wins but never asks whether a newer pass exists."""

    async def record(self, pass_: Pass, key: str, value: object) -> Recorded:
        check_key(pass_.workflow, key)
        encoded = self._encode(pass_.workflow, key, value)

        def job(cur: sqlite3.Cursor) -> Recorded:
            return self._put(cur, pass_.workflow, key, encoded, self._stamp())

        return await self.conn.write(job)


MUTANTS.append(
    Mutant(
        "sqlite-record-without-fence",
        "sqlite",
        "fencing",
        "record skips the fence check, so a superseded pass still writes",
        (
            "test_superseded_record_is_fenced_and_writes_nothing",
            "chaos:lease-stall:fencing",
            "sim:lease-stall:fencing",  # seeds 15, 21, 22 of the gate's 24
        ),
        swap("checkpointer", RecordWithoutFence),
    )
)


# -- power loss (issue 35) ------------------------------------------------------------------


class CommitWithoutFsync:
    """A ``wrap`` that turns the connection's ``synchronous`` off: every commit returns before its
    WAL frames reach the disk, which only a power loss (not a kill) can show."""

    def __call__(self, durable: Any) -> Any:
        conn = durable.checkpointer.conn
        conn._executor.submit(lambda: conn._require().execute("PRAGMA synchronous=OFF")).result()
        return durable


MUTANTS.append(
    Mutant(
        "sqlite-commit-without-fsync",
        "sqlite",
        "durability",
        "commits return before the WAL is fsynced (synchronous=OFF): a power loss drops acknowledged writes",
        ("chaos:power-loss:durability",),
        CommitWithoutFsync(),
    )
)


# -- the queue judged as hard as the records (issue 44) ---------------------------------------------


class AnswerIgnoresReceipt(SqliteScheduler):
    """wake_at acts on the workflow's row whatever its receipt: a superseded holder's late answer
    deletes or moves the delivery a newer take holds, and an answer removes a wakeup since."""

    async def wake_at(self, delivery: Delivery, at: datetime | None) -> None:
        params = {"namespace": self.namespace, "workflow": delivery.workflow}

        def job(cur: sqlite3.Cursor) -> None:
            if at is None:
                cur.execute(store.CANCEL, params)
            else:
                cur.execute(
                    "UPDATE queue SET visibility = :at WHERE namespace = :namespace AND workflow = :workflow",
                    {**params, "at": _micros(at)},
                )

        await self.conn.write(job)


class WakeupWhileHeldDropped(SqliteScheduler):
    """schedule leaves a queued row as it is, so a wakeup that lands while a delivery is held is
    dropped, and the holder's answer (done) then removes the workflow's only entry."""

    def _schedule_in(self, cur: sqlite3.Cursor, workflow: str, at: datetime | None) -> None:
        when = _micros(at if at is not None else self.clock())
        cur.execute(
            "INSERT INTO queue (namespace, workflow, visibility) VALUES (:namespace, :workflow, :at)"
            " ON CONFLICT (namespace, workflow) DO NOTHING",
            {"namespace": self.namespace, "workflow": workflow, "at": when},
        )


class ReceiptIsTheTimeAlone(SqliteScheduler):
    """A take's receipt is the time it hid the workflow until, alone, as it was before schema
    version 3: two takes whose visibilities end at the same instant (a take for 3u, a wakeup at u,
    a take for 2u) are handed one receipt, and the first holder's late answer acts on the second's
    delivery."""

    async def take(self, visibility: timedelta) -> Delivery | None:
        got = await super().take(visibility)
        if got is None:
            return None
        return Delivery(got.workflow, dataclasses.replace(got.receipt, took=0))  # type: ignore[type-var]

    async def wake_at(self, delivery: Delivery, at: datetime | None) -> None:
        receipt: Any = delivery.receipt
        params = {"namespace": self.namespace, "workflow": delivery.workflow, "taken": receipt.visible_at}
        statement = (store.statements.ANSWER_DONE if at is None else store.statements.ANSWER_AGAIN)
        params["at"] = None if at is None else _micros(at)
        await self.conn.write(lambda cur: cur.execute(statement.replace(" AND took = :took", ""), params))


MUTANTS += [
    Mutant(
        "sqlite-receipt-is-the-time-alone",
        "sqlite",
        "a-receipt-names-one-take",
        "a take's receipt is its hidden-until time alone, so two takes can be handed one receipt",
        (
            "test_two_takes_whose_visibilities_end_together_get_different_receipts",
            "sim:lease-stall:receipts-distinct",
        ),
        swap("scheduler", ReceiptIsTheTimeAlone),
        unseen_by_chaos=(
            "two takes must hide the workflow until the same microsecond: on a real clock a take for "
            "3u, a wakeup and a take for 2u almost never line up so exactly; sim's retake probe lines "
            "them up on its virtual clock (receipts-distinct)"
        ),
    ),
    Mutant(
        "sqlite-answer-ignores-receipt",
        "sqlite",
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
        "sqlite-wakeup-while-held-dropped",
        "sqlite",
        "wakeup-since-the-take-stands",
        "schedule of a queued (or held) workflow changes nothing, so a wakeup while held is lost",
        (
            "test_a_wakeup_while_held_survives_each_answer_kind",
            "chaos:lease-stall:wakeup-stands",
        ),
        swap("scheduler", WakeupWhileHeldDropped),
    ),
]
