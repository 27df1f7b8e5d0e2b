"""A worker process for the process tests: one Worker on a SQLite file, serving until SIGTERM.

Its workflow body runs one slow step. The step prints ``started <workflow> <token>`` when its
effect begins and ``effect-done <workflow>`` when it ends; the body prints ``finished <workflow>``
after the step is recorded. Usage: ``python step_worker.py DB ALIVE_SECONDS STEP_SECONDS``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import timedelta
from typing import Any

from without_durability import Run, Worker
from without_durability.sqlite import SqliteDurable


def say(line: str) -> None:
    print(line, flush=True)


async def main(path: str, alive: float, step_seconds: float) -> None:
    durable = await SqliteDurable.open(path)

    async def body(run: Run[Any]) -> object:
        async def slow() -> object:
            say(f"started {run.workflow} {run.pass_.token}")
            await asyncio.sleep(step_seconds)
            say(f"effect-done {run.workflow}")
            return f"worker token {run.pass_.token}"

        await run.step("slow", slow, str)
        say(f"finished {run.workflow}")
        return None

    worker = Worker(
        durable, body, alive=timedelta(seconds=alive), budget=timedelta(minutes=5),
        visibility=timedelta(minutes=10), poll_interval=timedelta(milliseconds=50),
    )
    say("ready")
    try:
        await worker.serve()
    finally:
        await durable.close()
    say("exited")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    asyncio.run(main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3])))
