"""The power-loss file system (``wd_chaos.control.lazyfs``): what was fsynced survives a drop, what was not
is gone, and the rename, truncate and append patterns SQLite's WAL, Redis's AOF and Postgres's data
folder rely on behave as on a disk. Real FUSE mounts; in CI (``CI`` set) a machine without FUSE
fails this module, elsewhere it skips saying why."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from wd_chaos.control.lazyfs import Dropped, LazyFS, why_unavailable

_why = why_unavailable()
if _why:
    if os.environ.get("CI"):
        pytest.fail(f"{_why}: CI must run the power-loss tests", pytrace=False)
    pytest.skip(_why, allow_module_level=True)


@dataclass
class Mounted:
    """One test's folder on the module's mount (a mount takes about a second to come up)."""

    lazy: LazyFS
    mount: Path
    backing: Path

    def drop(self) -> Dropped:
        return self.lazy.drop()

    def sync(self) -> Dropped:
        return self.lazy.sync()

    def pending(self) -> Dropped:
        return self.lazy.pending()


@pytest.fixture(scope="module")
def lazyfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LazyFS]:
    base = tmp_path_factory.mktemp("lazyfs")
    with LazyFS(base / "backing", base / "mnt") as lazy:
        yield lazy


@pytest.fixture
def fs(lazyfs: LazyFS, request: pytest.FixtureRequest) -> Mounted:
    lazyfs.sync()  # what an earlier test left is on the disk now
    name = request.node.name.replace("[", "-").replace("]", "")
    (lazyfs.mount / name).mkdir()
    return Mounted(lazyfs, lazyfs.mount / name, lazyfs.backing / name)


def _write(path: Path, data: bytes, *, sync: bool, flags: int = os.O_CREAT | os.O_WRONLY) -> None:
    fd = os.open(path, flags, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def test_unsynced_write_is_gone_after_a_drop_and_closing_kept_nothing(fs: Mounted) -> None:
    path = fs.mount / "f"
    _write(path, b"never synced", sync=False)
    assert path.read_bytes() == b"never synced", "a reader sees unsynced writes before the power goes"
    dropped = fs.drop()
    assert dropped.bytes == len(b"never synced") and dropped.files == 1, f"dropped: {dropped}"
    assert path.exists(), "the file's creation reached the disk (directory changes are not held)"
    assert path.read_bytes() == b"", f"after the drop: expected nothing, got {path.read_bytes()!r}"


def test_fsynced_write_survives_and_later_ones_are_cut(fs: Mounted) -> None:
    path = fs.mount / "f"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    os.write(fd, b"kept")
    os.fdatasync(fd)
    os.write(fd, b"+lost")
    os.pwrite(fd, b"K", 0)  # an overwrite of a synced byte is lost too
    os.close(fd)
    assert path.read_bytes() == b"Kept+lost"
    assert fs.drop().bytes == len(b"+lost") + 1
    assert path.read_bytes() == b"kept", f"after the drop: {path.read_bytes()!r}"
    assert fs.drop().bytes == 0, "a second drop finds nothing"


def test_sync_all_writes_everything_through(fs: Mounted) -> None:
    _write(fs.mount / "a", b"x" * 10_000, sync=False)
    assert fs.pending().bytes == 10_000
    assert fs.sync().bytes == 10_000
    assert fs.drop().bytes == 0
    assert (fs.mount / "a").read_bytes() == b"x" * 10_000
    assert (fs.backing / "a").read_bytes() == b"x" * 10_000


def test_append_only_log_keeps_its_synced_prefix(fs: Mounted) -> None:
    """Redis's AOF: O_APPEND writes, an fdatasync after some of them."""
    path = fs.mount / "appendonly.aof"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    for i in range(5):
        os.write(fd, f"cmd{i};".encode())
        if i == 2:
            os.fdatasync(fd)
    os.close(fd)
    assert path.read_bytes() == b"cmd0;cmd1;cmd2;cmd3;cmd4;"
    fs.drop()
    assert path.read_bytes() == b"cmd0;cmd1;cmd2;", f"after the drop: {path.read_bytes()!r}"


def test_truncate_then_grow_reads_zeros_and_an_unsynced_truncate_is_undone(fs: Mounted) -> None:
    path = fs.mount / "f"
    _write(path, b"a" * 9000, sync=True)
    with open(path, "r+b") as f:
        f.truncate(100)
        f.seek(5000)
        f.write(b"b")
        f.flush()
        got = path.read_bytes()
        assert got == b"a" * 100 + bytes(4900) + b"b", (
            "bytes a truncate cut must read as zeros when the file grows"
        )
        os.fsync(f.fileno())
    assert (fs.backing / "f").read_bytes() == got, "the sync wrote the truncated-and-grown file through"
    with open(path, "r+b") as f:
        f.truncate(10)
    assert path.stat().st_size == 10
    fs.drop()
    assert path.read_bytes() == got, "an unsynced truncate is lost with the power"


def test_rename_of_a_synced_temporary_file_survives(fs: Mounted) -> None:
    """The write-temp, fsync, rename pattern (Redis's manifest, Postgres's control file)."""
    _write(fs.mount / "manifest", b"old", sync=True)
    _write(fs.mount / "manifest.tmp", b"new", sync=True)
    os.rename(fs.mount / "manifest.tmp", fs.mount / "manifest")
    _write(fs.mount / "other.tmp", b"unsynced", sync=False)
    os.rename(fs.mount / "other.tmp", fs.mount / "other")
    fs.drop()
    assert (fs.mount / "manifest").read_bytes() == b"new"
    assert (fs.mount / "other").read_bytes() == b"", "a renamed file keeps only what was synced"
    assert not (fs.mount / "manifest.tmp").exists()


def test_o_dsync_writes_are_synced_as_they_are_made(fs: Mounted) -> None:
    _write(fs.mount / "wal", b"durable", sync=False, flags=os.O_CREAT | os.O_WRONLY | os.O_DSYNC)
    assert fs.drop().bytes == 0
    assert (fs.mount / "wal").read_bytes() == b"durable"


def test_unlinked_file_leaves_nothing_behind(fs: Mounted) -> None:
    _write(fs.mount / "gone", b"x" * 5000, sync=False)
    os.unlink(fs.mount / "gone")
    assert fs.pending().files == 0


@pytest.mark.parametrize(("synchronous", "survives"), [("FULL", True), ("OFF", False)])
def test_sqlite_wal_commits_survive_a_drop_only_when_synced(
    fs: Mounted, synchronous: str, survives: bool
) -> None:
    """SQLite in WAL mode (its -shm mapped over FUSE): FULL fsyncs the WAL at every commit, OFF never."""
    path = fs.mount / "store.db"
    setup = sqlite3.connect(path)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE t (v INTEGER)")
    setup.commit()
    setup.close()
    fs.sync()  # the schema was on disk before the run
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA synchronous={synchronous}")
    for i in range(20):
        conn.execute("INSERT INTO t VALUES (?)", (i,))
    assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 20
    dropped = fs.drop()
    conn.close()  # after the power went: what the close writes is not counted
    fs.drop()
    after = sqlite3.connect(path)
    count = after.execute("SELECT count(*) FROM t").fetchone()[0]
    after.close()
    if survives:
        assert count == 20, f"synchronous={synchronous}: expected every commit, found {count}"
    else:
        assert dropped.bytes > 0 and count < 20, f"synchronous={synchronous}: {count} rows, dropped {dropped}"


def test_a_machine_without_fuse_makes_a_power_loss_run_a_harness_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused FUSE is exit 255 naming why (here: no fusermount3), never a verdict; nothing runs."""
    from click.testing import CliRunner

    import wd_chaos.control.lazyfs
    from wd_chaos.cli import CRASHED, main

    real_which = wd_chaos.control.lazyfs.shutil.which
    monkeypatch.setattr(
        wd_chaos.control.lazyfs.shutil,
        "which",
        lambda name, *a, **k: None if name == "fusermount3" else real_which(name),
    )
    args = ["run", "power-loss", "--store", "sqlite", "--time-limit", "6", "--report-dir", str(tmp_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == CRASHED, f"expected exit {CRASHED}, got {result.exit_code}: {result.output}"
    assert "FUSE" in result.output and "fusermount3" in result.output, result.output
    assert "Traceback" not in result.output
