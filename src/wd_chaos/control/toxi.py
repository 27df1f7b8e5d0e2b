"""Every toxiproxy call the harness makes, behind one small interface.

It uses toxiproxy-python (the client the brief names). That client dates from 2019 and keeps its
server address in class attributes, so this module is the only place that touches it; it was
checked against toxiproxy-server v2.12.0 (create, disable/enable, add/destroy toxic, reset all work
there; v2.12 still accepts the POST updates the client sends). If a later server drops those, only
this module changes.
"""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import urlsplit

MODES = ("down", "timeout", "latency", "reset_peer")


class Toxi:
    """A toxiproxy server at ``url`` (its HTTP API)."""

    def __init__(self, url: str) -> None:
        from toxiproxy import Toxiproxy
        from toxiproxy.api import APIConsumer

        parts = urlsplit(url)
        APIConsumer.host = parts.hostname or "127.0.0.1"
        APIConsumer.port = parts.port or 8474
        self._server: Any = Toxiproxy()
        self._proxies: dict[str, Any] = {}

    def proxy(self, name: str, upstream: str) -> str:
        """Create (replacing any of that name) a proxy to ``upstream`` (host:port); returns the
        host:port it listens on."""
        existing = self._server.get_proxy(name)
        if existing is not None:
            existing.destroy()
        made = self._server.create(upstream=upstream, name=name, listen="127.0.0.1:0")
        self._proxies[name] = made
        return str(made.listen)

    def cut(self, name: str, mode: str) -> None:
        """Start fault ``mode`` on proxy ``name``: down (refuse and drop connections), timeout
        (hold data, never answer), latency (2 s each way), reset_peer (reset connections)."""
        proxy = self._proxies[name]
        if mode == "down":
            proxy.disable()
        elif mode == "timeout":
            for stream in ("upstream", "downstream"):
                proxy.add_toxic(type="timeout", stream=stream, attributes={"timeout": 0})
        elif mode == "latency":
            for stream in ("upstream", "downstream"):
                proxy.add_toxic(type="latency", stream=stream, attributes={"latency": 2000, "jitter": 200})
        elif mode == "reset_peer":
            proxy.add_toxic(type="reset_peer", stream="upstream", attributes={"timeout": 0})
        else:
            raise ValueError(f"partition mode must be one of {MODES}, got {mode!r}")

    def add(self, name: str, toxic: str, kind: str, stream: str, attributes: dict[str, int]) -> None:
        """Add toxiproxy's toxic ``kind`` (latency, bandwidth, slow_close, timeout, reset_peer,
        limit_data), named ``toxic``, on ``stream`` (upstream or downstream) of proxy ``name``."""
        self._proxies[name].add_toxic(name=toxic, type=kind, stream=stream, attributes=attributes)

    def remove(self, name: str, toxic: str) -> None:
        """Remove the toxic named ``toxic`` from proxy ``name`` (gone already: nothing to do)."""
        proxy = self._proxies[name]
        if toxic in proxy.toxics():
            proxy.destroy_toxic(toxic)

    def heal(self, name: str) -> None:
        """End any fault on proxy ``name``."""
        proxy = self._proxies[name]
        for toxic in list(proxy.toxics()):
            proxy.destroy_toxic(toxic)
        proxy.enable()

    def heal_all(self) -> None:
        """Re-enable every proxy and remove every toxic."""
        self._server.reset()

    def remove_all(self) -> None:
        """Delete the proxies this object made."""
        for proxy in self._proxies.values():
            with contextlib.suppress(Exception):
                proxy.destroy()
        self._proxies.clear()
