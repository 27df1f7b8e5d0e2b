"""``SimulatedStore``: a store as a deterministic simulator (``wd-chaos sim``) holds it, opened by
its kit's ``StoreKit.open_simulated`` (kits that provide ``simulated``).

A simulator runs every caller (workers, writers, readers) in one process on one seeded event
loop, on clocks it hands the store. Beyond the store's own interfaces (``durable``) it asks five
things of it (and a sixth, optional: ``scheduler_in``, a queue in another namespace), each answered
by the store's own package, which alone may look inside the store:

- ``ledger_effect`` and ``ledger_rows``: the in-store ledger a ``transact`` appends to, and what
  it holds (the checkers' evidence of an effect committed with its record);
- ``peek``: a workflow's records looked at without a step of the loop (no process makes a call),
  so the simulator can tell whether a call cancelled inside the store left anything behind;
- ``reboot``: the simulated machine rebooted (the processes of before have crashed); what the
  store keeps across it (its file) the processes started from now on find through ``durable``;
- ``close``: release everything (files, folders), once the run is over.

This module imports nothing of any store or of the harness.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

LedgerEffect = Callable[[Any], object]
"""A ``transact`` effect in the store's own form (a function of its state, a cursor...)."""

Wrap = Callable[[Any], Any]
"""Turns a fresh ``Durable`` into another (a catalogue mutant's ``wrap``)."""


class SimulatedStore(abc.ABC):
    """A store in a simulated run (see the module docstring). Subclass it in the store's kit and
    give it the three abstract methods; a subclass missing one cannot be made (TypeError names
    it), so a kit finds out when it opens its simulated store, not mid-run."""

    durable: Any
    """The store as a process started now opens it (after the latest ``reboot``), a mutant's
    ``wrap`` applied."""

    @abc.abstractmethod
    def ledger_effect(self, workflow: str, key: str, token: int) -> LedgerEffect:
        """A ``transact`` effect that appends one ledger row ``(workflow, key, token)`` in the
        store's own data, inside the transaction, and returns ``{"row": ..., "token": token}``."""

    @abc.abstractmethod
    def ledger_rows(self) -> list[dict[str, Any]]:
        """Every ledger row (``row``, ``workflow``, ``key``, ``token``), in order, read at once."""

    @abc.abstractmethod
    def peek(self, workflow: str, key: str | None) -> tuple[int, bool]:
        """How many records ``workflow`` holds, and whether it holds ``key`` (False for None),
        read at once: no step of the loop, no call a process could see."""

    def scheduler_in(self, namespace: str) -> Any:
        """The store's ``Scheduler`` in another ``namespace``: a queue of its own, which no worker
        of the run takes from, on the run's clocks and with the mutant's ``wrap`` applied; or None
        (the default) for a store with one queue. The simulator's retake probe uses it to make two
        takes' visibilities end at the same instant on the virtual clock and see whether their
        receipts differ (``receipts-distinct``); without it that probe does not run."""
        del namespace
        return None

    def reboot(self) -> None:
        """The simulated machine rebooted: reopen what a reboot reopens (nothing by default: a
        store whose records stand for a file's keeps them as they are)."""
        return None  # an optional hook: a default that does nothing, not an abstract method

    def close(self) -> None:
        """Release what the store holds (nothing by default). Called once, after the run."""
        return None
