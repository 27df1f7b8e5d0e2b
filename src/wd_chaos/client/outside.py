"""An outside client beside the fleet (a careless process's ``plain-claims`` round): an admin
script or a service that claims the scenario's own workflows now and then with a plain
checkpointer, whatever settings the workers run with (``mixed-fleet``)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from datetime import timedelta

from without_durability import Contended, Fenced

from ..config import RunConfig
from ..history import HistoryWriter
from ..mutation.catalogue import mutant_wrap
from ..stores import Opened, open_store
from .recorder import Recorder


class OutsideClient:
    """Plain claims on the run's own store (not the careless clients' one), opened without fast
    failover. Each ``round`` claims three of the scenario's workflows in turn with the scenario's
    lease, renews each twice within its alive and releases it. A claim made while a worker's pass
    is alive must be ``Contended``; once granted, this live pass must not be taken over
    (``fencing``): not by a fast-failover claim, nor by a reaping take that reads a previous
    holder's presence on the row. Every call is recorded."""

    def __init__(self, cfg: RunConfig, opened: Opened, hist: HistoryWriter, rng: random.Random) -> None:
        self.cfg = cfg
        self.opened = opened
        self.rec = Recorder(opened.durable, hist)
        self.rng = rng

    @classmethod
    async def open(cls, cfg: RunConfig, hist: HistoryWriter, rng: random.Random) -> OutsideClient:
        """Open the run's store plainly, with one pooled connection."""
        spec = {**cfg.store, "pool_size": 1}
        if "fast_failover" in spec:
            spec["fast_failover"] = False
        return cls(cfg, await open_store(spec, mutant_wrap(spec)), hist, rng)

    async def round(self, stopping: Callable[[], bool]) -> None:
        """Three claims, each renewed twice and released; ends early once ``stopping()``."""
        lease = self.cfg.lease
        alive, budget = timedelta(seconds=lease.alive), timedelta(seconds=lease.budget)
        for _ in range(3):
            if stopping():
                return
            try:
                p = await self.rec.claim(self.rng.choice(self.cfg.workflows), alive, budget)
            except (Exception, Contended):  # a worker's pass is alive, or the store restarting
                continue
            try:
                for _ in range(2):
                    await asyncio.sleep(lease.alive / 3)
                    await self.rec.renew(p)
            except (Exception, Fenced):  # taken over: fencing judges whether it could be
                pass
            finally:
                with contextlib.suppress(Exception, Fenced):
                    await self.rec.release(p)

    async def close(self) -> None:
        """Close the store (within 5 s; a failure to close is not the run's concern)."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.opened.close(), 5)
