"""A private toxiproxy-server, what a partition fault puts between each worker and its store, and
the recipe that finds or starts one (``WD_TOXIPROXY_URL``, or the binary on PATH).
"""

from __future__ import annotations

import contextlib
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

from without_durability.testing.servers import (
    Server,
    ServerRecipe,
    executor,
    find_binary,
    free_port,
    own,
)


@contextlib.contextmanager
def local_toxiproxy(port: int | None = None) -> Iterator[Server]:
    """A private toxiproxy-server on a free loopback port; ``url`` is its HTTP API."""
    binary = find_binary("toxiproxy-server")
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="wd-toxiproxy-") as tmp:
        own(Path(tmp), port)
        ex = executor(
            [binary, "-host", "127.0.0.1", "-port", str(port)],
            "127.0.0.1",
            port,
            Path(tmp) / "toxiproxy.log",
            signal.SIGTERM,
        )
        ex.start()
        own(Path(tmp), port, int(ex.process.pid))
        try:
            yield Server(
                "toxiproxy", f"http://127.0.0.1:{port}", "127.0.0.1", port, "local", pid=int(ex.process.pid)
            )
        finally:
            with contextlib.suppress(Exception):
                ex.stop()


TOXIPROXY_SERVER = ServerRecipe("toxiproxy", "WD_TOXIPROXY_URL", (("toxiproxy-server", ""),), local_toxiproxy)
"""Where toxiproxy comes from: ``WD_TOXIPROXY_URL``, else a private instance. No container: the
proxies it makes must reach the store on this machine's loopback, which a container cannot."""
