"""RedisCheckpointer: what a workflow has done, and who may write it, in two hashes per workflow.

``<prefix>{id}`` holds the records and ``<prefix>{id}:claim`` the claim; the ``{id}`` hash tag keeps
both (and any key an effect declares) on one Redis Cluster slot. Every guarantee is one Lua script
(``scripts/*.lua``), because each is a check and a write that are only correct with nothing between
them; every time is the server's (``TIME`` inside the script).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

import redis.asyncio.cluster

from without_durability._values import Entry, Pass, Recorded
from without_durability.codec import CheckpointCodec, JsonCodec, verify_codec
from without_durability.errors import (
    Contended,
    Fenced,
    InvalidInput,
    InvalidKey,
    InvalidValue,
    StoreError,
    StoreUnavailable,
    WithoutDurabilityError,
)
from without_durability.rules import (
    INBOX_DIGITS,
    INBOX_PREFIX,
    MAX_VALUE_BYTES,
    check_key,
    check_lease,
    check_pass,
    encode_value,
)

from ._keys import check_id, check_name, hash_tag
from ._persistence import Persistence, read_persistence, warn
from ._scripts import EFFECT_MARK, Client, Scripts, boundary, from_micros, span, text, where

_LONGEST = timedelta(days=365 * 100)


@dataclass(frozen=True, slots=True)
class LuaEffect:
    """What ``RedisCheckpointer.transact`` commits together with a record: a Lua script over Redis
    data.

    ``source`` is the body of a Lua function that sees ``KEYS`` (this effect's ``keys``) and
    ``ARGV`` (its ``args``) and returns its result already encoded by the checkpointer's codec
    (for the default ``JsonCodec``: ``return cjson.encode(value)``). It runs inside the same script
    as the record, so the effect happens exactly once.

    Every key must carry the workflow's hash tag (build it from ``checkpointer.hash_key(workflow)``,
    e.g. ``hash_key(w) + ":ledger"``), because one script cannot commit across two Redis Cluster
    slots; a key that does not is refused before anything runs. If the effect raises a Lua error
    (or returns ``redis.error_reply``), or the pass turns out to be superseded, every declared key
    is put back as it was before the effect (keys the effect touches without declaring them are
    not), and ``transact`` raises ``on_error(message)`` when given, else ``LuaEffectFailed``.

    Keep ``source`` constant and pass data through ``args``: each distinct source is a distinct
    script in the server's cache.
    """

    source: str
    keys: Sequence[str] = ()
    args: Sequence[str | bytes | int | float] = ()
    on_error: Callable[[str], BaseException] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(self.keys))
        object.__setattr__(self, "args", tuple(self.args))


class LuaEffectFailed(WithoutDurabilityError):
    """A ``LuaEffect`` raised a Lua error; its writes to its declared keys were undone and nothing
    was recorded. ``message`` is the error's text."""

    def __init__(self, workflow: str, key: str, message: str) -> None:
        self.workflow = workflow
        self.key = key
        self.message = message
        super().__init__(
            f"workflow {workflow!r}, key {key!r}: the LuaEffect failed and was undone: {message}"
        )


class NotReplicated(StoreUnavailable):
    """A write the primary applied that fewer replicas than ``RedisCheckpointer(replicas=n)`` asked
    for acknowledged within ``replica_timeout``: it may or may not survive a failover, so treat it
    as an unknown outcome (read back, or retry: every write here is first-writer-wins or fenced).
    ``acked`` is how many replicas did acknowledge it."""

    def __init__(self, message: str, acked: int) -> None:
        self.acked = acked
        super().__init__(message)


class RedisCheckpointer:
    """``Checkpointer[LuaEffect]`` over a Redis server or a Redis Cluster (a ``redis.asyncio``
    client of either kind).

    - Fencing tokens are a hybrid logical clock (the server's clock in milliseconds, or one more
      than the last token when that is higher), so a claim hash that expired and was re-created
      still mints above every earlier token, as long as the server's clock does not step back by
      more than ``ttl``. Tokens are 13-digit numbers: exact in a double, in JSON, in Lua.
    - ``ttl`` is a retention period that starts only at a terminal state: the records hash gets
      it when the Worker records ``wd/finished`` or ``wd/failed/<g>`` (``without_durability.
      lifecycle``), later writes extend it, and ``rearm`` removes it. A workflow that is not
      terminal (sleeping, waiting for an arrival, or never run by a Worker) keeps its records
      however long it waits, so a wakeup that outlives ``ttl`` never finds them gone and runs the
      body from scratch. Why not a tombstone (``Expired`` on a later claim) instead: a waiting
      workflow is live, and turning its next arrival into an error loses it just the same. This
      is the rule every store keeps (Postgres ``sweep`` takes only terminal workflows; SQLite and
      Memory remove nothing): only a terminal workflow is ever forgotten, and an id forgotten
      after its retention is a new workflow. The claim hash keeps its own TTL (a pass's
      remaining budget plus ``ttl``); tokens stay above every earlier one when it is re-created.
    - Calls made concurrently (claim, renew, release, discard, record, supply, append; from many
      tasks in one turn of the event loop) go to the server together, one pipeline on one
      connection, each with its own reply or error: a refused call fails only itself. A caller
      cancelled before its batch is written sends nothing; one cancelled after raises
      ``CancelledError`` and its outcome is unknown. ``transact``, and every call of a checkpointer
      with ``replicas``, goes alone.
    - Record order lives in each hash field's value, so it survives the hash's conversion from
      listpack to hashtable.
    - Workflow ids may not contain ``{`` or ``}`` and are at most ``MAX_WORKFLOW_ID_BYTES`` long
      (``InvalidWorkflowId``). The codec must encode to text.
    - A write is as durable as the server's persistence makes it: with default settings (no AOF
      fsync, asynchronous replication) a write that returned can still be lost in a crash. The
      checkpointer reads those settings the first time it reaches the server and says so:
      ``persistence.durable`` (and a logged warning when it is not True, unless
      ``warn_persistence=False``: a server whose settings the caller chose, as a test harness's own).
    - Replication is asynchronous: a write the primary acknowledged and had not yet sent to a
      replica is lost when that replica is promoted (Sentinel failover). ``replicas=n`` makes
      every write wait (``WAIT n``, at most ``replica_timeout``) until ``n`` replicas have it; a
      write that returned then survives the failover of its primary to one of them, and one that
      did not reach them in time raises ``NotReplicated``. Reads do not wait. A Sentinel client
      (``Sentinel(...).master_for(service)``) is taken as it is; ``replicas`` needs a client of one
      server (a primary or a Sentinel's), not a ``RedisCluster``.
    """

    script_overrides: ClassVar[Mapping[str, str]] = {}
    """Replacement script texts by name (see ``script_source``), for a subclass that breaks a
    guarantee on purpose so a harness can prove it notices. Empty in the real store."""

    def __init__(
        self,
        client: Client,
        *,
        prefix: str = "wd:",
        ttl: timedelta = timedelta(days=7),
        codec: CheckpointCodec[str] | None = None,
        max_value_bytes: int = MAX_VALUE_BYTES,
        replicas: int = 0,
        replica_timeout: timedelta = timedelta(seconds=1),
        warn_persistence: bool = True,
    ) -> None:
        self.client = client
        # False for a server whose persistence the caller chose itself (a test harness's private
        # server): the warning is for an operator's server; ``persistence`` is read all the same
        self.warn_persistence = warn_persistence
        if not isinstance(replicas, int) or replicas < 0:
            raise InvalidInput(
                f"replicas must be an int >= 0 (how many replicas each write waits for), got {replicas!r}"
            )
        if replicas and isinstance(client, redis.asyncio.cluster.RedisCluster):
            raise InvalidInput(
                "replicas: WAIT is per connection and a RedisCluster spreads a workflow's writes "
                "over nodes; give a client of one server (a primary, or Sentinel.master_for)"
            )
        if not isinstance(replica_timeout, timedelta) or replica_timeout < timedelta(milliseconds=1):
            raise InvalidInput(
                f"replica_timeout must be a timedelta of at least 1 ms, got {replica_timeout!r}"
            )
        self.replicas = replicas
        self.replica_timeout = replica_timeout
        self.prefix = check_name("prefix", prefix, allow_empty=True)
        if not isinstance(ttl, timedelta) or ttl < timedelta(seconds=1):
            raise InvalidInput(f"ttl must be a timedelta of at least a second, got {ttl!r}")
        self.ttl = ttl
        self.codec: CheckpointCodec[str] = codec if codec is not None else JsonCodec()
        verify_codec(self.codec)
        self.max_value_bytes = max_value_bytes
        self._ttl_ms = int(ttl.total_seconds() * 1000)
        self._json = bool(getattr(self.codec, "renders_json", False))
        # concurrent calls share one pipelined round trip (see ``Scripts``): a burst of claims
        # or appends from many tasks costs one socket write and read, not one each
        self._scripts = Scripts(client, self.script_overrides, coalesce=True)
        self._persistence: Persistence | None = None
        self._reading = False

    # -- key names -----------------------------------------------------------------------------

    def hash_key(self, workflow: str) -> str:
        """The key of ``workflow``'s records hash, ``<prefix>{workflow}``; build an effect's keys
        from it (``hash_key(w) + ":ledger"``) so they carry the workflow's hash tag."""
        return f"{self.prefix}{{{check_id(workflow)}}}"

    def claim_key(self, workflow: str) -> str:
        """The key of ``workflow``'s claim hash (token, held, alive, for): for operators, tests."""
        return f"{self.hash_key(workflow)}:claim"

    def _nonces_key(self, workflow: str) -> str:
        return f"{self.hash_key(workflow)}:nonces"

    # -- helpers -------------------------------------------------------------------------------

    def _encode(self, workflow: str, key: str, value: object) -> str:
        encoded = encode_value(self.codec, workflow, key, value, self.max_value_bytes)
        if not isinstance(encoded, str):
            raise InvalidValue(
                f"workflow {workflow!r}, key {key!r}: the codec produced "
                f"{type(encoded).__name__}; RedisCheckpointer stores text, so its "
                "codec must encode to str"
            )
        return encoded

    def _decode(self, workflow: str, key: str, encoded: object) -> object:
        try:
            return self.codec.decode(text(encoded))
        except (TypeError, ValueError) as exc:
            raise StoreError(
                f"workflow {workflow!r}, key {key!r}: the stored encoding does not "
                f"decode with this checkpointer's codec ({exc})"
            ) from exc

    def _recorded(self, workflow: str, key: str, encoded: str, reply: Sequence[Any]) -> Recorded:
        if int(reply[0]) == 1:
            return Recorded(self.codec.decode(encoded), True)
        return Recorded(self._decode(workflow, key, reply[1]), False)

    async def _run(self, what: str, name: str, keys: Sequence[str], args: Sequence[object]) -> Any:
        with boundary(self.client, what):
            await self._first_contact()
            if not self.replicas:
                return await self._scripts.run(name, keys, args)
            async with self._replicated(what) as conn:
                return await self._scripts.run(name, keys, args, client=conn)

    @contextlib.asynccontextmanager
    async def _replicated(self, what: str) -> AsyncIterator[Any]:
        """One connection for the write and its WAIT: WAIT counts replicas that have this
        connection's own writes, so both must go over the same one."""
        conn: Any = self.client.client()  # type: ignore[union-attr]
        try:
            yield conn
            ms = max(1, int(self.replica_timeout.total_seconds() * 1000))
            acked = int(await conn.wait(self.replicas, ms))
        finally:
            await conn.aclose()
        if acked < self.replicas:
            raise NotReplicated(
                f"{where(self.client)}: {what}: applied by the primary, but {acked} of the "
                f"{self.replicas} replica(s) asked for acknowledged it within "
                f"{self.replica_timeout.total_seconds():g}s; it may be lost in a failover, so its "
                "outcome is unknown: read it back or retry it",
                acked,
            )

    @property
    def persistence(self) -> Persistence | None:
        """What the server said about its persistence the first time this checkpointer reached it
        (None before that; ``await read_persistence()`` reads it at once). When an acknowledged
        write may not survive a crash of the server (``durable`` is not True), a warning is logged
        on ``without_durability_redis`` once. Assert ``cp.persistence.durable`` in a deployment
        that relies on acknowledged writes surviving."""
        return self._persistence

    async def read_persistence(self) -> Persistence:
        """Read the server's persistence settings now (one ``CONFIG GET`` per server), keep them as
        ``persistence`` and warn as it describes."""
        with boundary(self.client, "read the persistence settings"):
            await self._scripts.ready()
            found = await read_persistence(self.client)
        if self._persistence is None and self.warn_persistence:
            warn(self.client, found)
        self._persistence = found
        return found

    async def _first_contact(self) -> None:
        if self._persistence is None and not self._reading:
            self._reading = True  # concurrent first calls read once
            try:
                await self.read_persistence()
            except StoreError:
                pass  # the call itself reaches the server next and says what is wrong
            finally:
                self._reading = False

    # -- the claim -----------------------------------------------------------------------------

    async def claim(self, workflow: str, *, alive: timedelta, budget: timedelta) -> Pass:
        """See ``Checkpointer.claim``. Lease lengths are capped at a century (``InvalidInput``)."""
        check_id(workflow)
        check_lease(workflow, alive, budget)
        for name, value in (("alive", alive), ("budget", budget)):
            if value > _LONGEST:
                raise InvalidInput(
                    f"workflow {workflow!r}: claim {name} {value} is longer than a "
                    "century, the longest the Redis store can count in microseconds "
                    "exactly; choose a shorter one"
                )
        reply = await self._run(
            f"claim {workflow!r}",
            "claim",
            [self.claim_key(workflow)],
            [span(alive), span(budget), self._ttl_ms, uuid.uuid4().hex],
        )
        if text(reply[0]) == "contended":
            raise Contended(workflow)
        return Pass(workflow, int(text(reply[1])))

    async def renew(self, pass_: Pass) -> None:
        """See ``Checkpointer.renew``."""
        check_pass(pass_)
        workflow = pass_.workflow
        reply = await self._run(
            f"renew {workflow!r}",
            "renew",
            [self.claim_key(workflow), self.hash_key(workflow)],
            [pass_.token, self._ttl_ms],
        )
        if text(reply[0]) == "fenced":
            raise Fenced(pass_.workflow, pass_.token)

    async def release(self, pass_: Pass) -> None:
        """See ``Checkpointer.release``."""
        check_pass(pass_)
        await self._run(
            f"release {pass_.workflow!r}",
            "release",
            [self.claim_key(pass_.workflow)],
            [pass_.token, self._ttl_ms],
        )

    async def discard(self, workflow: str) -> None:
        """See ``Checkpointer.discard``."""
        await self._run(
            f"discard {workflow!r}",
            "discard",
            [self.hash_key(workflow), self.claim_key(workflow), self._nonces_key(workflow)],
            [self._ttl_ms],
        )

    # -- records -------------------------------------------------------------------------------

    async def record(self, pass_: Pass, key: str, value: object) -> Recorded:
        """See ``Checkpointer.record``."""
        check_pass(pass_)
        workflow = pass_.workflow
        check_id(workflow)
        check_key(workflow, key)
        encoded = self._encode(workflow, key, value)
        reply = await self._run(
            f"record {workflow!r}/{key!r}",
            "record",
            [self.hash_key(workflow), self.claim_key(workflow)],
            [pass_.token, key, encoded, self._ttl_ms],
        )
        if text(reply[0]) == "fenced":
            raise Fenced(workflow, pass_.token, f"record of {key!r} refused")
        return self._recorded(workflow, key, encoded, reply[1:])

    async def supply(self, workflow: str, key: str, value: object) -> Recorded:
        """See ``Checkpointer.supply``."""
        check_id(workflow)
        check_key(workflow, key)
        encoded = self._encode(workflow, key, value)
        reply = await self._run(
            f"supply {workflow!r}/{key!r}", "supply", [self.hash_key(workflow)], [key, encoded, self._ttl_ms]
        )
        return self._recorded(workflow, key, encoded, reply)

    async def append(self, workflow: str, value: object) -> str:
        """See ``Checkpointer.append``: the key's number is the count of the workflow's records when
        it landed, which is also its load position."""
        check_id(workflow)
        encoded = self._encode(workflow, INBOX_PREFIX, value)
        reply = await self._run(
            f"append to {workflow!r}",
            "append",
            [self.hash_key(workflow), self._nonces_key(workflow)],
            [encoded, INBOX_PREFIX, INBOX_DIGITS, self._ttl_ms, uuid.uuid4().hex],
        )
        return text(reply)

    async def _rows(self, workflow: str) -> list[tuple[int, str, int, str]]:
        check_id(workflow)
        with boundary(self.client, f"load {workflow!r}"):
            await self._scripts.ready()
            await self._first_contact()
            raw = await self.client.hgetall(self.hash_key(workflow))
        rows = []
        for field_, stored in raw.items():
            if not field_:
                continue  # the latest stamp (see _checkpoint.lua), not a record
            position, written, encoded = text(stored).split(":", 2)
            rows.append((int(position), text(field_), int(written), encoded))
        rows.sort()  # the positions are distinct: this is the order each key was first recorded
        return rows

    async def load(self, workflow: str) -> dict[str, object]:
        """See ``Checkpointer.load``."""
        rows = await self._rows(workflow)
        return {key: self._decode(workflow, key, enc) for _, key, _, enc in rows}

    async def history(self, workflow: str) -> list[Entry]:
        """See ``Checkpointer.history``: ``written_at`` is the server clock at the winning write, or
        the workflow's latest record's if that is later (a server clock stepped back), so it never
        goes backward along the history."""
        return [
            Entry(key, self._decode(workflow, key, enc), from_micros(at))
            for _, key, at, enc in await self._rows(workflow)
        ]

    # -- transact ------------------------------------------------------------------------------

    def _check_effect(self, workflow: str, key: str, effect: LuaEffect) -> None:
        if not isinstance(effect, LuaEffect):
            raise InvalidInput(
                f"workflow {workflow!r}, key {key!r}: RedisCheckpointer.transact "
                f"takes a LuaEffect, got {type(effect).__name__}"
            )
        if not isinstance(effect.source, str) or not effect.source.strip():
            raise InvalidInput(
                f"workflow {workflow!r}, key {key!r}: LuaEffect source must be non-empty Lua text"
            )
        own = {self.hash_key(workflow), self.claim_key(workflow), self._nonces_key(workflow)}
        for effect_key in effect.keys:
            if not isinstance(effect_key, str) or not effect_key:
                raise InvalidKey(
                    f"workflow {workflow!r}, key {key!r}: LuaEffect keys must be "
                    f"non-empty strings, got {effect_key!r}"
                )
            if hash_tag(effect_key) != workflow:
                raise InvalidKey(
                    f"workflow {workflow!r}, key {key!r}: LuaEffect key {effect_key!r} does not "
                    f"carry the workflow's hash tag {{{workflow}}}, so it may live in another "
                    "cluster slot, and one script cannot commit across two slots. Every key an "
                    "effect declares must hash with its workflow: build it from "
                    f"hash_key({workflow!r}), e.g. {self.hash_key(workflow) + ':ledger'!r}. "
                    "Nothing was run."
                )
            if effect_key in own:
                raise InvalidKey(
                    f"workflow {workflow!r}, key {key!r}: LuaEffect key "
                    f"{effect_key!r} is the checkpointer's own; keep an effect's data "
                    "in keys of its own (hash_key(workflow) + ':something')"
                )

    async def transact(self, pass_: Pass, key: str, effect: LuaEffect) -> Recorded:
        """See ``Checkpointer.transact``: the effect's source is spliced into the TRANSACT script,
        so the recorded check, the fence, the effect and the record are one script. A key already
        recorded is returned with ``won=False`` and the effect is not run."""
        check_pass(pass_)
        workflow = pass_.workflow
        check_id(workflow)
        check_key(workflow, key)
        self._check_effect(workflow, key, effect)
        script = self._scripts.source("transact").replace(EFFECT_MARK, effect.source, 1)
        keys = [self.hash_key(workflow), self.claim_key(workflow), self._nonces_key(workflow), *effect.keys]
        args = [
            pass_.token,
            key,
            self.max_value_bytes,
            self._ttl_ms,
            "1" if self._json else "0",
            uuid.uuid4().hex,
            *effect.args,
        ]
        what = f"transact {workflow!r}/{key!r}"
        with boundary(self.client, what):
            await self._first_contact()
            try:
                if self.replicas:
                    async with self._replicated(what) as conn:
                        reply = await self._scripts.run_source(script, keys, args, client=conn)
                else:
                    reply = await self._scripts.run_source(script, keys, args)
            except Exception as exc:
                if "Error compiling script" in str(exc):
                    raise InvalidInput(
                        f"workflow {workflow!r}, key {key!r}: the LuaEffect source "
                        f"does not compile; nothing was run ({exc})"
                    ) from exc
                raise
        status = text(reply[0])
        if status == "fenced":
            raise Fenced(workflow, pass_.token, f"transact of {key!r} refused, effect not kept")
        if status == "recorded":
            return Recorded(self._decode(workflow, key, reply[1]), False)
        if status == "failed":
            message = text(reply[1])
            if effect.on_error is not None:
                raise effect.on_error(message)
            raise LuaEffectFailed(workflow, key, message)
        if status == "invalid":
            raise InvalidValue(f"workflow {workflow!r}, key {key!r}: {text(reply[1])}; the effect was undone")
        return Recorded(self._decode(workflow, key, reply[1]), True)
