"""A hang is a failure with a name: deliberately hung Worker tests (tests/procs/hung_worker.py),
run in a pytest of their own as CI runs the suite (pytest-xdist), each fail by name within
seconds of a short timeout, and the session goes on past them (the backstop in tests/conftest.py)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from wd_chaos.mutation import session

ROOT = Path(__file__).resolve().parent.parent
HUNG = "tests/procs/hung_worker.py"


PLUGINS = ["xdist.plugin", "pytest_timeout", "pytest_asyncio.plugin"]
"""Only the plugins these tests need, so their session starts fast on a busy machine."""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


@pytest.mark.timeout(300)
def test_every_hung_worker_fails_by_name_and_the_session_goes_on() -> None:
    argv = session.command(
        [HUNG],
        plugins=PLUGINS,
        jobs=2,
        summary=True,
        test_timeout=2,
        before=["-o", "timeout_grace=2"],
        python=sys.executable,
    )
    started = time.monotonic()
    done = session.run(argv, env=_env(), cwd=ROOT, timeout=240)  # far inside 5 minutes, or it hung
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    assert not done.timed_out, f"the hung tests held their session past 240 s:\n{out[-3000:]}"
    assert done.code == 1, f"expected pytest's exit 1 (tests failed), got {done.code}:\n{out[-3000:]}"
    for name in ("test_a_renewal_that_outlives_its_pass", "test_a_failure_that_leaves_the_renewal_running"):
        nodeid = f"{HUNG}::{name}"
        assert f"crashed while running '{nodeid}'" in done.stdout, (
            f"{name} was not failed by name:\n{out[-3000:]}"
        )
        assert f"HUNG {nodeid}: Timeout (>2s)" in done.stderr, (
            f"no backstop line for {name}:\n{done.stderr[-3000:]}"
        )
    assert f"{HUNG}::test_a_body_that_never_returns" in done.failures, done.tail
    assert "Failed: Timeout (>2.0s) from pytest-timeout" in done.stdout, done.tail
    assert f"HUNG {HUNG}::test_a_body_that_never_returns" not in done.stderr, (
        "the backstop ended a test pytest-timeout had ended already"
    )
    assert "1 passed" in done.stdout, f"the session did not go on past the hangs:\n{done.tail}"
    print(f"hung session ended in {took:.1f}s")


@pytest.mark.timeout(300)
def test_a_hang_in_a_session_of_one_process_is_named_as_a_timeout() -> None:
    nodeid = f"{HUNG}::test_a_failure_that_leaves_the_renewal_running"
    argv = session.command(
        [nodeid],
        plugins=PLUGINS,
        summary=True,
        test_timeout=2,
        before=["-o", "timeout_grace=2"],
        python=sys.executable,
    )
    done = session.run(argv, env=_env(), cwd=ROOT, timeout=240)
    assert not done.timed_out, f"the hung test held its session past 240 s:\n{done.tail}"
    # the process ends before pytest's summary: the backstop's line is what names the test
    assert (done.code, done.failures, done.failed) == (1, [nodeid], f"timeout in {nodeid}"), (
        f"got {done.code}, {done.failures}, {done.failed!r}:\n{done.stderr[-3000:]}"
    )
