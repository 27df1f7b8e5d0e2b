"""toxiproxy-python against the real toxiproxy-server v2.12.0, through our one module: each
partition mode does to a TCP connection what the harness says it does, and heal undoes it."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from wd_chaos.control.toxi import Toxi
from wd_chaos.control.toxiproxy_server import TOXIPROXY_SERVER
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
