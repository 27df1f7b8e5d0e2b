"""A private toxiproxy-server, what a partition fault puts between each worker and its store, and
the recipe that finds or starts one (``WD_TOXIPROXY_URL``, or the binary on PATH).
"""

from __future__ import annotations

import contextlib
import signal
import sys
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
            code = ex.process.poll()
            if code is not None:  # it died under the run: say why, before its folder goes
                _tell_death(code, Path(tmp) / "toxiproxy.log")
            with contextlib.suppress(Exception):
                ex.stop()


def _tell_death(code: int, log: Path, lines: int = 40) -> None:
    """Print, on stderr, that the private toxiproxy-server exited on its own (every proxy of the
    run went with it, so its calls were refused) and the end of its log, which lives in a
    temporary folder removed next."""
    try:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError as exc:
        tail = [f"(its log could not be read: {exc})"]
    print(
        f"wd-chaos: the private toxiproxy-server exited by itself (code {code}) during the run; "
        "the end of its log:\n" + "\n".join(tail),
        file=sys.stderr,
    )


def login_toxiproxy(url: str, timeout: float) -> None:
    """GET the API's ``/version`` at ``url`` within about ``timeout`` seconds: a toxiproxy answers
    its version (plain text, or a JSON object); raises when nothing, or not JSON that says so."""
    import json
    import urllib.request
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    version = urlunsplit(parts._replace(path="/version", query="", fragment=""))
    with urllib.request.urlopen(version, timeout=timeout) as answer:  # toxiproxy's API answers its version
        body = answer.read(4096).decode("utf-8", "replace").strip()
    if not body:
        raise ValueError("GET /version answered nothing (a toxiproxy server answers its version)")
    if body.startswith("{"):
        json.loads(body)


TOXIPROXY_SERVER = ServerRecipe(
    "toxiproxy",
    "WD_TOXIPROXY_URL",
    (("toxiproxy-server", ""),),
    local_toxiproxy,
    schemes=(("http", 80), ("https", 443)),
    login=login_toxiproxy,
    example="http://host:8474",
)
"""Where toxiproxy comes from: ``WD_TOXIPROXY_URL``, else a private instance. No container: the
proxies it makes must reach the store on this machine's loopback, which a container cannot."""
