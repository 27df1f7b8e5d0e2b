"""without-durability's two interfaces over Redis (a server or a Redis Cluster), through
``redis.asyncio``.

    from redis.asyncio import Redis
    from without_durability import SplitDurable
    from without_durability_redis import RedisCheckpointer, RedisSetScheduler

    client = Redis.from_url(url)
    durable = SplitDurable(RedisCheckpointer(client), RedisSetScheduler(client))

Two schedulers: ``RedisSetScheduler`` (a sorted set scored by visibility; pollers poll) and
``RedisStreamScheduler`` (a stream, its consumer group and pending list, and a timer set; its
``wait`` blocks on the stream, so a poller wakes for new work instead of sleeping out its interval).

Every guarantee is one Lua script, each a check and the write it guards with nothing between them:
CLAIM, RECORD, SUPPLY, APPEND, TRANSACT (a ``LuaEffect``'s source spliced in, so an effect on Redis
data and its record commit together), TAKE. The Durable is ``SplitDurable``: a workflow's checkpoint
lives on its own ``{id}`` slot and the queue on the namespace's, and Redis cannot commit across two
slots, so ``arrive`` records first and then schedules (a crash between leaves the value recorded and
the wakeup to be asked for again) rather than doing both in one commit.
"""

from __future__ import annotations

from ._keys import MAX_WORKFLOW_ID_BYTES, hash_tag
from ._persistence import Persistence
from ._scripts import SCRIPTS, script_source
from .checkpointer import LuaEffect, LuaEffectFailed, NotReplicated, RedisCheckpointer
from .schedulers import RedisSetScheduler, RedisStreamScheduler

__all__ = [
    "MAX_WORKFLOW_ID_BYTES",
    "Persistence",
    "SCRIPTS",
    "LuaEffect",
    "LuaEffectFailed",
    "NotReplicated",
    "RedisCheckpointer",
    "RedisSetScheduler",
    "RedisStreamScheduler",
    "hash_tag",
    "script_source",
]
