"""The LazyFS process: the FUSE file system that holds every write until its file is synced
(``python -m wd_chaos.control.lazyfs_server BACKING MOUNT CONTROL_FD``, started and controlled by
``wd_chaos.control.lazyfs.LazyFS``; see that module for what it models and why)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

PAGE = 4096
"""The unit the overlay keeps a file's unsynced contents in."""


class Overlay:
    """One file's contents as readers see them: the backing file's first ``valid`` bytes (zeros
    after them), the unsynced ``pages`` over that, cut at ``size``. ``pending`` counts the bytes
    written (and truncated away) since the last sync: what a drop loses."""

    def __init__(self, fd: int) -> None:
        self.fd = os.dup(fd)  # its own: a sync after every opener closed still reaches the file
        size = os.fstat(fd).st_size
        self.size = size
        self.valid = size
        self.pages: dict[int, bytearray] = {}
        self.pending = 0

    def _backing(self, fd: int, offset: int, length: int) -> bytearray:
        data = bytearray(os.pread(fd, length, offset)) if offset < self.valid else bytearray()
        keep = max(0, min(len(data), self.valid - offset))
        del data[keep:]
        data.extend(bytes(length - len(data)))
        return data

    def read(self, fd: int, offset: int, length: int) -> bytes:
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        out = self._backing(fd, offset, end - offset)
        for index in range(offset // PAGE, (end - 1) // PAGE + 1):
            page = self.pages.get(index)
            if page is None:
                continue
            start = index * PAGE
            lo, hi = max(start, offset), min(start + PAGE, end)
            out[lo - offset : hi - offset] = page[lo - start : hi - start]
        return bytes(out)

    def write(self, fd: int, offset: int, data: bytes) -> None:
        end = offset + len(data)
        for index in range(offset // PAGE, (end - 1) // PAGE + 1 if data else offset // PAGE):
            start = index * PAGE
            page = self.pages.get(index)
            if page is None:
                page = self._backing(fd, start, PAGE)
                if start + PAGE > self.size:  # past the end reads as zeros, whatever the backing holds
                    cut = max(0, self.size - start)
                    page[cut:] = bytes(PAGE - cut)
                self.pages[index] = page
            lo, hi = max(start, offset), min(start + PAGE, end)
            page[lo - start : hi - start] = data[lo - offset : hi - offset]
        self.size = max(self.size, end)
        self.pending += len(data)

    def truncate(self, length: int) -> None:
        if length < self.size:
            self.pending += self.size - length
            self.valid = min(self.valid, length)
            for index in [i for i in self.pages if i * PAGE >= length]:
                del self.pages[index]
            last = self.pages.get(length // PAGE)
            if last is not None:
                cut = length % PAGE
                last[cut:] = bytes(PAGE - cut)
        elif length > self.size:
            self.pending += length - self.size
        self.size = length

    def close(self) -> None:
        os.close(self.fd)

    def flush(self) -> None:
        """Write the overlay through to the file and fsync it."""
        fd = self.fd
        os.ftruncate(fd, self.valid)  # what a truncate cut must not come back when the file grows
        for index in sorted(self.pages):
            start = index * PAGE
            if start < self.size:
                os.pwrite(fd, bytes(self.pages[index][: min(PAGE, self.size - start)]), start)
        os.ftruncate(fd, self.size)
        os.fsync(fd)
        self.pages.clear()
        self.valid = self.size
        self.pending = 0


def _attrs(st: os.stat_result) -> dict[str, Any]:
    keys = (
        "st_mode",
        "st_nlink",
        "st_uid",
        "st_gid",
        "st_size",
        "st_ino",
        "st_dev",
        "st_blocks",
        "st_blksize",
    )
    out: dict[str, Any] = {k: getattr(st, k) for k in keys}
    for k in ("st_atime", "st_mtime", "st_ctime"):
        out[k] = getattr(st, k + "_ns")  # use_ns
    return out


_STRIP = os.O_APPEND | os.O_TRUNC | os.O_SYNC | os.O_DSYNC | getattr(os, "O_DIRECT", 0) | os.O_ACCMODE


def _operations(root: str) -> Any:
    import mfusepy  # type: ignore[import-untyped,import-not-found,unused-ignore]

    class LazyOps(mfusepy.Operations):  # type: ignore[misc]
        use_ns = True

        def __init__(self) -> None:
            self.root = root
            self.guard = threading.RLock()
            self.overlays: dict[int, Overlay] = {}
            self.inode: dict[int, int] = {}  # fh -> backing inode
            self.sync_fh: set[int] = set()  # opened O_SYNC / O_DSYNC: each write is synced
            self.open_count: dict[int, int] = {}
            self.ready: threading.Event = threading.Event()
            self.armed: list[int] | None = None  # processes the next write kills (``arm``)
            self.cut = threading.Event()

        def _full(self, path: str) -> str:
            return os.path.join(self.root, path.lstrip("/"))

        def _owner(self, full: str) -> None:
            uid, gid, _pid = mfusepy.fuse_get_context()
            with contextlib.suppress(OSError):
                os.lchown(full, uid, gid)

        def init(self, path: str) -> None:
            self.ready.set()

        # - metadata: straight through --
        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            st = os.fstat(fh) if fh is not None else os.lstat(self._full(path))
            out = _attrs(st)
            with self.guard:
                over = self.overlays.get(st.st_ino)
                if over is not None:
                    out["st_size"] = over.size
            return out

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(self._full(path))]

        def readlink(self, path: str) -> str:
            return os.readlink(self._full(path))

        def mkdir(self, path: str, mode: int) -> int:
            os.mkdir(self._full(path), mode)
            self._owner(self._full(path))
            return 0

        def mknod(self, path: str, mode: int, dev: int) -> int:
            os.mknod(self._full(path), mode, dev)
            self._owner(self._full(path))
            return 0

        def rmdir(self, path: str) -> int:
            os.rmdir(self._full(path))
            return 0

        def symlink(self, target: str, source: str) -> int:
            os.symlink(source, self._full(target))
            self._owner(self._full(target))
            return 0

        def link(self, target: str, source: str) -> int:
            os.link(self._full(source), self._full(target))
            return 0

        def _forget(self, ino: int) -> None:
            if not self.open_count.get(ino):
                over = self.overlays.pop(ino, None)
                if over is not None:
                    over.close()

        def unlink(self, path: str) -> int:
            full = self._full(path)
            with self.guard:
                st = os.lstat(full)
                os.unlink(full)
                if st.st_nlink <= 1:
                    self._forget(st.st_ino)
            return 0

        def rename(self, old: str, new: str) -> int:
            with self.guard:
                replaced = None
                with contextlib.suppress(FileNotFoundError):
                    replaced = os.lstat(self._full(new))
                os.rename(self._full(old), self._full(new))
                if replaced is not None and replaced.st_nlink <= 1:
                    self._forget(replaced.st_ino)
            return 0

        def chmod(self, path: str, mode: int) -> int:
            os.chmod(self._full(path), mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            os.lchown(self._full(path), uid, gid)
            return 0

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            os.utime(self._full(path), ns=times, follow_symlinks=False) if times else os.utime(
                self._full(path)
            )
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            sv = os.statvfs(self._full(path))
            keys = (
                "f_bavail",
                "f_bfree",
                "f_blocks",
                "f_bsize",
                "f_favail",
                "f_ffree",
                "f_files",
                "f_flag",
                "f_frsize",
                "f_namemax",
            )
            return {k: getattr(sv, k) for k in keys}

        def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
            return 0  # directory changes reached the backing folder when they were made

        # - contents: held until a sync --
        def _opened(self, fd: int, flags: int) -> int:
            ino = os.fstat(fd).st_ino
            with self.guard:
                self.inode[fd] = ino
                self.open_count[ino] = self.open_count.get(ino, 0) + 1
                if flags & (os.O_SYNC | os.O_DSYNC):
                    self.sync_fh.add(fd)
                if flags & os.O_TRUNC:
                    self._overlay(fd).truncate(0)
            return fd

        def open(self, path: str, flags: int) -> int:
            # read-write whatever was asked (a partial page write reads the rest), and never
            # O_APPEND: the kernel sends every write with its offset
            fd = os.open(self._full(path), (flags & ~_STRIP) | os.O_RDWR)
            return self._opened(fd, flags)

        def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
            full = self._full(path)
            fd = os.open(full, (flags & ~_STRIP) | os.O_RDWR | os.O_CREAT, mode)
            self._owner(full)
            return self._opened(fd, flags)

        def _overlay(self, fh: int) -> Overlay:
            ino = self.inode[fh]
            over = self.overlays.get(ino)
            if over is None:
                over = self.overlays[ino] = Overlay(fh)
            return over

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            with self.guard:
                over = self.overlays.get(self.inode[fh])
                if over is not None:
                    return over.read(fh, offset, size)
            return os.pread(fh, size, offset)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            with self.guard:
                over = self._overlay(fh)
                over.write(fh, offset, data)
                if fh in self.sync_fh:
                    over.flush()
                if self.armed is not None:  # the power goes with this write unsynced
                    self._kill(self.armed)
                    self.armed = None
                    self.cut.set()
            return len(data)

        @staticmethod
        def _kill(pids: list[int]) -> None:
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)  # a leader's whole group (a postmaster's backends)
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

        def arm(self, pids: list[int], timeout: float) -> dict[str, Any]:
            """SIGKILL ``pids`` (and their process groups) at the next write to any file, while it
            is unsynced; after ``timeout`` seconds without a write, kill them anyway."""
            started = time.monotonic()
            with self.guard:
                self.cut.clear()
                self.armed = list(pids)
            on_write = self.cut.wait(timeout)
            with self.guard:
                if self.armed is not None:
                    self._kill(self.armed)
                    self.armed = None
            return {"on_write": on_write, "waited": round(time.monotonic() - started, 3)}

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            with self.guard:
                if fh is not None:
                    self._overlay(fh).truncate(length)
                    return 0
                fd = os.open(self._full(path), os.O_RDWR)
                try:
                    ino = os.fstat(fd).st_ino
                    over = self.overlays.get(ino)
                    if over is None:
                        over = self.overlays[ino] = Overlay(fd)
                    over.truncate(length)
                finally:
                    os.close(fd)
            return 0

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            with self.guard:
                over = self.overlays.pop(self.inode[fh], None)
                if over is not None:  # from now on the file is the backing file
                    over.flush()
                    over.close()
            return 0

        def flush(self, path: str, fh: int) -> int:
            return 0  # a close keeps nothing a disk would not

        def release(self, path: str, fh: int) -> int:
            with self.guard:
                ino = self.inode.pop(fh, None)
                self.sync_fh.discard(fh)
                if ino is not None:
                    self.open_count[ino] -= 1
                    if not self.open_count[ino]:
                        del self.open_count[ino]
                        if os.fstat(fh).st_nlink == 0:
                            self._forget(ino)
                os.close(fh)
            return 0

        # - control --
        def drop(self) -> dict[str, int]:
            with self.guard:
                dropped = {
                    "bytes": sum(o.pending for o in self.overlays.values()),
                    "files": len(self.overlays),
                }
                for over in self.overlays.values():
                    over.close()
                self.overlays.clear()
            return dropped

        def sync_all(self) -> dict[str, int]:
            with self.guard:
                synced = {
                    "bytes": sum(o.pending for o in self.overlays.values()),
                    "files": len(self.overlays),
                }
                for over in self.overlays.values():
                    over.flush()
                    over.close()
                self.overlays.clear()
            return synced

        def stats(self) -> dict[str, int]:
            with self.guard:
                return {"bytes": sum(o.pending for o in self.overlays.values()), "files": len(self.overlays)}

    return LazyOps()


def _serve(backing: str, mount: str, control_fd: int) -> None:
    """The file system process: mount, answer the controller, unmount when it goes away."""
    import mfusepy  # type: ignore[import-untyped,import-not-found,unused-ignore]

    ops = _operations(backing)
    control = socket.socket(fileno=control_fd)

    def answer() -> None:
        reader = control.makefile("r")
        if not ops.ready.wait(30):
            return
        control.sendall(b'{"ready": true}\n')
        for line in reader:
            try:
                command = json.loads(line)
                op = command.get("op")
                if op == "drop":
                    reply: dict[str, Any] = ops.drop()
                elif op == "sync":
                    reply = ops.sync_all()
                elif op == "stats":
                    reply = ops.stats()
                elif op == "arm":
                    reply = ops.arm([int(p) for p in command["pids"]], float(command["timeout"]))
                else:
                    reply = {"error": f"unknown command {line.strip()!r}"}
            except Exception as exc:  # said to the controller, never a dead file system
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            control.sendall((json.dumps(reply) + "\n").encode())
        # the controller closed its end (or died): let go of the mount
        subprocess.run(["fusermount3", "-u", "-z", mount], check=False, capture_output=True)

    threading.Thread(target=answer, daemon=True).start()
    # attribute and entry caches off: after a drop, sizes and names come from here again
    mfusepy.FUSE(
        ops,
        mount,
        foreground=True,
        allow_other=True,
        default_permissions=True,
        attr_timeout=0,
        entry_timeout=0,
        negative_timeout=0,
        fsname="wd-lazyfs",
    )


def main(argv: list[str]) -> int:
    """``python -m wd_chaos.control.lazyfs_server BACKING MOUNT CONTROL_FD``: serve until unmounted."""
    if len(argv) != 3:
        print("usage: python -m wd_chaos.control.lazyfs_server BACKING MOUNT CONTROL_FD", file=sys.stderr)
        return 64
    try:
        _serve(argv[0], argv[1], int(argv[2]))
    except RuntimeError as exc:  # mfusepy: fuse_main failed (the mount was refused)
        print(f"lazyfs: mount failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
