"""The Lua scripts, loaded once from package data and called by SHA (EVALSHA, loading the script on
NOSCRIPT), and the boundary where the driver's errors become this library's."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import cache
from importlib.resources import files
from typing import Any, TypeAlias

import redis.asyncio
import redis.asyncio.cluster
import redis.exceptions
from redis.commands.core import AsyncScript

try:  # hiredis packs a command in C, ten times faster than redis-py's asyncio packer in Python
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - the [redis] extra brings hiredis
    _hiredis_pack = None  # type: ignore[assignment]

from without_durability.errors import StoreError, StoreUnavailable

Client: TypeAlias = "redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster"
"""A redis.asyncio client: a standalone ``Redis`` or a ``RedisCluster``."""

_Call: TypeAlias = "tuple[AsyncScript, list[object], asyncio.Future[Any], bytes]"
"""A waiting call: its script, its EVALSHA arguments, the future its caller awaits, and the call
packed by hiredis (empty when the batch goes through redis-py)."""

_PRELUDES = {
    "checkpoint": ("_common", "_checkpoint"),
    "stream": ("_common", "_stream"),
    "plain": ("_common",),
}
SCRIPTS = {
    **dict.fromkeys(
        ("claim", "renew", "release", "discard", "record", "supply", "append", "transact"), "checkpoint"
    ),
    **dict.fromkeys(
        (
            "set_schedule",
            "set_take",
            "set_wake",
            "set_answer_take",
            "set_take_many",
            "set_finish_many",
            "set_cancel",
            "now",
        ),
        "plain",
    ),
    **dict.fromkeys(
        (
            "stream_schedule",
            "stream_take",
            "stream_wake",
            "stream_cancel",
            "stream_idle",
            "stream_answer_take",
            "stream_take_many",
            "stream_finish_many",
        ),
        "stream",
    ),
}
"""Every script by name, with the prelude it is loaded after."""
EFFECT_MARK = "--[[effect]]"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


@cache
def _file(name: str) -> str:
    return (files(__package__) / "scripts" / f"{name}.lua").read_text(encoding="utf-8")


@cache
def script_source(name: str) -> str:
    """The full text of script ``name`` as sent to the server: its prelude files, then the script
    (``transact`` still holds the ``--[[effect]]`` mark an effect's source replaces). For tools
    that run the raw script (a benchmark's ceiling) or break it on purpose (a mutation test)."""
    if name not in SCRIPTS:
        raise ValueError(f"no script {name!r}; the scripts are {sorted(SCRIPTS)}")
    return "\n".join([*(_file(p) for p in _PRELUDES[SCRIPTS[name]]), _file(name)])


class Scripts:
    """One client's registered scripts. ``run`` calls a script by name; ``run_source`` calls a
    script built at run time (a TRANSACT with an effect spliced in), keeping the most recent few
    hundred registered so a steady set of effects is hashed once.

    With ``coalesce`` (a standalone client only), the ``run`` calls made in one turn of the event
    loop go out together as one pipeline: still one script per call, but one write and one read of
    the socket for all of them, where the driver's per-command cost is most of the time a call
    takes. Each call gets its own reply or error, as it would alone. With hiredis installed and a
    pooled client, each call is packed by hiredis as it joins and the batch written on a pooled
    connection of the client's own (its retry policy kept), instead of through redis-py's pipeline,
    whose Python packer was about half of the client's time per delivery.

    Those batches are also written early: once the calls waiting are at least two, as many as
    those already at the server, and half as many as were in flight after the last write, they are
    written at once, on a connection kept from an earlier batch, rather than at the end of the turn
    (and only while the pool has a connection to spare for the turn's later calls). Redis then runs
    one half of the calls while the client makes the other, where otherwise the two take turns,
    each idle while the other works. Kept connections go back to the pool once nothing is waiting
    or in flight.

    A call whose caller was cancelled (``Task.cancel()``, a ``wait_for`` timeout) before its batch
    was written is left out of the batch: it never reaches the server, as a call made alone would
    not. That is checked at the last moment, once the batch has its connection (a pool that makes
    the batch wait for one may see callers give up meanwhile). A caller cancelled after its batch
    was written gets ``CancelledError`` and the call's outcome is unknown (it may have run)."""

    _CACHE = 256

    def __init__(self, client: Client, overrides: Mapping[str, str], *, coalesce: bool = False) -> None:
        self._client = client
        self._overrides = dict(overrides)
        self._named: dict[str, AsyncScript] = {}
        self._built: OrderedDict[str, AsyncScript] = OrderedDict()
        self._ready = not isinstance(client, redis.asyncio.cluster.RedisCluster)
        self._coalesce = coalesce and isinstance(client, redis.asyncio.Redis)
        self._waiting: list[_Call] = []
        self._direct = (
            self._coalesce
            and _hiredis_pack is not None
            # a single-connection client (its connection made on first use) serializes on its own lock
            and not getattr(client, "single_connection_client", False)
            and getattr(client, "connection", None) is None
            and _utf8_strict(client)
        )
        self._sending: set[asyncio.Task[None]] = set()
        self._flying = 0  # calls written whose replies are not handed out yet
        self._half = 0  # half the calls in flight after the last write: the next early write's size
        self._kept: list[Any] = []  # pooled connections kept between batches, nothing left to read

    async def ready(self) -> None:
        """Make sure the client is ready for concurrent commands. A ``RedisCluster`` is set up
        explicitly first: redis-py 8.1 lets concurrent first commands race its lazy setup, and one
        of them fails on a half-made connection. ``initialize`` itself is serialized by a lock."""
        if not self._ready:
            assert isinstance(self._client, redis.asyncio.cluster.RedisCluster)
            await self._client.initialize()
            self._ready = True

    async def run(
        self, name: str, keys: Sequence[str], args: Sequence[object], client: Any = None
    ) -> Any:
        """Run script ``name`` with ``keys`` and ``args`` (on ``client``, one connection of this
        client's pool, when given)."""
        if not self._ready:
            await self.ready()
        script = self._named.get(name)
        if script is None:
            body = self.source(name)
            script = self._named[name] = self._client.register_script(body)
        if not self._coalesce or client is not None:  # one connection asked for: no batching
            return await script(keys=list(keys), args=[_arg(a) for a in args], client=client)
        call: list[object] = [len(keys), *keys, *[a if type(a) in _PLAIN else _arg(a) for a in args]]
        packed = b""
        if self._direct:  # packed before joining, so a call that cannot be packed joins nothing
            assert _hiredis_pack is not None
            # hiredis's stub types the tuple as one element; any number of str/bytes/int is meant
            packed = _hiredis_pack(("EVALSHA", script.sha, *call))  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Any] = loop.create_future()
        if not self._waiting:
            loop.call_soon(self._send)  # after every call made in this turn has joined
        self._waiting.append((script, call, reply, packed))
        if (
            self._direct
            and self._kept
            and len(self._waiting) >= max(_EARLY, self._flying, self._half)
            and self._spare()
        ):
            self._send()  # Redis runs these while the rest of this turn's calls are made
        return await reply

    def _send(self) -> None:
        # a caller cancelled before its batch is written sends nothing
        batch = [c for c in self._waiting if not c[2].done()]
        self._waiting = []
        if not batch:  # all written early, or every caller gave up
            return
        packed = b"".join(c[3] for c in batch)
        conn, written = None, False
        if packed and self._kept:
            conn = self._kept.pop()
            writer = getattr(conn, "_writer", None)  # redis-py's StreamWriter: its write is not a coroutine
            # a connection due a health check (a PING first) is written by redis-py, in the task
            if writer is not None and conn.is_connected and not getattr(conn, "health_check_interval", 0):
                writer.write(packed)  # now, not a turn later: that is what lets Redis start early
                written = True
        self._flying += len(batch)
        self._half = self._flying // 2
        task = asyncio.get_running_loop().create_task(self._pipeline(batch, packed, conn, written))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    def _spare(self) -> bool:
        """Whether the pool can still give a connection for the calls this turn makes after an
        early write (so a small pool is never asked for more connections than without them)."""
        can = getattr(getattr(self._client, "connection_pool", None), "can_get_connection", None)
        return bool(can()) if can is not None else False

    def _settle(self) -> None:
        """Give the kept connections back to the pool once no call is waiting or in flight."""
        if self._waiting or self._flying or not self._kept:
            return
        kept, self._kept = self._kept, []
        assert isinstance(self._client, redis.asyncio.Redis)
        pool = self._client.connection_pool
        task = asyncio.get_running_loop().create_task(_release(pool, kept))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _pipeline(
        self,
        batch: list[_Call],
        packed: bytes,
        conn: Any = None,
        written: bool = False,
    ) -> None:
        """Send ``batch`` (``packed``: its calls on the wire, when ``_direct``; on ``conn``, a kept
        connection, when given, where ``written`` says it is written already) as one pipeline and
        hand each call its reply. A script the server does not hold (NOSCRIPT: it was not run) is
        sent again alone, which loads it."""
        assert isinstance(self._client, redis.asyncio.Redis)
        try:
            await self._deliver(batch, packed, conn, written)
        finally:  # queued behind the calls just woken, so it sees the calls they make next
            asyncio.get_running_loop().call_soon(self._settle)

    async def _deliver(
        self,
        batch: list[_Call],
        packed: bytes,
        conn: Any,
        written: bool,
    ) -> None:
        try:
            try:
                if packed:
                    sent = await self._exchange(batch, conn, written)
                else:
                    sent = await self._send_all(batch)
            finally:  # before the replies wake their calls, which decide on early writes by it
                self._flying -= len(batch)
        except BaseException as exc:  # the whole batch failed: every call sees why
            for _, _, reply, _ in batch:
                if reply.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    reply.cancel()
                else:
                    reply.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (script, call, reply, _), got in sent:
            if isinstance(got, redis.exceptions.NoScriptError):
                n = int(str(call[0]))
                try:
                    got = await script(keys=call[1 : 1 + n], args=call[1 + n :])  # type: ignore[arg-type]
                except Exception as exc:
                    got = exc
            if reply.done():
                continue
            if isinstance(got, Exception):
                reply.set_exception(got)
            else:
                reply.set_result(got)

    async def _exchange(
        self, batch: list[_Call], conn: Any = None, written: bool = False
    ) -> list[tuple[_Call, Any]]:
        """Write ``batch``'s packed calls on one of the client's pooled connections (``conn``,
        kept from an earlier batch, when given; ``written`` there already, all of them) and read
        their replies, an error reply kept in its place, each paired with its call. Calls whose
        caller was cancelled while the batch waited for a connection are left out (nothing of
        theirs is written). A dropped connection is retried under
        the connection's retry policy, as redis-py's own pipeline does. The connection's socket
        timeout bounds the whole read, one timer per batch rather than one per reply. After a
        batch that went through, the connection is kept for the next; else (or when a script is
        to be loaded) it goes back to the pool."""
        assert isinstance(self._client, redis.asyncio.Redis)
        pool = self._client.connection_pool
        if conn is None:
            conn = await _connection(pool)
        if not written:  # the callers that gave up while the batch waited for its connection
            batch = [c for c in batch if not c[2].done()]
            if not batch:
                await pool.release(conn)
                return []
        packed, count = b"".join(c[3] for c in batch), len(batch)

        async def attempt() -> list[Any]:
            nonlocal written
            drain, written = written, False  # written in ``_send``; a retry after a drop writes again
            if not drain:
                await conn.send_packed_command(packed)
            replies: list[Any] = []
            try:
                async with asyncio.timeout(getattr(conn, "socket_timeout", None)):
                    if drain:
                        try:
                            await conn._writer.drain()
                        except OSError as exc:  # as redis-py's own write does: drop it, then retry
                            await conn.disconnect(nowait=True)
                            raise redis.exceptions.ConnectionError(f"Error while writing: {exc!r}") from exc
                    for _ in range(count):
                        try:  # math.inf: no timer of its own, the batch's bounds it
                            replies.append(await conn.read_response(timeout=math.inf))
                        except redis.exceptions.ResponseError as exc:
                            replies.append(exc)
            except TimeoutError as exc:  # a read cancelled is dropped by redis-py; a drain, here
                await conn.disconnect(nowait=True)
                raise redis.exceptions.TimeoutError(f"no reply within the socket timeout ({exc!r})") from exc
            return replies

        async def dropped(error: Exception) -> None:
            await conn.disconnect()

        try:
            retry = getattr(conn, "retry", None)
            if retry is None:
                replies: list[Any] = await attempt()
            else:
                replies = await retry.call_with_retry(attempt, dropped)
        except BaseException:
            await pool.release(conn)
            raise
        # a NOSCRIPT reply is run again through the client, which may need this very connection
        if conn.is_connected and not any(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
            self._kept.append(conn)
        else:
            await pool.release(conn)
        return list(zip(batch, replies, strict=True))

    async def _send_all(self, batch: list[_Call]) -> list[tuple[_Call, Any]]:
        """Send ``batch`` through redis-py (its pipeline, on a connection taken from the pool
        first, so the callers that gave up while it waited for one are left out), each reply
        paired with its call."""
        assert isinstance(self._client, redis.asyncio.Redis)
        if getattr(self._client, "single_connection_client", False):
            # the client's own connection, behind its own lock: no pool to wait for
            if len(batch) == 1:  # alone: a plain command, the pipeline would only add its cost
                script, call, _, _ = batch[0]
                try:
                    return [(batch[0], await self._client.evalsha(script.sha, *call))]  # type: ignore[arg-type]
                except redis.exceptions.NoScriptError as exc:
                    return [(batch[0], exc)]
            pipe = self._client.pipeline(transaction=False)
        else:
            pool = self._client.connection_pool
            conn = await _connection(pool)
            batch = [c for c in batch if not c[2].done()]
            if not batch:
                await pool.release(conn)
                return []
            pipe = self._client.pipeline(transaction=False)
            pipe.connection = conn  # the pipeline's reset gives it back to the pool
        for script, call, _, _ in batch:
            pipe.evalsha(script.sha, *call)  # type: ignore[arg-type]
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        return list(zip(batch, replies, strict=True))

    def source(self, name: str) -> str:
        """The text this client runs for script ``name``: an override, or the shipped script."""
        return self._overrides.get(name) or script_source(name)

    async def run_source(
        self, text: str, keys: Sequence[str], args: Sequence[object], client: Any = None
    ) -> Any:
        """Run the script whose full text is ``text`` (on ``client`` when given, as ``run``)."""
        await self.ready()
        script = self._built.get(text)
        if script is None:
            script = self._built[text] = self._client.register_script(text)
            if len(self._built) > self._CACHE:
                self._built.popitem(last=False)
        else:
            self._built.move_to_end(text)
        return await script(keys=list(keys), args=[_arg(a) for a in args], client=client)


async def _connection(pool: Any) -> Any:
    """A connection from ``pool``, as its ``get_connection`` of any redis-py since 5 gives it."""
    try:
        return await pool.get_connection()
    except TypeError:  # redis-py before 5.3 requires the (unused) command name
        return await pool.get_connection("EVALSHA")


async def _release(pool: Any, conns: list[Any]) -> None:
    for conn in conns:
        await pool.release(conn)


def _utf8_strict(client: Client) -> bool:
    """Whether ``client`` encodes text as hiredis packs it (UTF-8, strict), so packing a call with
    hiredis sends the bytes the client itself would."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return False
    encoder = pool.get_encoder()
    name = str(encoder.encoding).replace("-", "").replace("_", "").lower()
    return name == "utf8" and encoder.encoding_errors == "strict"


_EARLY = 2  # the fewest calls written early: a write per call would cost more than the overlap gains

_PLAIN = frozenset({str, bytes, int, float})  # passed as they are (``_arg`` keeps their subclasses too)


def _arg(value: object) -> str | bytes | int | float:
    if isinstance(value, str | bytes | int | float):
        return value
    return str(value)


def where(client: Client) -> str:
    """Where ``client`` points, for error messages."""
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        nodes = client.get_nodes()
        return "redis cluster " + ",".join(f"{n.host}:{n.port}" for n in nodes[:3])
    service = getattr(client.connection_pool, "service_name", None)
    if service is not None:  # a Sentinel client: the primary's address changes on failover
        return f"redis sentinel service {service!r}"
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"redis at {kwargs['path']}"
    return f"redis at {kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


_UNREACHABLE = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.MasterDownError,
)


DRIVER_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)
"""What ``translated`` turns into this library's errors."""


def translated(client: Client | None, what: str, exc: BaseException) -> StoreError:
    """The driver's error ``exc`` as this library's: unreachable server -> ``StoreUnavailable``,
    any other -> ``StoreError`` (raise it ``from exc``); the message names ``client``'s server
    when given."""
    place = "redis" if client is None else where(client)
    if isinstance(exc, _UNREACHABLE):
        return StoreUnavailable(
            f"{place}: {what}: the server could not be reached ({type(exc).__name__}: {exc})"
        )
    return StoreError(f"{place}: {what} failed ({type(exc).__name__}: {exc})")


@contextlib.contextmanager
def boundary(client: Client | None, what: str) -> Iterator[None]:
    """Wrap the driver's errors: unreachable server -> ``StoreUnavailable``, any other driver error
    -> ``StoreError``; the driver's error stays as ``__cause__``.

    A call whose task was cancelled while it ran raises ``CancelledError`` even if the driver
    returned its reply: redis-py sends under ``asyncio.wait_for``, which on Python 3.11 hands back
    the result when the cancel lands just as the reply arrives, and a caller that cancelled must
    never see the call go on as if nothing happened. Such a call's outcome is unknown (it may have
    been applied), as for any call cut off in flight."""
    task = _current_task()
    asked = task.cancelling() if task is not None else 0
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise translated(client, what, exc) from exc
    if task is not None and task.cancelling() > asked:
        raise asyncio.CancelledError(f"cancelled while {what} (it may have been applied)")


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop: nothing can cancel this call
        return None


def text(value: object) -> str:
    """A reply as text, whether or not the client decodes responses."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def micros(at: datetime) -> int:
    """``at`` as integer microseconds since the epoch."""
    return (at - _EPOCH) // _US


def span(duration: timedelta) -> int:
    """``duration`` in integer microseconds."""
    return duration // _US


def from_micros(value: object) -> datetime:
    """Integer microseconds since the epoch (as a reply) back to an aware UTC datetime."""
    return _EPOCH + timedelta(microseconds=int(text(value)))
