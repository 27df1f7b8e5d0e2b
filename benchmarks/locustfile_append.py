"""Locust: append load over 1,000 workflows (custom users, no HTTP). Run by ``benchmarks.load``.

Each user appends a numbered message to a random workflow; at the end every acknowledged append is
looked up with ``load`` and anything missing or changed is counted. Each process (one, or locust's
workers in distributed mode) writes its own result with the keys it saw loaded and the keys it was
acknowledged; ``benchmarks.load`` merges them, so a key nobody was told about is found across
processes too. The master of a distributed run holds no users and opens no store.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time
from typing import Any

from locust import User, constant, events, task
from locust.runners import MasterRunner

from benchmarks.locust_support import ENV_RESULT, Bridge, fire, open_durable

BRIDGE = Bridge()
WORKFLOWS = 1000
STATE: dict[str, Any] = {"durable": None, "close": None, "acked": {}}
NUMBERS = itertools.count()


@events.test_start.add_listener
def start(environment: Any, **_: Any) -> None:
    if not isinstance(environment.runner, MasterRunner):
        STATE["durable"], STATE["close"] = BRIDGE.call(open_durable())


async def check(acked: dict[str, dict[str, object]]) -> dict[str, Any]:
    cp = STATE["durable"].checkpointer
    lost = wrong = 0
    seen: dict[str, list[str]] = {}
    for workflow, want in acked.items():
        loaded = await cp.load(workflow)
        lost += sum(1 for k in want if k not in loaded)
        wrong += sum(1 for k, v in want.items() if k in loaded and loaded[k] != v)
        seen[workflow] = list(loaded)
    return {"lost": lost, "wrong": wrong, "loaded_keys": seen,
            "acked_keys": {w: list(v) for w, v in acked.items()}}


@events.test_stop.add_listener
def stop(environment: Any, **_: Any) -> None:
    if STATE["durable"] is None:  # the master of a distributed run
        return
    acked = STATE["acked"]
    result = {"acknowledged": sum(len(v) for v in acked.values()), **BRIDGE.call(check(acked))}
    with open(os.environ[ENV_RESULT], "w") as f:
        json.dump(result, f)
    BRIDGE.call(STATE["close"]())


class AppendUser(User):
    """append(random workflow, {"pid": this process, "n": unique number in it})."""

    wait_time = constant(0)

    @task
    def append(self) -> None:
        workflow = f"load-{random.randrange(WORKFLOWS)}"
        value = {"pid": os.getpid(), "n": next(NUMBERS)}
        t0 = time.perf_counter()
        try:
            key = BRIDGE.call(STATE["durable"].checkpointer.append(workflow, value))
        except Exception as exc:
            fire(self.environment, "append", t0, exc)
            return
        fire(self.environment, "append", t0, None)
        STATE["acked"].setdefault(workflow, {})[key] = value
