"""toxiproxy-python against the real toxiproxy-server v2.12.0, through our one module: each
partition mode does to a TCP connection what the harness says it does, and heal undoes it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from wd_chaos.control.toxi import Toxi
from wd_chaos.control.toxiproxy_server import TOXIPROXY_SERVER, local_toxiproxy
from without_durability.testing.servers import provide

# No skip when toxiproxy-server is missing: provide() fails with what to install, loudly.


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(1024):
            self.request.sendall(data)


@contextlib.contextmanager
def echo_server() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def echo(listen: str, timeout: float = 2.0) -> bytes:
    host, port = listen.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as conn:
        conn.sendall(b"ping")
        return conn.recv(16)


def broken(listen: str) -> bool:
    """True when a round trip through ``listen`` fails (refused, reset, empty, or no answer)."""
    try:
        return echo(listen, timeout=0.5) != b"ping"
    except OSError:  # refused, reset, timed out
        return True


@pytest.mark.parametrize("mode", ["down", "timeout", "reset_peer"])
def test_each_partition_mode_breaks_the_connection_and_heal_restores_it(mode: str) -> None:
    with provide(TOXIPROXY_SERVER) as server, echo_server() as port:
        toxi = Toxi(server.url)
        assert b"v2.12.0" in toxi._server.version()
        listen = toxi.proxy(f"wd-test-{mode}", f"127.0.0.1:{port}")
        try:
            assert not broken(listen)
            toxi.cut(f"wd-test-{mode}", mode)
            assert broken(listen), f"{mode} left the connection working"
            toxi.heal(f"wd-test-{mode}")
            assert not broken(listen), f"heal did not undo {mode}"
            toxi.cut(f"wd-test-{mode}", mode)
            toxi.heal_all()
            assert not broken(listen), f"heal_all did not undo {mode}"
        finally:
            toxi.remove_all()



def test_a_private_toxiproxy_that_dies_under_a_run_is_reported_with_its_log(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A toxiproxy-server that exits under a run takes every proxy with it (the run then fails on
    refused connections); its log is in a temporary folder, so its end is printed before that goes."""
    with local_toxiproxy() as server:
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while not _dead(server.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    err = capsys.readouterr().err
    assert "toxiproxy-server exited by itself" in err, err


def _dead(pid: int) -> bool:
    """Whether ``pid`` has exited and can be reaped: a zombie whose threads are all gone (a Go
    server's leader shows as a zombie while its other threads still exit, and until they have,
    its parent's wait sees nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            zombie = f.read().split(") ", 1)[1].startswith("Z")
        return zombie and len(os.listdir(f"/proc/{pid}/task")) <= 1
    except FileNotFoundError:
        return True
