"""Careless clients: store calls made the way users make them, in a ``careless`` process of its own.

A scenario's ``[workload] careless_clients`` starts that many such processes beside the workers.
Each opens the store through its kit with a pool of one connection (``pool_size``; a store that
pools connections then has more callers than connections) and a short retention (``ttl``, for a
store whose records live for a time), and until the run stops repeats rounds of:

- **refused input beside valid calls** (``errors-classified``): at one moment, appends and supplies
  with an id or a key of about 3,000 characters, a value nested 20,000 deep, a value the codec
  cannot encode (a set), each marked ``refused`` with the round's ``burst``, and valid appends
  marked ``beside`` it;
- **cancellation** (``cancelled-calls``): appends, a record and renewals cancelled in flight, by
  ``asyncio.wait_for`` with a timeout shorter than the call or by cancelling the call's task; the
  complete line says ``cancelled``, or ``cancel_swallowed`` when the call returned although its
  task accepted the cancel. Where the store pools connections and its ledger effect pauses with
  its transaction open (``Opened.pool_size`` is 1, ``Opened.pause``), appends are made and
  cancelled while this process's only connection is held by its own open transaction: those are
  marked ``unsent`` (they cannot have reached the server) and must leave nothing;
- **a pass with a renewal ticker** (``no-hung-pass``): claim, a ticker renewing back to back, a
  body (``body``), then the ticker cancelled and awaited as the library Worker does; the ``pass``
  operation completes once the ticker has ended. A ticker still running 6 s after its cancel is
  left behind (and the pass never completes);
- **a claim storm** (``tokens-unique``): hundreds of claims in flight at once on one id, with
  leases of a microsecond to a millisecond (so nearly every one mints a token), then, once the
  retention has run out on the claim record, one more claim;
- **a claim burst** (``tokens-unique``; only when a scenario's ``careless_rounds`` names it): tens of
  tasks claiming one id with a lease of a microsecond, their calls sent together, until the tokens
  (on a store whose tokens follow its clock) run ahead of the server's clock by more than the
  retention; a quiet spell past the retention; one more claim, marked ``after_burst`` with the lead
  the tokens still had over the clock (``lead_ms``) and the quiet it followed (``quiet_ms``);
- **sweeps beside overrunning passes** (``tokens-unique``), for a store whose retention is a
  process (``Opened.sweep``): a pass whose renewals come later than its lease, a rival claiming
  the same id, and sweeps with a cutoff shorter than the overrun, each recorded as a ``sweep``.

- **plain claims** (``fencing``; opt-in): an outside client's claims of the scenario's own
  workflows on the run's own store (``wd_chaos.client.outside``).

Each round's workflows but the plain claims' are its own (``careless-...``), outside the scenario's
workflows, and never queued, so no worker takes them. Every call and its result is in the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from without_durability import Contended, Fenced, Pass

from ..config import RunConfig
from ..history import HistoryWriter
from ..stores import Opened, Spec
from .outside import OutsideClient
from .recorder import Recorder, classify, error_fields

BIG = 3000
"""Characters in an oversize id or key: past a btree index entry's limit (2,704 bytes) even
uncompressed."""
DEEP = 20_000
"""Nesting depth of the over-deep value: past any JSON codec's or server's limit."""
HANG_SECONDS = 6.0
"""How long a pass waits for its cancelled ticker before leaving it behind (past
``no-hung-pass``'s margin, so a ticker that never ends is judged)."""
STORM_CLAIMS = 64
"""Claims a storm has in flight at once (a client's connections are not without end). Fewer in
flight mint more tokens a second (8-32 about 2,100 against a local Redis, as claims sent together
find each other's leases live); the storm's length is bounded by ``STORM_MOST`` claims instead."""
STORM_SECONDS = 1.0
"""How long a storm goes on at most."""
STORM_MOST = 500
"""Claims a storm stops at, however fast the machine: ``fencing`` judges a workflow's claims
pairwise, and an idle machine's storm of 7,000 tokens on one id cost minutes of checking."""
BURST_TASKS = 64
"""Tasks claiming at once in a claim burst: their calls go to the store together."""
BURST_SECONDS = 8.0
"""How long a claim burst goes on at most (a loaded machine's burst gets ahead more slowly)."""
BURST_MOST = 20_000
"""Claims a burst stops at, however slow it is to get ahead."""
BURST_SPARE_MS = 1000
"""How far past the retention (and the quiet margin) a burst runs the tokens ahead of the clock, so
a quiet spell that oversleeps on a loaded machine still ends with them ahead."""
BURST_AFTER_STOP = 2.5
"""Seconds a burst goes on after the run asked this process to stop (on a loaded machine the run's
workload phase is mostly spent starting processes): with the quiet spell and the last claim it
still ends inside the harness's 5 s between SIGTERM and SIGKILL."""
QUIET_MARGIN = 0.2
"""Seconds the quiet spell outlasts the retention."""
ROUNDS = {
    "refused-burst": "refused_burst",
    "sweeps-beside-overruns": "sweeps_beside_overruns",
    "claim-storm": "claim_storm",
    "cancellations": "cancellations",
    "starved": "starved",
    "ticking-pass": "ticking_pass",
    "claim-burst": "claim_burst",
    "plain-claims": "plain_claims",
}
"""A scenario's ``careless_rounds`` names: the method each runs."""
DEFAULT_ROUNDS = tuple(r for r in ROUNDS if r not in ("claim-burst", "plain-claims"))
"""The rounds a careless process runs when its scenario names none (the burst is opt-in: it makes
thousands of claims a round; so are plain claims, which take the scenario's own workflows)."""


def careless_spec(cfg: RunConfig) -> Spec:
    """The store spec a careless process opens: the careless clients' own store on the run's
    server (the run's store where there is none), with one pooled connection and the scenario's
    short retention."""
    own: Spec | None = cfg.get("careless_store")  # a kept key of config.json (runner.run)
    return {**(own or cfg.store), "pool_size": 1, "ttl": cfg.workload.careless_ttl}


def _deep(depth: int) -> object:
    value: object = []
    for _ in range(depth):
        value = [value]
    return value


class Careless:
    """One careless process's rounds (see the module docstring)."""

    def __init__(self, cfg: RunConfig, name: str, opened: Opened, hist: HistoryWriter) -> None:
        self.cfg = cfg
        self.name = name
        self.opened = opened
        self.hist = hist
        self.rec = Recorder(opened.durable, hist)
        self.cp = opened.durable.checkpointer
        self.rng = random.Random(f"{cfg.seed}:{name}")
        self.n = 0
        self.stopping = False
        self.stopped_at = 0.0
        self.stopped = asyncio.Event()
        self.outside: OutsideClient | None = None
        """The run's own store, opened plainly, for ``plain_claims`` (opened on first use)."""
        self.holding = 0
        """The number of the hold of this process's only connection under way (0: none)."""
        self.holds = 0

    def wf(self, what: str) -> str:
        return f"careless-{self.name}-{what}-{self.n}"

    # -- recording ----------------------------------------------------------------------------

    async def cancelled(
        self,
        f: str,
        fields: dict[str, Any],
        call: Callable[[], Awaitable[Any]],
        done: Callable[[Any], dict[str, Any]],
        *,
        within: float | None = None,
        delay: float | None = None,
    ) -> None:
        """Make ``call`` and cancel it: by ``asyncio.wait_for`` after ``within`` s (recorded as
        its ``timeout``), or by
        cancelling its task ``delay`` s after it began (0: once it is under way). The complete line
        says ``cancelled`` (and ``unsent`` when this process's only connection was held by its own
        open transaction from before the call to after its cancellation), or ``cancel_swallowed``
        when the call returned although its task accepted the cancel."""
        hold = self.holding
        how = {"timeout": within} if within is not None else {"cancel_after": delay}
        op = self.hist.invoke(f, **fields, **how)
        task = asyncio.ensure_future(call())
        accepted = False
        try:
            if within is not None:
                result = await asyncio.wait_for(task, within)
            else:
                await asyncio.sleep(delay or 0)
                accepted = task.cancel()
                result = await task
        except (asyncio.CancelledError, TimeoutError) as exc:
            unsent = hold != 0 and self.holding == hold and self.opened.pool_size == 1
            self.hist.complete(op, f, "unknown", cancelled=True, unsent=unsent, **error_fields(exc))
            return
        except BaseException as exc:
            self.hist.complete(op, f, classify(exc, f), **error_fields(exc))
            if isinstance(exc, Fenced | Contended | Exception):
                return
            raise
        extra = {"cancel_swallowed": True} if accepted else {}
        self.hist.complete(op, f, "ok", **done(result), **extra)

    async def plain(
        self, f: str, fields: dict[str, Any], call: Callable[[], Awaitable[Any]], done: Any
    ) -> None:
        """A recorded call whose failure is the checkers' to judge, not this client's."""
        with contextlib.suppress(Exception, Fenced, Contended):
            await self.rec._call(f, fields, call, done)

    async def release(self, p: Pass) -> None:
        """Release ``p``, recorded."""
        await self.plain(
            "release", {"workflow": p.workflow, "token": p.token}, lambda: self.cp.release(p), lambda _: {}
        )

    # -- the rounds ---------------------------------------------------------------------------

    async def refused_burst(self) -> None:
        """Refused input and valid calls at one moment (``errors-classified``)."""
        burst = f"{self.name}:{self.n}"
        wf = self.wf("input")
        big_id = f"careless-big-{os.urandom(BIG // 2).hex()}"  # random: no compression fits it in
        big_key = f"big-{os.urandom(BIG // 2).hex()}"
        cp = self.cp
        mark = {"burst": burst}
        calls = [
            self.plain(
                "append",
                {
                    "workflow_shape": f"{big_id[:40]}... ({len(big_id)} chars)",
                    "refused": "oversize-id",
                    **mark,
                },
                lambda: cp.append(big_id, {"n": self.n}),
                lambda k: {"key": k},
            ),
            self.plain(
                "supply",
                {
                    "workflow": wf,
                    "key_shape": f"{big_key[:40]}... ({len(big_key)} chars)",
                    "refused": "oversize-key",
                    **mark,
                },
                lambda: cp.supply(wf, big_key, {"n": self.n}),
                lambda r: {"won": r.won},
            ),
            self.plain(
                "append",
                {"workflow": wf, "value_shape": f"a list nested {DEEP} deep", "refused": "deep", **mark},
                lambda: cp.append(wf, _deep(DEEP)),
                lambda k: {"key": k},
            ),
            self.plain(
                "append",
                {"workflow": wf, "value_shape": "a set", "refused": "codec", **mark},
                lambda: cp.append(wf, {1, 2, 3}),
                lambda k: {"key": k},
            ),
        ]
        for i in range(4):
            value = {"by": self.name, "round": self.n, "beside": i}
            calls.insert(
                2 * i,
                self.plain(
                    "append",
                    {"workflow": wf, "value": value, "beside": burst},
                    lambda value=value: cp.append(wf, value),  # type: ignore[misc]
                    lambda k: {"key": k},
                ),
            )
        await asyncio.gather(*calls)

    async def cancellations(self) -> None:
        """Appends, a record and renewals cancelled in flight (``cancelled-calls``)."""
        wf = self.wf("cancel")
        cp = self.cp
        calls = []
        for i in range(6):
            value = {"by": self.name, "round": self.n, "cancelled": i}
            how: dict[str, float] = (
                {"within": self.rng.uniform(0.0005, 0.01)}
                if i % 2
                else {"delay": self.rng.choice([0.0, 0.001])}
            )
            calls.append(
                self.cancelled(
                    "append",
                    {"workflow": wf, "value": value},
                    lambda value=value: cp.append(wf, value),  # type: ignore[misc]
                    lambda k: {"key": k},
                    **how,
                )
            )
        await asyncio.gather(*calls)
        try:
            p = await self.rec.claim(wf, timedelta(seconds=2), timedelta(seconds=5))
        except (Exception, Contended):
            return
        value = {"by": self.name, "round": self.n}
        await self.cancelled(
            "record",
            {"workflow": wf, "token": p.token, "key": "cancelled-record", "value": value},
            lambda: cp.record(p, "cancelled-record", value),
            lambda r: {"value": r.value, "won": r.won},
            delay=0.0,
        )
        for _ in range(3):  # what the Worker's ticker does to a renewal in flight when its pass ends
            await self.cancelled(
                "renew", {"workflow": wf, "token": p.token}, lambda: cp.renew(p), lambda _: {}, delay=0.0
            )
        await asyncio.sleep(0.3)  # a batch that was sent has committed by now
        await self.plain("release", {"workflow": wf, "token": p.token}, lambda: cp.release(p), lambda _: {})
        with contextlib.suppress(Exception):
            await self.rec.read(wf, "history", via="writer")

    async def starved(self) -> None:
        """Appends cancelled while this process's only connection is held by its own open
        transaction: they cannot have been sent, so they must leave nothing (``unsent``). Only for
        a store with a pool of one whose ledger effect pauses inside the transaction."""
        if self.opened.pool_size != 1:
            return
        wf = self.wf("starved")
        try:
            p = await self.rec.claim(wf, timedelta(seconds=5), timedelta(seconds=10))
        except (Exception, Contended):
            return
        held = asyncio.Event()
        release = asyncio.Event()

        async def pause(workflow: str, token: int) -> None:
            self.holds += 1
            self.holding = self.holds
            held.set()
            try:
                await asyncio.wait_for(release.wait(), 3.0)
            except TimeoutError:
                pass
            finally:
                self.holding = 0

        self.opened.pause = pause
        effect = self.opened.ledger_effect(wf, "ledger", p.token, lambda: None)
        transact = asyncio.ensure_future(self.rec.transact(p, "ledger", effect))
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(held.wait(), 2.0)
            if held.is_set():
                calls = []
                for i in range(4):
                    value = {"by": self.name, "round": self.n, "starved": i}
                    calls.append(
                        self.cancelled(
                            "append",
                            {"workflow": wf, "value": value, "starved": True},
                            lambda value=value: self.cp.append(wf, value),  # type: ignore[misc]
                            lambda k: {"key": k},
                            within=0.15,
                        )
                    )
                await asyncio.gather(*calls)
            release.set()
            with contextlib.suppress(Exception, Fenced, Contended):
                await transact
        finally:
            release.set()
            self.opened.pause = None
        await asyncio.sleep(0.5)  # a batch left waiting for the connection has had it by now
        with contextlib.suppress(Exception):
            await self.rec.read(wf, "history", via="writer")
        await self.plain(
            "release", {"workflow": wf, "token": p.token}, lambda: self.cp.release(p), lambda _: {}
        )

    async def ticking_pass(self) -> None:
        """A pass with a renewal ticker, ended as the Worker ends one, at a moment a renewal is in
        flight (``no-hung-pass``)."""
        wf = self.wf("tick")
        try:
            p = await self.rec.claim(wf, timedelta(seconds=1), timedelta(seconds=30))
        except (Exception, Contended):
            return
        left_behind = False
        in_flight = asyncio.Event()
        op = self.hist.invoke("pass", workflow=wf, token=p.token)

        async def ticker(p: Pass) -> None:
            while not left_behind:
                await asyncio.sleep(0.01)
                in_flight.set()
                try:
                    await self.rec.renew(p)
                except Fenced:
                    return
                except Exception:
                    await asyncio.sleep(0.05)
                finally:
                    in_flight.clear()

        tick = asyncio.ensure_future(ticker(p))
        body = self.hist.invoke("body", workflow=wf, token=p.token)
        await asyncio.sleep(self.rng.uniform(0.2, 0.4))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(in_flight.wait(), 1.0)  # end the body as a renewal is under way
        self.hist.complete(body, "body", "ok", token=p.token, ended="returned")
        tick.cancel()
        done, _ = await asyncio.wait({tick}, timeout=HANG_SECONDS)
        if not done:
            self.hist.event("info", what="ticker left behind", workflow=wf, token=p.token)
            left_behind = True  # so it stops renewing once its renewal returns
            return  # the pass never ends
        self.hist.complete(op, "pass", "ok", token=p.token)
        await self.release(p)

    async def claim_storm(self) -> None:
        """A storm of claims on one id of this process's own, each with a lease of a microsecond to
        a tenth of a millisecond (so each claim finds the last one lapsed and mints a token), tens
        in flight at once for a second; then, once the retention has run out on the claim record, one more claim
        (``tokens-unique``: it must get a token above every one the storm was handed)."""
        wf = f"careless-storm-{self.name}"
        rng = random.Random(f"{self.cfg.seed}:{self.name}:{self.n}:storm")

        made = 0

        async def one() -> None:
            nonlocal made
            alive = timedelta(microseconds=rng.choice([1, 10, 100]))
            with contextlib.suppress(Exception, Contended):
                await self.rec.claim(wf, alive, alive)
                made += 1

        until = asyncio.get_running_loop().time() + STORM_SECONDS

        async def claimer() -> None:  # each claims again as soon as its last returned
            while asyncio.get_running_loop().time() < until and made < STORM_MOST and not self.stopping:
                await one()

        await asyncio.gather(*(claimer() for _ in range(STORM_CLAIMS)))
        await asyncio.sleep(self.cfg.workload.careless_ttl + 0.3)  # the claim record expires
        with contextlib.suppress(Exception, Contended):
            p = await self.rec.claim(wf, timedelta(seconds=1), timedelta(seconds=2))
            await self.release(p)

    async def claim_burst(self) -> None:
        """Claims on one id of this round's own (shared by every careless process, whose bursts
        add up), ``BURST_TASKS`` at a time, each with a lease of a
        microsecond, until the tokens are ahead of the store's clock by the retention plus
        ``QUIET_MARGIN`` plus ``BURST_SPARE_MS`` (or ``BURST_SECONDS``, or ``BURST_MOST`` claims);
        then a quiet spell of the retention plus ``QUIET_MARGIN`` after the last claim returned,
        and one more claim (``tokens-unique``: it must get a token above every one the burst was
        handed). The lead is the highest token less the store's clock in milliseconds
        (``Scheduler.now``), estimated during the burst from one reading before it. An ``info``
        line ``claim burst`` says how many claims, and the lead and the retention."""
        wf = f"careless-burst-{self.n}"  # the round's id, shared: every careless process bursts on it
        retention_ms = self.cfg.workload.careless_ttl * 1000
        quiet = self.cfg.workload.careless_ttl + QUIET_MARGIN
        target = retention_ms + QUIET_MARGIN * 1000 + BURST_SPARE_MS
        tiny = timedelta(microseconds=1)
        loop = asyncio.get_running_loop()
        offset = await self.clock_ms() - time.time() * 1000  # the store's clock less this machine's
        highest = made = 0
        last_end = loop.time()
        until = loop.time() + BURST_SECONDS

        def ahead() -> float:
            return highest - (time.time() * 1000 + offset)

        async def claimer() -> None:
            nonlocal highest, made, last_end
            while (
                loop.time() < until
                and made < BURST_MOST
                # a burst under way when the run stops goes on a little (its quiet spell and last
                # claim still fit the harness's grace before SIGKILL)
                and (not self.stopping or loop.time() < self.stopped_at + BURST_AFTER_STOP)
                and (not highest or ahead() < target)
            ):
                with contextlib.suppress(Exception, Contended):
                    p = await self.rec.claim(wf, tiny, tiny)
                    made += 1
                    highest = max(highest, p.token)
                    last_end = loop.time()

        await asyncio.gather(*(claimer() for _ in range(BURST_TASKS)))
        if not highest:
            return
        lead = highest - await self.clock_ms()
        self.hist.event(
            "info",
            what="claim burst",
            workflow=wf,
            claims=made,
            lead_ms=round(lead),
            retention_ms=retention_ms,
        )
        await asyncio.sleep(max(0.0, last_end + quiet - loop.time()))  # a short retention expires meanwhile
        lead = highest - await self.clock_ms()
        mark = {
            "after_burst": True,
            "lead_ms": round(lead),
            "quiet_ms": round((loop.time() - last_end) * 1000),
            "retention_ms": retention_ms,
        }
        with contextlib.suppress(Exception, Contended):
            alive = timedelta(seconds=1)
            p = await self.rec._call(
                "claim",
                {"workflow": wf, "alive": 1.0, "budget": 2.0, **mark},
                lambda: self.cp.claim(wf, alive=alive, budget=2 * alive),
                lambda p: {"token": p.token},
            )
            await self.release(p)

    async def plain_claims(self) -> None:
        """An outside client's plain claims of the scenario's own workflows (``outside``)."""
        if self.outside is None:
            self.outside = await OutsideClient.open(self.cfg, self.hist, self.rng)
        await self.outside.round(lambda: self.stopping)

    async def clock_ms(self) -> float:
        """The store's clock (``Scheduler.now``), in milliseconds since the epoch."""
        now = await self.rec.sch.now()
        return float(now.timestamp() * 1000)

    async def sweeps_beside_overruns(self) -> None:
        """A pass whose renewal comes later than its lease (by more than the sweep's cutoff), sweeps
        with that cutoff running all along, then a rival's claim of the same id; three times on
        one id (``tokens-unique``: the rival's token must be above the overrunning pass's). Only
        for a store whose retention is a process (``Opened.sweep``)."""
        sweep = self.opened.sweep
        if sweep is None:
            return
        wf = self.wf("sweep")
        alive = timedelta(seconds=0.2)
        cutoff = 0.1
        running = True

        async def sweeper() -> None:
            while running:
                await self.plain(
                    "sweep",
                    {"older_than": cutoff},
                    lambda: sweep(timedelta(seconds=cutoff)),
                    lambda n: {"swept": n},
                )
                await asyncio.sleep(0.05)

        async def overruns() -> None:
            for _ in range(3):
                try:
                    p = await self.rec.claim(wf, alive, timedelta(seconds=5))
                except (Exception, Contended):
                    await asyncio.sleep(alive.total_seconds())
                    continue
                await asyncio.sleep(alive.total_seconds() + 3 * cutoff)  # the pass overruns its lease
                with contextlib.suppress(Exception, Fenced):
                    await self.rec.renew(p)  # still renewing, as far as it knows
                with contextlib.suppress(Exception, Contended):  # the rival
                    await self.rec.claim(wf, alive, timedelta(seconds=5))
                    await asyncio.sleep(alive.total_seconds() + 3 * cutoff)  # left to lapse in turn

        sweeping = asyncio.ensure_future(sweeper())
        try:
            await overruns()
        finally:
            running = False
            await sweeping

    async def run(self) -> None:
        named = self.cfg.workload.careless_rounds or DEFAULT_ROUNDS  # ticking-pass last: a
        # ticker that never ends holds the round up for 6 s
        rounds: tuple[Callable[[], Awaitable[None]], ...] = tuple(getattr(self, ROUNDS[r]) for r in named)
        # Each careless process starts its rounds at its own share of the list (careless-1 of two
        # halfway), so a short run (the mutant gate's 8 s) still reaches every behaviour once.
        index = int(self.name.rpartition("-")[2]) if self.name.rpartition("-")[2].isdigit() else 0
        among = max(1, self.cfg.workload.careless_clients)
        start = (index % among) * len(rounds) // among
        rounds = (*rounds[start:], *rounds[:start])
        pause = self.cfg.workload.careless_ttl + 0.2  # a claim record left to lapse expires meanwhile
        while not self.stopping:
            self.n += 1
            for behaviour in rounds:
                if self.stopping:
                    break
                try:
                    await behaviour()
                except Exception as exc:  # the store restarting: the next round tries again
                    self.hist.event(
                        "info", what="careless round failed", round=behaviour.__name__, **error_fields(exc)
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopped.wait(), pause)

    def stop(self) -> None:
        """Finish the behaviour under way and end (SIGTERM)."""
        self.stopping = True
        self.stopped_at = asyncio.get_running_loop().time()
        self.stopped.set()


async def run_careless(cfg: RunConfig, name: str, opened: Opened, hist: HistoryWriter) -> None:
    """A careless process: rounds until SIGTERM (see the module docstring)."""
    client = Careless(cfg, name, opened, hist)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, client.stop)
    try:
        await client.run()
    finally:
        if client.outside is not None:
            await client.outside.close()


__all__ = ["BIG", "DEEP", "Careless", "careless_spec", "run_careless"]
