"""Mutants of the SQLite store: each puts back one statement the seeds argue against."""

from __future__ import annotations

import sqlite3
from datetime import timedelta

from without_durability._values import Pass, Recorded
from without_durability.errors import Contended, Fenced
from without_durability.rules import check_key, check_lease, check_workflow
from without_durability.sqlite import (
    FENCE_AND_RENEW,
    STORED,
    SqliteCheckpointer,
    SqliteEffect,
    _micros,
    _span,
)

from . import Mutant, swap

# The claim upsert without its WHERE: a conflicting row is always taken over.
_CLAIM_ALWAYS = """
INSERT INTO claim (workflow, token, held_until, alive_until, alive_for)
VALUES (:workflow, 1, :held_until, :alive_until, :alive_for)
ON CONFLICT (workflow) DO UPDATE
    SET token = claim.token + 1, held_until = excluded.held_until,
        alive_until = excluded.alive_until, alive_for = excluded.alive_for
RETURNING token
"""


class ClaimIgnoresLiveness(SqliteCheckpointer):
    """Claims a workflow whether or not a live pass holds it."""

    async def claim(self, workflow: str, *, alive: timedelta, budget: timedelta) -> Pass:
        check_workflow(workflow)
        check_lease(workflow, alive, budget)

        def job(cur: sqlite3.Cursor) -> int | None:
            now = _micros(self.clock())
            row = cur.execute(_CLAIM_ALWAYS, {
                "workflow": workflow, "held_until": now + _span(budget),
                "alive_until": now + min(_span(alive), _span(budget)), "alive_for": _span(alive),
            }).fetchone()
            return None if row is None else int(row[0])

        token = await self.conn.write(job)
        if token is None:
            raise Contended(workflow)
        return Pass(workflow, token)


class DiscardDeletesFence(SqliteCheckpointer):
    """Discard deletes the claim row, so the next claim restarts at token 1 and a pass in flight
    outranks it."""

    async def discard(self, workflow: str) -> None:
        check_workflow(workflow)

        def job(cur: sqlite3.Cursor) -> None:
            cur.execute("DELETE FROM checkpoint WHERE workflow = ?", (workflow,))
            cur.execute("DELETE FROM claim WHERE workflow = ?", (workflow,))

        await self.conn.write(job)


class StampsEveryWrite(SqliteCheckpointer):
    """A losing write keeps the winner's value but moves its ``written_at`` to now."""

    def _put(
        self, cur: sqlite3.Cursor, workflow: str, key: str, encoded: str, now: int
    ) -> Recorded:
        got = super()._put(cur, workflow, key, encoded, now)
        cur.execute(
            "UPDATE checkpoint SET written_at = ? WHERE workflow = ? AND key = ?",
            (now, workflow, key),
        )
        return got


class RefusedWriteRenews(SqliteCheckpointer):
    """Record renews the workflow's claim before checking the token, so a superseded pass's stray
    writes keep the holder alive."""

    async def record(self, pass_: Pass, key: str, value: object) -> Recorded:
        def renew_whoever_holds(cur: sqlite3.Cursor) -> None:
            cur.execute(
                "UPDATE claim SET alive_until = min(? + alive_for, held_until) WHERE workflow = ?",
                (self._now(), pass_.workflow),
            )

        await self.conn.write(renew_whoever_holds)
        return await super().record(pass_, key, value)


class TransactSkipsRefence(SqliteCheckpointer):
    """Transact checks the fence before the effect only, so a pass superseded while its effect ran
    still commits the effect and the record."""

    async def transact(self, pass_: Pass, key: str, effect: SqliteEffect) -> Recorded:
        check_key(pass_.workflow, key)
        names = {"workflow": pass_.workflow, "key": key, "token": pass_.token}

        def job(cur: sqlite3.Cursor) -> Recorded:
            stored = cur.execute(STORED, names).fetchone()
            if stored is not None:
                return Recorded(self.codec.decode(stored[0]), False)
            if cur.execute(FENCE_AND_RENEW, {**names, "now": self._now()}).fetchone() is None:
                raise Fenced(pass_.workflow, pass_.token)
            encoded = self._encode(pass_.workflow, key, effect(cur))
            return self._put(cur, pass_.workflow, key, encoded, self._now())

        return await self.conn.write(job)


MUTANTS = [
    Mutant(
        "sqlite-claim-ignores-liveness",
        "sqlite",
        "exclusive claim",
        "the claim upsert has no WHERE, so a live pass is taken over",
        (
            "test_claim_live_is_contended",
            "test_exactly_one_of_concurrent_claims_wins",
            "test_store_agrees_with_memory_model",
        ),
        swap("checkpointer", ClaimIgnoresLiveness),
    ),
    Mutant(
        "sqlite-discard-deletes-fence",
        "sqlite",
        "fencing across discard",
        "discard deletes the claim row instead of raising its token",
        (
            "test_discard_raises_the_fence_and_leaves_the_id_claimable",
            "test_tokens_strictly_increase_across_discards",
        ),
        swap("checkpointer", DiscardDeletesFence),
    ),
    Mutant(
        "sqlite-stamps-every-write",
        "sqlite",
        "history time",
        "every write, losing ones included, moves the key's written_at",
        ("test_history_stamps_the_winning_write_only", "test_store_agrees_with_memory_model"),
        swap("checkpointer", StampsEveryWrite),
    ),
    Mutant(
        "sqlite-refused-write-renews",
        "sqlite",
        "fencing",
        "record renews the claim before it checks the token",
        ("test_refused_write_renews_nobody",),
        swap("checkpointer", RefusedWriteRenews),
    ),
    Mutant(
        "sqlite-transact-skips-refence",
        "sqlite",
        "exactly-once transact",
        "transact checks the fence before its effect only, not again after it",
        ("test_transact_superseded_mid_effect_rolls_back",),
        swap("checkpointer", TransactSkipsRefence),
    ),
]
