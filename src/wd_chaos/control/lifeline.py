"""What a run leaves if its controller dies without cleaning up (SIGKILL, an OOM kill): nothing.

Two mechanisms, because neither covers everything alone:

- every worker, writer and locust process is started with ``PR_SET_PDEATHSIG = SIGKILL``
  (``die_with_parent``): the kernel kills it when the controller dies, even a SIGSTOPped one;
- a small watchdog (``Lifeline``, ``python -m wd_chaos.control.lifeline``) in its own session holds the
  read end of a pipe from the controller. A controller that finishes, or stops cleanly after
  Ctrl-C, writes ``done``; end of file without it means the controller died, and the watchdog
  kills what the kernel did not (the private servers: Postgres runs under another user through
  setpriv, which clears the parent-death signal, and daemons re-parent anyway; any process
  still naming the run's folder), removes the servers' folders (``servers.sweep_stale``) and
  writes ``INTERRUPTED`` in the run's folder.

``mark_stale_runs`` does the last part for a run folder whose watchdog died too (``wd-chaos clean``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """In a child between fork and exec (``preexec_fn``): ask the kernel to SIGKILL this process
    when its parent thread exits; and exit now if ``parent`` already did (the race the flag
    cannot cover). Linux only; elsewhere a no-op, the watchdog still sweeps."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


class Lifeline:
    """The watchdog of one run: ``Lifeline(run_dir)`` starts it; ``release()`` when the run's
    processes and servers are stopped (a finished or a cleanly interrupted run)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        with (run_dir / "lifeline.log").open("ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "wd_chaos.control.lifeline", str(os.getpid()), str(run_dir)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,  # outlives the controller's process group and its Ctrl-C
            )

    @property
    def pid(self) -> int:
        """The watchdog's process id."""
        return self._proc.pid

    def release(self) -> None:
        """Tell the watchdog the run cleaned up after itself, and wait for it to exit."""
        stdin: IO[bytes] | None = self._proc.stdin
        if stdin is not None:
            with contextlib.suppress(OSError):
                stdin.write(b"done\n")
                stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)


def _of_run(run_dir: Path) -> list[int]:
    """The run's own processes: those started with ``WD_CHAOS_CONFIG`` naming its config.json
    (workers, writers, locust; ``runner.Cluster`` sets it)."""
    import psutil

    config = (run_dir / "config.json").resolve()
    found = []
    for proc in psutil.process_iter(["pid", "environ", "cwd"]):
        value = (proc.info.get("environ") or {}).get("WD_CHAOS_CONFIG")
        if value and proc.pid != os.getpid():
            with contextlib.suppress(OSError):
                if Path(proc.info.get("cwd") or "/", value).resolve() == config:
                    found.append(proc.pid)
    return found


def _gone(pid: int) -> bool:
    import psutil

    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _kill(pids: list[int]) -> None:
    import psutil

    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            proc.send_signal(signal.SIGCONT)  # a stalled worker, too
            proc.kill()
            procs.append(proc)
    psutil.wait_procs(procs, timeout=10)


def clean_up_after(controller: int, run_dir: Path) -> list[str]:
    """Everything a dead ``controller`` left of the run in ``run_dir``: kill its processes and
    servers, remove the servers' folders, mark the run ``INTERRUPTED``. Returns what it did."""
    from without_durability.testing.servers import sweep_stale

    did = []
    stray = _of_run(run_dir)
    if stray:
        _kill(stray)
        did.append(f"killed {len(stray)} processes of {run_dir}")
    for folder in sweep_stale(dead_owner=controller):
        did.append(f"removed server folder {folder}")
    marker = run_dir / "INTERRUPTED"
    if run_dir.is_dir() and not marker.exists() and not (run_dir / "summary.json").exists():
        marker.write_text(
            f"the controller (pid {controller}) died without cleaning up (SIGKILL?); "
            "its processes and servers were killed after it\n"
        )
        did.append(f"marked {run_dir} INTERRUPTED")
    return did


def mark_stale_runs(report_dir: Path) -> list[str]:
    """Run folders under ``report_dir`` that are neither finished nor marked and whose controller
    (named by its ``procs/controller.PID.jsonl``) is gone: clean up after each. Returns what it did."""
    did: list[str] = []
    if not report_dir.is_dir():
        return did
    for run_dir in sorted(p for p in report_dir.iterdir() if (p / "procs").is_dir()):
        if (run_dir / "summary.json").exists() or (run_dir / "INTERRUPTED").exists():
            continue
        controllers = [int(p.name.split(".")[1]) for p in (run_dir / "procs").glob("controller.*.jsonl")]
        if any(not _gone(pid) for pid in controllers):
            continue  # its controller may still be running it (a pid reused is left for a later clean)
        did += clean_up_after(controllers[0] if controllers else -1, run_dir)
    return did


def _watch(controller: int, run_dir: Path) -> None:
    # blocks until the controller writes 'done' or its end of the pipe closes (it exited or died)
    told = sys.stdin.buffer.read()
    if b"done" in told:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not _gone(controller):
        time.sleep(0.05)
    for line in clean_up_after(controller, run_dir):
        print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    # ignore a Ctrl-C meant for the controller: the watchdog acts on the pipe alone
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch(int(sys.argv[1]), Path(sys.argv[2]))
