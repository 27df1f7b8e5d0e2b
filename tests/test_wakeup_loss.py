"""A wakeup whose connection dies silently (a proxy, a NAT or a failover drops it: no data, no
error) notices and subscribes again on a new connection within the bound its store documents:
Postgres's ``PostgresWakeup`` (LISTEN) and the Redis stream's blocking read.

The silent death is real: the wakeup reaches the real server through a TCP relay in this test
that, asked to, stops passing anything on the connections it carries (their sockets stay open and
are read from) while it relays new connections as before, which is what a dropped NAT entry or a
proxy that lost its upstream looks like to the client.

Run with ``--wd-store postgres`` and ``--wd-store redis-stream``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from without_durability.testing.harness import StoreUnderTest
from without_durability_postgres import PostgresWakeup
from without_durability_postgres.wakeup import CHANNEL
from without_durability_redis import RedisStreamScheduler
from without_durability_redis.schedulers import WAIT_GRACE

pytestmark = [pytest.mark.asyncio]

Store = StoreUnderTest[Any]
_ids = itertools.count()


class Relay:
    """A TCP relay on a loopback port to ``host:port``. ``blackhole()`` makes every connection it
    carries half-open: kept open, read from, nothing passed on either way; later connections are
    relayed as before."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.carried: list[dict[str, bool]] = []
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self.listen = 0

    async def __aenter__(self) -> Relay:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.listen = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.close()
        with contextlib.suppress(Exception):
            await self._server.wait_closed()

    def blackhole(self) -> None:
        for conn in self.carried:
            conn["dead"] = True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self._writers += [writer, up_writer]
        conn = {"dead": False}
        self.carried.append(conn)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                if not conn["dead"]:
                    dst.write(data)
                    await dst.drain()
            if not conn["dead"]:  # a clean close is passed on; a dead connection says nothing
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)


@contextlib.asynccontextmanager
async def relay_to(host: str, port: int) -> AsyncIterator[Relay]:
    async with Relay(host, port) as relay:
        yield relay


async def eventually(what: str, cond: Any, within: float) -> float:
    """Seconds until ``cond()`` held (failing with ``what`` past ``within``)."""
    began = time.monotonic()
    while not cond():
        assert time.monotonic() - began < within, f"{what} not within {within:g}s"
        await asyncio.sleep(0.05)
    return time.monotonic() - began


@pytest.mark.wd_store("postgres")
async def test_a_postgres_listener_whose_connection_went_silent_listens_again(wd_store: Store) -> None:
    pool = wd_store.extra["pool"]
    params = conninfo_to_dict(pool.conninfo)
    namespace = f"silent-{next(_ids)}"
    async with relay_to(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)) as relay:
        conninfo = make_conninfo(pool.conninfo, host="127.0.0.1", port=str(relay.listen))
        wakeup = PostgresWakeup(
            pool,
            namespace=namespace,
            conninfo=conninfo,
            health_every=timedelta(seconds=0.5),
            health_timeout=timedelta(seconds=0.5),
            reconnect_after=timedelta(seconds=0.2),
        )
        async with wakeup:
            first = wakeup.backend_pid
            relay.blackhole()  # the LISTEN session goes silent: no notification, no error
            bound = wakeup.resubscribe_bound.total_seconds()
            took = await eventually("a new LISTEN", lambda: wakeup.resubscribed >= 1, bound + 2)
            assert took <= bound + 1, f"re-subscribed after {took:.1f}s, past its bound of {bound:g}s"
            assert wakeup.backend_pid not in (None, first)

            async def notify() -> None:
                await asyncio.sleep(0.3)
                async with pool.connection() as c:
                    await c.execute("SELECT pg_notify(%s, %s)", (CHANNEL, namespace))

            await wakeup.wait(timedelta(milliseconds=1))  # forget the wake-all of the reconnect
            sent = asyncio.create_task(notify())
            began = time.monotonic()
            await wakeup.wait(timedelta(seconds=10))
            await sent
            assert time.monotonic() - began < 3, "the new LISTEN did not hear the notification"


@pytest.mark.wd_store("postgres")
async def test_the_listener_health_settings_are_checked(wd_store: Store) -> None:
    from without_durability.errors import InvalidInput

    with pytest.raises(InvalidInput, match="health_every"):
        PostgresWakeup(wd_store.extra["pool"], health_every=timedelta(0))
    wakeup = PostgresWakeup(wd_store.extra["pool"])
    assert wakeup.resubscribe_bound == timedelta(seconds=10)  # the module docstring's figure


@pytest.mark.wd_store("redis-stream")
async def test_a_stream_wait_whose_connection_went_silent_reads_again(wd_store: Store) -> None:
    from redis.asyncio import Redis

    url = urlsplit(wd_store.extra["server"].url)
    async with relay_to(url.hostname or "127.0.0.1", url.port or 6379) as relay:
        relayed = urlunsplit(url._replace(netloc=f"{url.netloc.rpartition('@')[0]}@127.0.0.1:{relay.listen}".lstrip("@")))
        wait_client: Any = Redis.from_url(relayed)  # no socket timeout: the scheduler bounds its reads
        try:
            sched = RedisStreamScheduler(
                wd_store.extra["client"],
                prefix=wd_store.extra["prefix"],
                namespace=f"silent-{next(_ids)}",
                wait_client=wait_client,
            )
            visibility = timedelta(seconds=30)
            assert await sched.take(visibility) is None
            await sched.wait(timedelta(milliseconds=50))  # the read's connection is open
            relay.blackhole()
            assert await sched.take(visibility) is None
            began = time.monotonic()
            await sched.wait(timedelta(seconds=1))  # its read is never answered
            lost_after = time.monotonic() - began
            assert sched.reads_lost == 1
            assert lost_after <= 1 + WAIT_GRACE.total_seconds() + 1, f"a dead read held {lost_after:.1f}s"

            assert await sched.take(visibility) is None
            wf = f"silent-wf-{next(_ids)}"

            async def arrive() -> None:
                await asyncio.sleep(0.3)
                await sched.schedule(wf)

            sent = asyncio.create_task(arrive())
            began = time.monotonic()
            async with asyncio.timeout(5):
                await sched.wait(timedelta(seconds=10))  # on a new connection: woken by the entry
            await sent
            assert time.monotonic() - began < 3, "the wait after a lost read was not woken by an arrival"
            assert sched.resubscribed == 1
            got = await sched.take(visibility)
            assert got is not None and got.workflow == wf
        finally:
            await wait_client.aclose()
