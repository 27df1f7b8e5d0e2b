"""A pass-through FUSE file system that loses what was never fsynced, as a power loss does.

The idea is Jepsen's LazyFS: a SIGKILL leaves the kernel's page cache intact, so a store that
acknowledges a write before it reaches the disk looks durable under every kill. Here every write to
a file under the mount is held in memory (per file, by page) until that file is fsynced or
fdatasynced; ``drop`` then throws away every write not yet synced, which is what a machine that
lost its power keeps: the last synced contents. Closing a file syncs nothing (a disk keeps no more
for a close). Directory changes (create, rename, unlink, mkdir) reach the backing folder at once,
like a journaled file system's metadata; only file contents wait for a sync.

``LazyFS`` runs the file system in a process of its own (``python -m wd_chaos.control.lazyfs_server``, the file system itself), mounted
over a folder and backed by another, and controls it over a socket pair: ``drop``, ``sync``
(write everything through, as ``sync(2)`` would) and ``stats``. The process unmounts itself when
its controller goes away. Built on mfusepy (ctypes over Debian's libfuse3), the maintained fork of
fusepy: pure Python, so the extra installs anywhere libfuse3 is.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INSTALL_HINT = (
    "apt-get install fuse3 (Debian's libfuse3 and fusermount3; scripts/install-servers installs it) "
    'and pip install ".[powerloss]" in a checkout (the powerloss extra)'
)


MOUNT = "lazyfs"
"""The mount point's name in the run's folder (empty once the run is over)."""


class FuseUnavailable(RuntimeError):
    """A FUSE mount cannot be had here (no /dev/fuse, no libfuse3 or fusermount3, mfusepy missing,
    or the kernel refused the mount); the message says which and what to do."""


def why_unavailable() -> str | None:
    """Why a LazyFS mount cannot be had on this machine (without trying one), or None. Starts nothing."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist: the kernel has no FUSE (modprobe fuse, or a container run with --device /dev/fuse)"
    if shutil.which("fusermount3") is None:
        return f"fusermount3 is not on PATH: {INSTALL_HINT}"
    try:
        import mfusepy  # type: ignore[import-untyped,import-not-found,unused-ignore]  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy cannot be loaded ({type(exc).__name__}: {exc}): {INSTALL_HINT}"
    return None


# -- the file system (runs in its own process) --------------------------------------------------


# -- the controller's side ----------------------------------------------------------------------


@dataclass(frozen=True)
class Dropped:
    """What a ``drop`` (or a ``sync``) touched: ``bytes`` written since each file's last sync
    (truncations counted by the bytes they cut) and the ``files`` holding them."""

    bytes: int
    files: int


class LazyFS:
    """A LazyFS process mounted at ``mount`` over ``backing`` (both folders, created if missing):
    enter to mount (``FuseUnavailable`` when it cannot be had), exit to unmount. ``log`` receives
    the process's own output."""

    def __init__(self, backing: Path, mount: Path, log: Path | None = None, timeout: float = 30.0) -> None:
        self.backing = backing
        self.mount = mount
        self.log = log or mount.parent / f"{mount.name}.lazyfs.log"
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._reader: Any = None
        self._lock = threading.Lock()

    def __enter__(self) -> LazyFS:
        reason = why_unavailable()
        if reason:
            raise FuseUnavailable(f"a power-loss run needs a FUSE mount: {reason}")
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(parents=True, exist_ok=True)
        mine, theirs = socket.socketpair()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "wd_chaos.control.lazyfs_server",
                    str(self.backing),
                    str(self.mount),
                    str(theirs.fileno()),
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        theirs.close()
        self._sock = mine
        self._sock.settimeout(self.timeout)
        self._reader = mine.makefile("r")
        try:
            line = self._reader.readline()
        except (TimeoutError, OSError):
            line = ""
        if not line or not json.loads(line).get("ready"):
            self._stop()
            tail = self.log.read_text(errors="replace").strip().splitlines()[-3:] if self.log.exists() else []
            raise FuseUnavailable(
                f"the FUSE mount at {self.mount} was refused or did not come up within {self.timeout:g} s"
                + (f" ({' / '.join(tail)})" if tail else "")
                + ": a power-loss run needs a machine that allows FUSE mounts (root, or fuse3 with "
                "user_allow_other; in a container: --device /dev/fuse --cap-add SYS_ADMIN)"
            )
        return self

    def _ask(self, command: str, **args: Any) -> dict[str, Any]:
        if self._sock is None:
            raise FuseUnavailable(f"the LazyFS at {self.mount} is not mounted")
        with self._lock:
            self._sock.sendall((json.dumps({"op": command, **args}) + "\n").encode())
            line = self._reader.readline()
        if not line:
            raise FuseUnavailable(f"the LazyFS at {self.mount} went away (see {self.log})")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"LazyFS {command}: {reply['error']}")
        return reply

    def drop(self) -> Dropped:
        """Throw away every write not yet synced (a power loss); what was dropped."""
        reply = self._ask("drop")
        return Dropped(int(reply["bytes"]), int(reply["files"]))

    def sync(self) -> Dropped:
        """Write every file's unsynced contents through and fsync them (``sync(2)``); what was written."""
        reply = self._ask("sync")
        return Dropped(int(reply["bytes"]), int(reply["files"]))

    def cut_power(self, pids: list[int], timeout: float) -> bool:
        """SIGKILL ``pids`` and their process groups from inside the file system, at the next
        write any process makes under the mount (so that write is unsynced when the power goes),
        or after ``timeout`` seconds without one. True when a write set it off. The processes may
        still be dying when it returns; ``drop`` once they are dead."""
        if self._sock is not None:
            self._sock.settimeout(timeout + self.timeout)
        try:
            reply = self._ask("arm", pids=pids, timeout=timeout)
        finally:
            if self._sock is not None:
                self._sock.settimeout(self.timeout)
        return bool(reply["on_write"])

    def pending(self) -> Dropped:
        """What a drop now would lose."""
        reply = self._ask("stats")
        return Dropped(int(reply["bytes"]), int(reply["files"]))

    def _stop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None
        subprocess.run(["fusermount3", "-u", "-z", str(self.mount)], check=False, capture_output=True)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __exit__(self, *exc: object) -> None:
        self._stop()


@contextlib.contextmanager
def mounted(run_dir: Path) -> Iterator[LazyFS]:
    """A LazyFS mounted at ``run_dir/lazyfs`` over a temporary folder (removed at exit, with
    whatever the store left in it); ``FuseUnavailable`` when this machine allows no FUSE mount."""
    from without_durability.testing.servers import own

    with tempfile.TemporaryDirectory(prefix="wd-lazyfs-") as tmp:
        mount = run_dir / MOUNT
        with LazyFS(Path(tmp) / "backing", mount, log=run_dir / "lazyfs.log") as lazy:
            # a sweep after a killed run stops the file system process and removes the folder
            own(Path(tmp), 0, lazy.proc.pid if lazy.proc is not None else None)
            yield lazy
        with contextlib.suppress(OSError):
            mount.rmdir()
