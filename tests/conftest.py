"""The suite's own guard against a test that never ends.

pytest-timeout (``timeout`` in pyproject.toml, the signal method) raises in the main thread when a
test's time is up. Alone it lets a hung Worker hold the suite until CI's own limit, two ways:

- pytest-timeout stops its timer as soon as a test *fails* (its ``pytest_exception_interact``
  hook), its own timeout's failure included, before the teardown runs. A teardown that then waits
  on a task refusing its cancel (a renewal loop that outlives its pass, awaited by
  pytest-asyncio's loop shutdown) hangs with no timer left.
- Under asyncio the alarm's exception can land inside a task nobody awaits (a renewal tick) or a
  loop callback, whose handler logs and drops it; the alarm fires once.

So every test also gets a backstop thread, armed for the whole run of the test (setup, call,
teardown) and stopped only when that ends: still running ``timeout_grace`` seconds past its
timeout, it names the test on stderr, dumps every thread's stack and ends the test process.
Under pytest-xdist the controller then reports the test failed ("worker 'gw0' crashed while
running <test>") and goes on with a new worker; without it, pytest exits 1 after that line.
tests/test_hang.py shows it on deliberately hung Workers (tests/procs/hung_worker.py).
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
from collections.abc import Generator
from typing import Any

import pytest

GRACE_INI = "timeout_grace"
"""Seconds a test may outlive its pytest-timeout before the backstop ends its process."""
DEFAULT_GRACE = 30.0
_TIMER = pytest.StashKey[threading.Timer]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        GRACE_INI,
        "seconds a test may run past its pytest-timeout before the suite's backstop ends its "
        f"process, naming it (default {DEFAULT_GRACE:g})",
        default=str(DEFAULT_GRACE),
    )


def _hung(item: pytest.Item, timeout: float, grace: float) -> None:
    """Name the test that outlived its timeout, dump every thread's stack, end the process."""
    capman = item.config.pluginmanager.getplugin("capturemanager")
    try:
        if capman is not None:  # fd 2 is pytest's capture file while a test runs: take it back
            capman.suspend_global_capture(in_=True)
    except Exception:  # the name, the stacks and the exit matter more than a tidy capture
        pass
    os.write(
        2,
        f"\nHUNG {item.nodeid}: Timeout (>{timeout:g}s) + {grace:g}s and it still runs (a hang the "
        "timeout's exception did not end, or a teardown after a failure); its stacks follow, "
        "then this test process ends\n".encode(),
    )
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os._exit(1)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> None:
    """Arm the backstop with the test's own timeout (None: pytest-timeout arms its timer too)."""
    grace = float(item.config.getini(GRACE_INI))
    timer = threading.Timer(settings.timeout + grace, _hung, (item, float(settings.timeout), grace))
    timer.daemon = True
    timer.name = f"hang backstop for {item.nodeid}"
    item.stash[_TIMER] = timer
    timer.start()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Disarm the backstop only when the test's whole run has ended (not when it fails, which
    is when pytest-timeout stops its own timer)."""
    try:
        return (yield)
    finally:
        timer = item.stash.get(_TIMER, None)
        if timer is not None:
            timer.cancel()
