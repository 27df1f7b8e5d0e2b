"""A reference model of the store contract, written apart from every store: the model test's oracle.

Plain dicts and plain functions: no locks, no clock objects, no codec objects, nothing shared with
the Memory store (which is itself judged against this model). Time is a ``timedelta`` since the
model began, moved only by ``advance``. Values are kept as their canonical JSON text, which is what
makes ``1`` and ``1.0`` two values and a tuple and a list one. Each method is one atomic step and
either returns the contract's result or raises ``Fenced``/``Contended``.

What it models (DESIGN.md's contract, for one process on a clock that only moves forward):

- a claim is free when there is none or its liveness has passed (equal to now counts as passed);
  a new claim's token is one above the last (tokens survive a discard); liveness starts at the
  shorter of its window and its budget;
- a pass is current while its token is the claim's; renew, record and transact of a pass that is
  not current are refused (``Fenced``) and change nothing; release of one changes nothing;
- renew, and every accepted record or transact, sets liveness to now plus its window, never past
  the budget (nor past a release, which lowered the budget to now);
- the first write of a key wins: later writes change nothing and learn whether their value was
  the stored one; ``supply`` writes without a pass; ``append`` adds a record under a fresh key;
- ``load`` returns a workflow's records in the order first written; ``discard`` forgets them,
  raises the fence and frees the claim;
- ``transact`` on a stored key returns it and performs nothing (even for a superseded pass); else
  a superseded pass is refused before its effect; else the effect's result is recorded;
- the queue keeps one visibility per workflow: ``schedule`` keeps the earlier time; a take hides
  a visible workflow until now plus its visibility, and its receipt is that time with the count
  of the workflow's wakeups so far; ``wake_at`` acts only while the entry still holds its receipt's
  time and no wakeup came since (a wakeup or cancel since stands, even one that left the time
  alone because the entry's own was earlier, as after the delivery's visibility ran out).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .._values import Pass, Recorded
from ..errors import Contended, Fenced

ZERO = timedelta(0)


def canonical(value: object) -> str:
    """``value``'s canonical JSON text: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


Receipt = tuple[timedelta, int]
"""A take's receipt in the model: the time it hid the workflow until, and the workflow's wakeup
count then."""

class Reference:
    """The whole contract's state for any number of workflows and one queue."""

    def __init__(self) -> None:
        self.now = ZERO
        # workflow -> [token, held_until, alive_until, alive_for]
        self.claims: dict[str, list[Any]] = {}
        # workflow -> key -> canonical JSON text, in first-written order
        self.records: dict[str, dict[str, str]] = {}
        self.ledger: dict[str, int] = {}
        self.queue: dict[str, timedelta] = {}
        self.wakeups: dict[str, int] = {}  # schedules per workflow: a receipt is stale after one
        self.appended = 0

    def advance(self, by: timedelta) -> None:
        """Move time forward."""
        self.now += by

    # -- claims ------------------------------------------------------------------------------

    def claim(self, workflow: str, alive: timedelta, budget: timedelta) -> Pass:
        """A pass, or ``Contended`` while a live claim holds the workflow."""
        held = self.claims.get(workflow)
        if held is not None and held[2] > self.now:
            raise Contended(workflow)
        token = held[0] + 1 if held is not None else 1
        self.claims[workflow] = [token, self.now + budget, self.now + min(alive, budget), alive]
        return Pass(workflow, token)

    def _current(self, pass_: Pass) -> list[Any]:
        held = self.claims.get(pass_.workflow)
        if held is None or held[0] != pass_.token:
            raise Fenced(pass_.workflow, pass_.token)
        return held

    def _extend(self, held: list[Any]) -> None:
        held[2] = min(self.now + held[3], held[1])

    def renew(self, pass_: Pass) -> None:
        """Extend the pass's liveness, or ``Fenced``."""
        self._extend(self._current(pass_))

    def release(self, pass_: Pass) -> None:
        """End the pass now, if it is current; else nothing."""
        held = self.claims.get(pass_.workflow)
        if held is not None and held[0] == pass_.token:
            held[1] = min(held[1], self.now)
            held[2] = min(held[2], self.now)

    def discard(self, workflow: str) -> None:
        """Forget the records, fence every pass, free the claim, drop the queue entry."""
        self.records.pop(workflow, None)
        self.queue.pop(workflow, None)
        held = self.claims.get(workflow)
        if held is not None:
            held[0] += 1
            held[1] = min(held[1], self.now)
            held[2] = min(held[2], self.now)

    # -- records -----------------------------------------------------------------------------

    def _write(self, workflow: str, key: str, value: object) -> Recorded:
        text = canonical(value)
        kept = self.records.setdefault(workflow, {}).setdefault(key, text)
        return Recorded(json.loads(kept), kept == text)

    def record(self, pass_: Pass, key: str, value: object) -> Recorded:
        """First write wins, for a current pass (which this renews); else ``Fenced``."""
        self._extend(self._current(pass_))
        return self._write(pass_.workflow, key, value)

    def supply(self, workflow: str, key: str, value: object) -> Recorded:
        """First write wins, with no pass."""
        return self._write(workflow, key, value)

    def append(self, workflow: str, value: object) -> str:
        """A record under a fresh key (this model's own; the test maps it to the store's)."""
        self.appended += 1
        key = f"appended-{self.appended}"
        self._write(workflow, key, value)
        return key

    def load(self, workflow: str) -> dict[str, object]:
        """The workflow's records in first-written order."""
        return {k: json.loads(v) for k, v in self.records.get(workflow, {}).items()}

    def transact(self, pass_: Pass, key: str, effect: Callable[[dict[str, int]], object]) -> Recorded:
        """See the module docstring; ``effect`` moves a copy of the ledger, kept only if recorded."""
        stored = self.records.get(pass_.workflow, {}).get(key)
        if stored is not None:
            return Recorded(json.loads(stored), False)
        held = self._current(pass_)
        scratch = copy.deepcopy(self.ledger)
        result = effect(scratch)
        self._extend(held)
        self.ledger = scratch
        return self._write(pass_.workflow, key, result)

    # -- queue -------------------------------------------------------------------------------

    def schedule(self, workflow: str, at: timedelta | None = None) -> None:
        """Visible at ``at`` (default now), or earlier if already so."""
        when = self.now if at is None else at
        self.queue[workflow] = min(self.queue.get(workflow, when), when)
        self.wakeups[workflow] = self.wakeups.get(workflow, 0) + 1

    def visible(self) -> list[str]:
        """The workflows a take may hand out now."""
        return sorted(w for w, at in self.queue.items() if at <= self.now)

    def take(self, workflow: str, visibility: timedelta) -> Receipt:
        """Hide ``workflow`` (which must be visible) for ``visibility``; its receipt."""
        assert workflow in self.visible(), f"{workflow} is not visible"
        self.queue[workflow] = self.now + visibility
        return (self.queue[workflow], self.wakeups.get(workflow, 0))

    def wake_at(self, workflow: str, receipt: Receipt, at: timedelta | None) -> None:
        """Answer a take: remove (``at`` None) or move the entry, if it still holds ``receipt``."""
        hidden, wakeups = receipt
        if self.queue.get(workflow) != hidden or self.wakeups.get(workflow, 0) != wakeups:
            return
        if at is None:
            del self.queue[workflow]
        else:
            self.queue[workflow] = at

    def cancel(self, workflow: str) -> None:
        """Drop the queue entry."""
        self.queue.pop(workflow, None)
