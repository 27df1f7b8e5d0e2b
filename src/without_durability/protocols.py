"""The two interfaces a store implements, and the bundle that names the transitions across them.

These are ``Protocol`` classes: a third-party store satisfies them without inheriting, and the
conformance suite (``without_durability.testing``) is what holds it to the contract.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Never, Protocol, runtime_checkable

from typing_extensions import TypeVar

from ._values import Delivery, Entry, Pass, Recorded

Effect = TypeVar("Effect", contravariant=True, default=Never)
"""What a store can commit together with a record. Defaults to ``Never``: on a store with nothing
to offer, ``transact`` cannot be called, while code that never transacts writes the bare
``Checkpointer`` and accepts every store."""


class Checkpointer(Protocol[Effect]):
    """What a workflow has done, and who may write it.

    Every guarantee below is the store's, decided by the store's clock (server time on Postgres and
    Redis, the process clock, injectable for tests, on SQLite and Memory).
    """

    async def claim(self, workflow: str, *, alive: timedelta, budget: timedelta) -> Pass:
        """Take an exclusive pass, or raise ``Contended`` while another pass is alive.

        The claim carries two deadlines: liveness ``min(now+alive, now+budget)``, which renewals move,
        and the budget ``now+budget``, which nothing lifts. The token is above every token issued
        for this workflow before.
        """
        ...

    async def renew(self, pass_: Pass) -> None:
        """Sign of life: liveness becomes ``min(now+alive, budget)``, never past the budget.
        Raises ``Fenced`` if a newer pass exists."""
        ...

    async def release(self, pass_: Pass) -> None:
        """End the pass: its budget (and so its liveness) comes down to now, so the workflow is
        claimable at once and a later ``renew`` cannot revive it. A superseded pass releases nothing."""
        ...

    async def record(self, pass_: Pass, key: str, value: object) -> Recorded:
        """Record ``value`` under ``key`` if nothing is recorded there yet, under the fence.

        Raises ``Fenced`` (writing nothing and renewing nobody) if a newer pass exists. First writer
        wins: the result carries what the store holds. An accepted write is itself a renewal.
        """
        ...

    async def supply(self, workflow: str, key: str, value: object) -> Recorded:
        """Record from outside a pass: not gated on the claim, first writer wins."""
        ...

    async def append(self, workflow: str, value: object) -> str:
        """Record ``value`` under a key the store names, and return the key.

        Concurrent appends get distinct keys and none is lost; keys (``inbox/`` and a zero-padded
        number) sort as strings in append order within the workflow; the key's number and the
        entry's load position are one number, so the two orders cannot disagree.
        """
        ...

    async def load(self, workflow: str) -> dict[str, object]:
        """Every record, decoded, in the order each key was first recorded."""
        ...

    async def history(self, workflow: str) -> list[Entry]:
        """What ``load`` returns, in the same order, with the store-clock time of each winning write."""
        ...

    async def discard(self, workflow: str) -> None:
        """Forget every record and raise the fencing token (the claim row stays): a pass in flight
        is refused at its next write, and the workflow can be claimed at once."""
        ...

    async def transact(self, pass_: Pass, key: str, effect: Effect) -> Recorded:
        """Exactly once: perform ``effect`` and record its result under ``key`` in one commit.

        If ``key`` is already recorded, returns it and performs nothing. A superseded pass performs
        nothing (``Fenced``); a pass superseded while the effect runs is refused and the effect rolls
        back with the commit.
        """
        ...


class Scheduler(Protocol):
    """When a workflow may run: a queue of workflows scored by the moment each becomes visible."""

    async def now(self) -> datetime:
        """The store's clock, the one visibility is measured by."""
        ...

    async def schedule(self, workflow: str, at: datetime | None = None) -> None:
        """Make ``workflow`` runnable no later than ``at`` (default: now). The earlier of the time
        already queued and ``at`` wins."""
        ...

    async def take(self, visibility: timedelta) -> Delivery | None:
        """Hand out a visible workflow and hide it for ``visibility``, so a dead worker's delivery
        reappears. Two concurrent takes never get the same delivery. ``None`` when nothing is due."""
        ...

    async def wake_at(self, delivery: Delivery, at: datetime | None) -> None:
        """Answer for ``delivery`` in one call: its next visibility becomes ``at``, or it is removed
        when ``at`` is None; unless a wakeup arrived since it was taken (that one stands) or it was
        cancelled since (it is not reinstated)."""
        ...

    async def cancel(self, workflow: str) -> None:
        """Remove ``workflow`` from the queue."""
        ...


@runtime_checkable
class AnswersAndTakes(Protocol):
    """An optional ``Scheduler`` capability: answer one delivery and take the next in one call,
    which a store may do in one round trip and one commit. ``Worker`` uses it when its scheduler
    has it; a store without it loses nothing (the worker makes the two calls)."""

    async def answer_and_take(
        self, delivery: Delivery, at: datetime | None, visibility: timedelta
    ) -> Delivery | None:
        """``wake_at(delivery, at)`` then ``take(visibility)``, with every guarantee of those two
        calls made in that order, except that the take never hands back ``delivery``'s own
        workflow (a workflow answered as due now is left for the next take). If it raises, the
        answer may or may not have been applied: answering the same delivery again is harmless,
        since an answer acts only while the queue still holds what this delivery's take set."""
        ...


@runtime_checkable
class TakesAndClaims(Protocol):
    """An optional ``Durable`` capability: take, claim what was taken and load its records in one
    call, which a store may do with one commit instead of two (and fewer round trips): what stands
    between a wakeup and a pass starting. ``Worker`` uses it for a take that carries no answer,
    when its durable has it; a store without it loses nothing (the worker makes the three calls)."""

    async def take_and_claim(
        self, visibility: timedelta, *, alive: timedelta, budget: timedelta
    ) -> tuple[Delivery, Pass | None, dict[str, object]] | None:
        """``take(visibility)``; then, for a delivery, ``checkpointer.claim(its workflow, alive=,
        budget=)`` and, if that claimed, ``checkpointer.load(its workflow)``, with every guarantee
        of those calls made in that order (the load sees every record committed before the claim
        succeeded). None when nothing was due; else the delivery, its pass (None where ``claim``
        would raise ``Contended``, or would have to wait for a transaction in flight on the
        workflow's claim; the take stands) and the records (empty without a pass). If
        it raises, the take and the claim may or may not have happened, as when those calls
        raise: the delivery reappears once ``visibility`` lapses, a claim frees after ``alive``.

        A store whose pass may be None for a busy claim row can also offer
        ``take_and_claim_busy``: the same call, its result followed by a bool, True where no
        claim was tried for that reason (see ``PostgresDurable``). wd-chaos reads a None pass as a
        refusal, evidence that a pass was alive, only where the store says so."""
        ...


class Durable(Protocol[Effect]):
    """A checkpointer and a scheduler, with the transitions across them named, so a caller cannot
    hold a recorded-but-unqueued workflow."""

    @property
    def checkpointer(self) -> Checkpointer[Effect]:
        """The checkpointer half."""
        ...

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler half."""
        ...

    async def arrive(self, workflow: str, key: str, value: object) -> Recorded:
        """Supply ``value`` under ``key`` and make the workflow runnable now."""
        ...

    async def deliver(self, workflow: str, message: object) -> str:
        """Append ``message`` and make the workflow runnable now; returns the inbox key."""
        ...

    async def discard(self, workflow: str) -> None:
        """Forget the workflow's records (raising its fence) and remove it from the queue."""
        ...
