"""One pytest session in a child process, as every mutation run starts it: the command, the run
(stopped with everything it started when its time is up) and what came back (exit code, the
failing tests pytest's short summary names, the tail of its output)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

TEST_TIMEOUT = 300
"""Seconds one test may take (pytest-timeout): generous, since a loaded machine is slow too, and a
test cut off by it is reported as a timeout, not as the test's failure."""

TIMED_OUT = re.compile(r"Timeout \(?>?\s*[0-9.]+s")
"""pytest-timeout's report of a test it stopped."""
FAILED = re.compile(r"^(?:FAILED|ERROR) (?! )(.+?)(?: - .*)?$", re.M)
"""A failing test in pytest's short summary (``-rfE``): the whole test id, spaces included (a
parameter id may hold some), up to pytest's `` - reason``. One space after the word: a captured
log record at ERROR level (``ERROR    module:file.py:363 message``, padded) is not a test."""
HUNG = re.compile(r"^HUNG (.+?): Timeout", re.M)
"""The suite's backstop (tests/conftest.py) naming a test that outlived its timeout, just before it
ends the test process (so pytest's own summary may never be printed)."""
_XDIST_STOPPED = re.compile(r"Interrupted: stopping after \d+ failures?")


def command(
    tests: Iterable[str],
    *,
    stores: Iterable[str] = (),
    plugins: Iterable[str] = (),
    fail_fast: bool = False,
    jobs: int = 1,
    junit: Path | None = None,
    test_timeout: float | None = None,
    summary: bool = False,
    before: Iterable[str] = (),
    after: Iterable[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """The pytest command for ``tests`` (files or node ids) on the conformance ``stores``
    (``--wd-store``), with each of ``plugins`` loaded (``-p``) and the cache off; ``fail_fast``
    stops at the first failure (``-x``), ``jobs`` > 1 runs that many test processes (pytest-xdist),
    ``junit`` writes a JUnit XML file there, ``test_timeout`` bounds each test (pytest-timeout),
    ``summary`` asks for the short summary of failures and errors (``-rfE``, which ``Session``
    reads). ``before`` comes after the tests and the quiet flags, ``after`` last."""
    return [
        python, "-m", "pytest", *tests, "-q", "--no-header", *(["-rfE"] if summary else []),
        "-p", "no:cacheprovider", *[arg for p in plugins for arg in ("-p", p)], *before,
        *(["-o", f"timeout={test_timeout:g}"] if test_timeout is not None else []),
        *(["-x"] if fail_fast else []),
        *(["-n", str(jobs)] if jobs > 1 else []),
        *([f"--junitxml={junit}"] if junit else []),
        *[arg for s in stores for arg in ("--wd-store", s)],
        *after,
    ]  # fmt: skip


@dataclass
class Session:
    """What one pytest session gave back. ``code`` is pytest's exit code, -1 when the session ran
    out of time; ``failures`` the tests its short summary names as failed or errored."""

    code: int
    seconds: float
    stdout: str = ""
    stderr: str = ""
    timeout: float | None = None
    failures: list[str] = field(default_factory=list)

    @property
    def timed_out(self) -> bool:
        """Whether the whole session ran out of its time (not one test: see ``failed``)."""
        return self.code == -1

    @property
    def failed(self) -> str:
        """The first failing test's id; ``timeout in <id>`` when pytest-timeout stopped a test
        (not the test's verdict), ``timeout after <n>s`` when the session ran out of time, else
        empty."""
        if self.timed_out:
            return f"timeout after {self.timeout or 0:.0f}s"
        if self.failures and TIMED_OUT.search(self.stdout + self.stderr):
            return f"timeout in {self.failures[0]}"
        return self.failures[0] if self.failures else ""

    @property
    def tail(self) -> str:
        """The last 2,000 characters of the output, for a report."""
        return self.stdout[-2000:]


def run(
    argv: list[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
    merge_stderr: bool = False,
) -> Session:
    """Run ``argv`` (a ``command``) in its own process group and wait up to ``timeout`` seconds;
    on timeout stop it, its group and anything it started outside it (a server, a worker), and
    return code -1 with the output it wrote. ``merge_stderr`` reads stderr into ``stdout``."""
    import time

    started = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=dict(env) if env is not None else None, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = stop(proc)
        return Session(-1, time.monotonic() - started, out, err, timeout)
    except BaseException:
        stop(proc)  # interrupted: its own process group would not hear the terminal's Ctrl-C
        raise
    code = proc.returncode
    failures = FAILED.findall(out)
    failures += [hung for hung in HUNG.findall(out + (err or "")) if hung not in failures]
    if code == 2 and failures and _XDIST_STOPPED.search(out):
        code = 1  # pytest-xdist ends a -x session on a failure as "interrupted"; it is the failure
    return Session(code, time.monotonic() - started, out, err or "", timeout, failures)


def stop(proc: subprocess.Popen[Any]) -> tuple[str, str]:
    """Stop ``proc``, its process group and anything it started outside it; what it wrote."""
    children: list[psutil.Process] = []
    with contextlib.suppress(psutil.Error):
        children = psutil.Process(proc.pid).children(recursive=True)
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    out, err = proc.communicate()
    return out or "", err or ""
