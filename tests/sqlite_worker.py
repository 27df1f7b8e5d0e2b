"""A worker process for tests/test_sqlite.py: one OS process with its own connection to the file.

python sqlite_worker.py race DB ID   print "ready", then per stdin line "round R TOKEN" race
                                     the others (claim, record/supply, transact under the
                                     shared pass TOKEN, append, take), print JSON
python sqlite_worker.py hang DB      claim "victim", begin a transact whose effect writes the
                                     ledger, print "inside", and block there until killed
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import threading
from datetime import timedelta

from without_durability import Contended, Fenced, Pass, SqliteDurable
from without_durability.kits.sqlite import create_ledger, sqlite_effects

LONG = timedelta(hours=1)


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def race(path: str, me: int) -> None:
    durable = await SqliteDurable.open(path)
    store = durable.checkpointer
    kit = sqlite_effects(durable.conn)
    loop = asyncio.get_running_loop()
    say("ready")
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line or line.strip() == "quit":
            break
        _, rnd_text, shared_token = line.split()
        rnd = int(rnd_text)
        workflow = f"claim-{rnd}"
        won: Pass | None
        try:
            won = await store.claim(workflow, alive=LONG, budget=LONG)
        except Contended:
            won = None
        # The holder records the step while everyone else supplies it: one of them wins.
        try:
            if won is not None:
                step = await store.record(won, "step", me)
            else:
                step = await store.supply(workflow, "step", me)
            step_seen = [step.value, step.won]
        except Fenced:  # only when two claims both won, which the parent reports
            step_seen = [None, False]
        # Every worker transacts one key under the parent's pass: the effect must happen once.
        shared = Pass("shared", int(shared_token))
        moved = await store.transact(shared, f"t{rnd}", kit.ledger_add("shared", 1))
        keys, taken = [], []
        for i in range(10):  # appends and takes interleaved, so both race the other processes
            keys.append(await store.append("inbox", {"w": me, "r": rnd, "i": i}))
            if (delivery := await durable.scheduler.take(LONG)) is not None:
                taken.append(delivery.workflow)
        while (delivery := await durable.scheduler.take(LONG)) is not None:
            taken.append(delivery.workflow)
        say(
            json.dumps(
                {
                    "worker": me,
                    "round": rnd,
                    "token": None if won is None else won.token,
                    "step": step_seen,
                    "keys": keys,
                    "taken": taken,
                    "moved": [moved.value, moved.won],
                }
            )
        )
    await durable.close()


async def hang(path: str) -> None:
    durable = await SqliteDurable.open(path)
    await create_ledger(durable.conn)
    pass_ = await durable.checkpointer.claim("victim", alive=LONG, budget=LONG)
    add = sqlite_effects(durable.conn).ledger_add("victim", 1)
    forever = threading.Event()

    def effect(cur: sqlite3.Cursor) -> object:
        result = add(cur)
        say("inside")
        forever.wait()  # the parent SIGKILLs this process here, mid-transaction
        return result

    await durable.checkpointer.transact(pass_, "reserve", effect)


if __name__ == "__main__":
    if sys.argv[1] == "race":
        asyncio.run(race(sys.argv[2], int(sys.argv[3])))
    else:
        asyncio.run(hang(sys.argv[2]))
