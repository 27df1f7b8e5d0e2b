"""Every toxiproxy call the harness makes, behind one small interface.

It uses toxiproxy-python (the client the brief names). That client dates from 2019 and keeps its
server address in class attributes, so this module is the only place that touches it; it was
checked against toxiproxy-server v2.12.0 (create, disable/enable, add/destroy toxic, reset all work
there; v2.12 still accepts the POST updates the client sends). If a later server drops those, only
this module changes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

MODES = ("down", "timeout", "latency", "reset_peer")

CALL_TIMEOUT = 15.0
"""Seconds a toxiproxy API call may take before the server counts as stuck. A sound call answers
in milliseconds; one that waits on a connection whose reader has stopped answers when the reader
reads again, within a fault's span."""

T = TypeVar("T")


class ToxiproxyStuck(RuntimeError):
    """toxiproxy's control API did not answer a call within ``CALL_TIMEOUT`` seconds, and every
    later call of this ``Toxi`` fails at once with the same message.

    toxiproxy v2 (to v2.12.0 at least) adds or removes a toxic by interrupting every connection's
    chain of toxics while it holds the proxy's lock; a chain blocked handing data to a connection
    whose reader stopped reading never takes the interrupt, and if that connection then dies, its
    clean-up waits for the same lock: the control API stops answering for good (Shopify/toxiproxy
    issue 558). A run whose faults can no longer be placed or removed judged nothing it planned:
    ``wd_chaos.gate.run_judged`` runs such a case again on another seed, as it does an unknown
    run, and ``wd-chaos run`` exits 255 (the harness failed), never with a verdict."""

    run_dir: Path | None = None
    """The run folder of the run it ended (set by the runner; kept for a post-mortem)."""


class Toxi:
    """A toxiproxy server at ``url`` (its HTTP API). Every call is bounded: one that takes longer
    than ``timeout`` seconds raises ``ToxiproxyStuck``, as does every call after it."""

    def __init__(self, url: str, timeout: float = CALL_TIMEOUT) -> None:
        from toxiproxy import Toxiproxy
        from toxiproxy.api import APIConsumer

        parts = urlsplit(url)
        APIConsumer.host = parts.hostname or "127.0.0.1"
        APIConsumer.port = parts.port or 8474
        self._server: Any = Toxiproxy()
        self._proxies: dict[str, Any] = {}
        self._timeout = timeout
        self._stuck: str | None = None

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` (one or more API requests), given ``self._timeout`` seconds. The client sets no
        timeout of its own, so the call runs on a daemon thread that a stuck server may keep."""
        if self._stuck is not None:
            raise ToxiproxyStuck(self._stuck)
        box: dict[str, Any] = {}

        def call() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the caller below
                box["error"] = exc

        thread = threading.Thread(target=call, name=f"toxiproxy: {what}", daemon=True)
        thread.start()
        thread.join(self._timeout)
        if thread.is_alive():
            self._stuck = (
                f"toxiproxy did not answer '{what}' within {self._timeout:g} s: its control API is "
                "stuck (toxiproxy's deadlock when a connection stops reading or dies while a toxic is "
                "added or removed, Shopify/toxiproxy issue 558), so the run's network faults can no "
                "longer be placed or removed"
            )
            raise ToxiproxyStuck(self._stuck)
        if "error" in box:
            raise box["error"]
        value: T = box["value"]
        return value

    def proxy(self, name: str, upstream: str) -> str:
        """Create (replacing any of that name) a proxy to ``upstream`` (host:port); returns the
        host:port it listens on."""

        def create() -> Any:
            existing = self._server.get_proxy(name)
            if existing is not None:
                existing.destroy()
            return self._server.create(upstream=upstream, name=name, listen="127.0.0.1:0")

        made = self._call(f"create proxy {name}", create)
        self._proxies[name] = made
        return str(made.listen)

    def cut(self, name: str, mode: str) -> None:
        """Start fault ``mode`` on proxy ``name``: down (refuse and drop connections), timeout
        (hold data, never answer), latency (2 s each way), reset_peer (reset connections)."""
        if mode not in MODES:
            raise ValueError(f"partition mode must be one of {MODES}, got {mode!r}")
        proxy = self._proxies[name]

        def cut() -> None:
            if mode == "down":
                proxy.disable()
            elif mode == "timeout":
                for stream in ("upstream", "downstream"):
                    proxy.add_toxic(type="timeout", stream=stream, attributes={"timeout": 0})
            elif mode == "latency":
                for stream in ("upstream", "downstream"):
                    proxy.add_toxic(type="latency", stream=stream, attributes={"latency": 2000, "jitter": 200})
            else:
                proxy.add_toxic(type="reset_peer", stream="upstream", attributes={"timeout": 0})

        self._call(f"cut proxy {name} ({mode})", cut)

    def add(self, name: str, toxic: str, kind: str, stream: str, attributes: dict[str, int]) -> None:
        """Add toxiproxy's toxic ``kind`` (latency, bandwidth, slow_close, timeout, reset_peer,
        limit_data), named ``toxic``, on ``stream`` (upstream or downstream) of proxy ``name``."""
        proxy = self._proxies[name]
        self._call(
            f"add toxic {toxic} to proxy {name}",
            lambda: proxy.add_toxic(name=toxic, type=kind, stream=stream, attributes=attributes),
        )

    def remove(self, name: str, toxic: str) -> None:
        """Remove the toxic named ``toxic`` from proxy ``name`` (gone already: nothing to do)."""
        proxy = self._proxies[name]

        def remove() -> None:
            if toxic in proxy.toxics():
                proxy.destroy_toxic(toxic)

        self._call(f"remove toxic {toxic} from proxy {name}", remove)

    def heal(self, name: str) -> None:
        """End any fault on proxy ``name``."""
        proxy = self._proxies[name]

        def heal() -> None:
            for toxic in list(proxy.toxics()):
                proxy.destroy_toxic(toxic)
            proxy.enable()

        self._call(f"heal proxy {name}", heal)

    def heal_all(self) -> None:
        """Re-enable every proxy and remove every toxic."""
        self._call("reset every proxy", self._server.reset)

    def remove_all(self) -> None:
        """Delete the proxies this object made (each attempt bounded; a stuck server's proxies go
        with the server)."""
        for proxy in self._proxies.values():
            with contextlib.suppress(Exception):
                self._call(f"delete proxy {proxy.name}", proxy.destroy)
        self._proxies.clear()
