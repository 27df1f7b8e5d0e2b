"""The bad-network fault kinds (``wd_chaos.faults``: latency, reset, half-open, slow-close,
bandwidth): each kind's bite, the ``slow-network`` bite over them, and ``half-open-gives-up``, on
small written histories (each shown to say yes and no); and the toxics themselves against the real
toxiproxy-server, through ``Toxi.add``/``Toxi.remove``."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from wd_chaos.checks.core import UNKNOWN, not_bitten
from wd_chaos.control.toxi import Toxi
from wd_chaos.control.toxiproxy_server import TOXIPROXY_SERVER
from wd_chaos.faults.bandwidth import bandwidth_slowed
from wd_chaos.faults.half_open import GIVE_UP, gives_up, half_open_replaced
from wd_chaos.faults.latency import latency_lapsed
from wd_chaos.faults.reset import reset_unknown
from wd_chaos.faults.slow_close import slow_close_waited
from wd_chaos.faults.toxics import slow_network
from without_durability.testing.servers import provide

S = 1_000_000_000  # ns
SLOW, OTHER = 101, 102


class History:
    """A small history: operations and fault windows, by the second."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.n = 0

    def op(
        self, pid: int, f: str, start: float, end: float | None, outcome: str = "ok", **fields: Any
    ) -> None:
        self.n += 1
        op = f"p{pid}:{self.n}"
        base = {"op": op, "f": f, "pid": pid, "process": f"worker-{pid}", **fields}
        self.lines.append({"type": "invoke", "mono": int(start * S), **base})
        if end is not None:
            self.lines.append({"type": "complete", "mono": int(end * S), "outcome": outcome, **base})

    def fault(self, kind: str, start: float, stop: float, pid: int = SLOW) -> None:
        ident = f"{kind}-{len(self.lines)}"
        for phase, at in (("start", start), ("stop", stop)):
            self.lines.append(
                {
                    "type": "fault",
                    "fault": kind,
                    "phase": phase,
                    "id": ident,
                    "mono": int(at * S),
                    "target_pid": pid,
                }
            )

    def ops(self) -> list[dict[str, Any]]:
        return sorted(self.lines, key=lambda line: line["mono"])


def test_latency_bites_on_a_takeover_of_the_slowed_workers_workflow_while_it_was_on() -> None:
    h = History()
    h.op(SLOW, "claim", 1.0, 1.1, workflow="w", token=1)
    h.fault("latency", 2.0, 8.0)
    h.op(SLOW, "record", 2.1, 7.0, "fenced", workflow="w", token=1)
    assert latency_lapsed(h.ops(), {}).valid == UNKNOWN  # slowed, but nobody took it over
    h.op(OTHER, "claim", 6.0, 6.1, workflow="w", token=2)
    verdict = latency_lapsed(h.ops(), {})
    assert verdict.valid is True and verdict.counts == {"faults": 1, "bit": 1}
    late = History()
    late.op(SLOW, "claim", 1.0, 1.1, workflow="w", token=1)
    late.fault("latency", 2.0, 4.0)
    late.op(OTHER, "claim", 5.0, 5.1, workflow="w", token=2)  # after the latency: not its doing
    assert latency_lapsed(late.ops(), {}).valid == UNKNOWN


def test_latency_counts_a_takeover_asked_for_while_on_and_granted_when_the_slowed_commit_let_go() -> None:
    # Postgres: the other worker's claim waits on the row lock of the slowed worker's transaction,
    # which commits only once the toxic is gone, so the takeover completes just after the window.
    h = History()
    h.op(SLOW, "claim", 1.0, 1.1, workflow="w", token=1)
    h.fault("latency", 2.0, 8.0)
    h.op(SLOW, "record", 2.1, 8.05, workflow="w", token=1)
    h.op(OTHER, "claim", 6.5, 8.06, workflow="w", token=2)
    h.op(SLOW, "transact", 8.07, 8.08, "fenced", workflow="w", token=1)
    verdict = latency_lapsed(h.ops(), {})
    assert verdict.valid is True and verdict.counts == {"faults": 1, "bit": 1}
    # The same claim after the slowed worker asked to release the workflow is a plain hand-over.
    released = History()
    released.op(SLOW, "claim", 1.0, 1.1, workflow="w", token=1)
    released.fault("latency", 2.0, 8.0)
    released.op(SLOW, "release", 5.0, 8.05, workflow="w", token=1)
    released.op(OTHER, "claim", 6.5, 8.06, workflow="w", token=2)
    assert latency_lapsed(released.ops(), {}).valid == UNKNOWN
    # A claim asked for and granted after the window is still not the latency's doing.
    after = History()
    after.op(SLOW, "claim", 1.0, 1.1, workflow="w", token=1)
    after.fault("latency", 2.0, 8.0)
    after.op(OTHER, "claim", 8.5, 8.6, workflow="w", token=2)
    assert latency_lapsed(after.ops(), {}).valid == UNKNOWN


def test_reset_bites_on_a_call_of_the_reset_worker_left_unknown_while_it_was_on() -> None:
    h = History()
    h.fault("reset", 2.0, 3.0)
    h.op(OTHER, "record", 2.1, 2.2, "unknown")  # another worker's: not this reset's
    h.op(SLOW, "record", 2.1, 2.2, "fenced")  # answered: its outcome is known
    assert reset_unknown(h.ops(), {}).valid == UNKNOWN
    h.op(SLOW, "record", 2.5, 2.6, "unknown", error="StoreUnavailable: connection reset")
    assert reset_unknown(h.ops(), {}).valid is True


def test_half_open_bites_on_a_call_that_hung_failed_and_was_followed_by_an_answered_one() -> None:
    h = History()
    h.fault("half-open", 2.0, 9.0)
    h.op(SLOW, "record", 2.1, 2.2, "unknown")  # failed at once: a refusal, not a hang
    h.op(SLOW, "record", 2.5, 7.5, "unknown")  # hung 5 s, then the store gave up
    assert half_open_replaced(h.ops(), {}).valid == UNKNOWN  # no answered call after it yet
    h.op(SLOW, "record", 9.5, 9.6, "fenced")
    assert half_open_replaced(h.ops(), {}).valid is True


def test_half_open_gives_up_fails_a_call_still_waiting_when_the_toxic_went() -> None:
    timed = History()
    timed.fault("half-open", 2.0, 9.0)
    timed.op(SLOW, "record", 2.5, 7.5, "unknown")  # gave up after 5 s
    timed.op(SLOW, "take", 7.6, 9.0, "unknown")  # waited only as long as the toxic stayed
    assert gives_up(timed.ops(), {}).valid is True
    never = History()
    never.fault("half-open", 2.0, 9.0)
    never.op(SLOW, "record", 2.5, 8.9, "unknown")  # ended only when toxiproxy closed it
    never.op(SLOW, "effect", 2.0, 9.5)  # not a store call: never judged
    verdict = gives_up(never.ops(), {})
    assert verdict.valid is False and [e["f"] for e in verdict.evidence] == ["record"]
    short = History()
    short.fault("half-open", 2.0, 2.0 + GIVE_UP - 1)  # shorter than a timeout: cannot judge
    short.op(SLOW, "record", 2.1, 2.0 + GIVE_UP - 0.9, "unknown")
    assert gives_up(short.ops(), {}).valid == UNKNOWN


def test_slow_close_bites_on_a_call_that_waited_on_a_cut_short_connection() -> None:
    h = History()
    h.fault("slow-close", 2.0, 4.0)
    h.op(SLOW, "take", 2.1, 2.15, "unknown")  # cut and closed at once
    assert slow_close_waited(h.ops(), {}).valid == UNKNOWN
    h.op(SLOW, "take", 2.2, 3.7, "unknown")
    assert slow_close_waited(h.ops(), {}).valid is True
    early = History()
    early.fault("slow-close", 2.0, 4.0)
    early.op(SLOW, "take", 1.98, 3.5, "unknown")  # sent as the toxics landed, before the start line
    assert slow_close_waited(early.ops(), {}).valid is True


def test_bandwidth_bites_on_a_call_far_slower_than_its_kinds_usual() -> None:
    h = History()
    for i in range(10):
        h.op(OTHER, "load", i, i + 0.01)
    h.fault("bandwidth", 20.0, 23.0)
    h.op(SLOW, "load", 20.1, 20.12)  # as fast as ever
    h.op(SLOW, "load", 20.2, 20.23)  # three times the usual, but under the floor: noise
    assert bandwidth_slowed(h.ops(), {}).valid == UNKNOWN
    h.op(SLOW, "load", 21.0, 21.5)
    assert bandwidth_slowed(h.ops(), {}).valid is True


def test_slow_network_needs_every_kind_that_ran_to_bite() -> None:
    h = History()
    h.op(SLOW, "claim", 1.0, 1.1, workflow="w", token=1)
    h.fault("latency", 2.0, 8.0)
    h.op(OTHER, "claim", 6.0, 6.1, workflow="w", token=2)
    h.fault("reset", 9.0, 10.0, pid=OTHER)
    missed = slow_network(h.ops(), {})
    assert missed.valid == UNKNOWN and "reset" in missed.summary
    assert not_bitten(missed.name, missed.valid, missed.counts)  # the run says "not tested"
    h.op(OTHER, "record", 9.1, 9.2, "unknown")
    both = slow_network(h.ops(), {})
    assert both.valid is True and both.counts["latency bit"] == 1 and both.counts["reset bit"] == 1
    assert slow_network(History().ops(), {}).valid == UNKNOWN  # nothing injected, nothing tested


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(1024):
            self.request.sendall(data)


@contextlib.contextmanager
def echo_server() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _round_trip(listen: str, timeout: float) -> float:
    """Seconds one echo through ``listen`` takes; raises OSError when it breaks."""
    host, port = listen.rsplit(":", 1)
    began = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout) as conn:
        conn.sendall(b"ping")
        if conn.recv(16) != b"ping":
            raise ConnectionResetError("no echo")
    return time.monotonic() - began


TOXICS = [
    ("latency", "downstream", {"latency": 400, "jitter": 0}, "slow"),
    ("timeout", "downstream", {"timeout": 0}, "broken"),
    ("reset_peer", "upstream", {"timeout": 0}, "broken"),
]


def test_a_toxic_added_changes_the_connection_and_removed_restores_it() -> None:
    # one server for the three (a toxiproxy-server takes seconds to start on a loaded machine)
    with provide(TOXIPROXY_SERVER) as server, echo_server() as port:
        toxi = Toxi(server.url)
        try:
            for kind, stream, attributes, effect in TOXICS:
                listen = toxi.proxy(f"wd-net-{kind}", f"127.0.0.1:{port}")
                assert _round_trip(listen, 2.0) < 0.3, kind
                toxi.add(f"wd-net-{kind}", "t", kind, stream, attributes)
                if effect == "slow":
                    assert _round_trip(listen, 2.0) >= 0.35, kind
                else:
                    with pytest.raises(OSError):
                        _round_trip(listen, 0.5)
                toxi.remove(f"wd-net-{kind}", "t")
                toxi.remove(f"wd-net-{kind}", "t")  # gone already: nothing to do
                assert _round_trip(listen, 2.0) < 0.3, f"removing {kind} did not restore the connection"
        finally:
            toxi.remove_all()
