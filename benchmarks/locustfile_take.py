"""Locust: take-and-answer load on a cycling queue (custom users, no HTTP). Run by ``benchmarks.load``.

Each user loops: take one delivery, answer it due again at once (so the queue never drains and the
load is steady). Every delivery handed out while another user still held the same workflow is
counted as a duplicate: two concurrent takes must never get one delivery. Each process also keeps
when it held each workflow (wall clock, from its take's return to its answer's send), so
``benchmarks.load`` finds a delivery handed to two processes at once in a distributed run: a take
that returned while another process had not yet begun to answer the same workflow. The master of a
distributed run holds no users and opens no store.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from locust import User, constant, events, task
from locust.runners import MasterRunner

from benchmarks.locust_support import ENV_RESULT, Bridge, fire, open_durable

BRIDGE = Bridge()
STATE: dict[str, Any] = {"durable": None, "close": None, "held": {}, "duplicates": 0, "answered": 0,
                         "spans": []}
VISIBILITY = timedelta(minutes=10)


@events.test_start.add_listener
def start(environment: Any, **_: Any) -> None:
    if not isinstance(environment.runner, MasterRunner):
        STATE["durable"], STATE["close"] = BRIDGE.call(open_durable())


@events.test_stop.add_listener
def stop(environment: Any, **_: Any) -> None:
    if STATE["durable"] is None:  # the master of a distributed run
        return
    with open(os.environ[ENV_RESULT], "w") as f:
        json.dump({"duplicates": STATE["duplicates"], "answered": STATE["answered"],
                   "spans": STATE["spans"]}, f)
    BRIDGE.call(STATE["close"]())


async def take(sched: Any) -> Any:
    """Take, and note the workflow as held; on the asyncio thread, so the check is exact."""
    delivery = await sched.take(VISIBILITY)
    if delivery is not None:
        if delivery.workflow in STATE["held"]:
            STATE["duplicates"] += 1
        STATE["held"][delivery.workflow] = time.time()
    return delivery


async def answer(sched: Any, delivery: Any) -> None:
    """Let go of the workflow just before the answer is sent (from then on another user may
    rightly take it), then answer it due again at once."""
    took = STATE["held"].pop(delivery.workflow, None)
    if took is not None:
        STATE["spans"].append((delivery.workflow, took, time.time()))
    await sched.wake_at(delivery, datetime.now(UTC) - timedelta(seconds=1))
    STATE["answered"] += 1


class TakeUser(User):
    """take -> wake_at(now): one delivery taken and answered per task."""

    wait_time = constant(0)

    @task
    def take_and_answer(self) -> None:
        sched = STATE["durable"].scheduler
        t0 = time.perf_counter()
        try:
            delivery = BRIDGE.call(take(sched))
        except Exception as exc:
            fire(self.environment, "take", t0, exc)
            return
        fire(self.environment, "take" if delivery else "take (empty)", t0, None)
        if delivery is None:
            return
        t1 = time.perf_counter()
        try:
            BRIDGE.call(answer(sched, delivery))
            fire(self.environment, "answer", t1, None)
        except Exception as exc:
            fire(self.environment, "answer", t1, exc)
