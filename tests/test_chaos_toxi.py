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


class _Flood(socketserver.BaseRequestHandler):
    """Sends until the connection dies: a reply its client never reads."""

    def handle(self) -> None:
        chunk = b"x" * 65536
        with contextlib.suppress(OSError):
            while True:
                self.request.sendall(chunk)


def test_a_stuck_toxiproxy_is_said_within_the_bound_and_every_later_call_fails_at_once() -> None:
    """toxiproxy's own deadlock (its issue 558), made on purpose: a client that stops reading
    blocks the chain an added toxic must interrupt, and its death then holds the proxy's lock for
    good. The call is given up after the bound with ``ToxiproxyStuck``, never waited on forever."""
    from wd_chaos.control.toxi import ToxiproxyStuck

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Flood)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with local_toxiproxy() as toxiproxy:
            toxi = Toxi(toxiproxy.url, timeout=2.0)
            listen = toxi.proxy("wd-test-flood", f"127.0.0.1:{server.server_address[1]}")
            host, port = listen.rsplit(":", 1)
            reader = socket.socket()
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reader.connect((host, int(port)))
            time.sleep(1.0)  # the buffers fill: the reader never reads
            started = time.monotonic()
            with pytest.raises(ToxiproxyStuck, match="add toxic slow-0 to proxy wd-test-flood"):
                toxi.add("wd-test-flood", "slow-0", "latency", "downstream", {"latency": 10})
            assert time.monotonic() - started < 5.0
            reader.close()  # the deadlock for good: the dead link's clean-up waits on the lock
            started = time.monotonic()
            with pytest.raises(ToxiproxyStuck, match="did not answer"):
                toxi.remove("wd-test-flood", "slow-0")
            with pytest.raises(ToxiproxyStuck):
                toxi.heal_all()
            assert time.monotonic() - started < 0.5, "a call after the first stuck one waited again"
            toxi.remove_all()  # bounded and quiet: the server goes next
    finally:
        server.shutdown()
        server.server_close()
