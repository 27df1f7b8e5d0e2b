"""The examples run to completion with the commands examples/README.md shows, on each selected store
that the examples support (``--wd-store``: sqlite, postgres, redis-set)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from without_durability.testing.harness import StoreFactory

EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.mark.wd_store(["sqlite", "postgres", "redis-set"])
@pytest.mark.parametrize("name", ["order.py", "saga.py"])
async def test_example_runs_to_completion(name: str, wd_factory: tuple[StoreFactory, Any]) -> None:
    factory, server = wd_factory
    if factory.name == "sqlite":
        await run_example(name)
    elif factory.name == "postgres":
        async with factory.open(server) as store:  # a fresh schema: the example's tables are ours
            joiner = "&" if "?" in server.url else "?"
            url = f"{server.url}{joiner}options=-csearch_path%3D{store.extra['schema']}"
            await run_example(name, "--postgres", url)
    else:
        await run_example(name, "--redis", server.url)


async def run_example(name: str, *args: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / name),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    stdout = out.decode()
    assert proc.returncode == 0, f"{name} {args} failed:\n{stdout}\n{err.decode()}"
    assert "FAIL" not in stdout and "ok " in stdout, stdout
