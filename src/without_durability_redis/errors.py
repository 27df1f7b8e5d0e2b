"""How a redis-py error becomes one of this library's errors: the rules the Redis store itself
follows, public so that a scheduler, checkpointer or kit written beside it (your own queue on the
same server) reports failures the way the store does.

Two outcomes, and what a caller may rely on for each:

- ``StoreUnavailable`` (a ``StoreError``): the server could not be reached or did not answer in
  time: redis-py's ``ConnectionError`` (authentication refused included), ``TimeoutError``,
  ``ClusterDownError`` and ``MasterDownError``. A command cut off so **may or may not have been
  applied**: read it back, or repeat it only if it is idempotent.
- ``StoreError``: any other error of the driver (``redis.exceptions.RedisError`` and
  ``RedisClusterException``): the server answered and refused the command (``WRONGTYPE``,
  ``OOM``, ``READONLY`` from a replica, an error raised inside a script). A script that raised
  midway keeps the writes it made before the error: Redis does not roll a script back.

Neither is a refusal of *input*: the Redis store refuses bad ids, keys and values itself, before
anything is sent (``InvalidInput``), and a ``LuaEffect`` whose source does not compile is refused
by ``transact`` as ``InvalidInput`` with nothing run. Every outcome is raised ``from`` the
driver's error, which stays as ``__cause__``; the message names the server (a cluster's first
nodes, a Sentinel service) when a client is given.

    from without_durability_redis.errors import boundary

    with boundary("take from my_queue", client):
        reply = await client.zpopmin(queue_key)

``boundary`` also refuses to let a cancelled call look finished: if the task was cancelled while
the block ran, it raises ``CancelledError`` even when redis-py handed back a reply (on Python 3.11
its ``asyncio.wait_for`` can return the reply as the cancel lands); such a call's outcome is
unknown, as for any call cut off in flight.
"""

from __future__ import annotations

from without_durability.errors import StoreError

from ._scripts import DRIVER_ERRORS, Client, boundary, translated

__all__ = ["DRIVER_ERRORS", "boundary", "classify"]


def classify(exc: BaseException, what: str, *, client: Client | None = None) -> StoreError:
    """The error a caller should see for the redis-py error ``exc``, raised while doing ``what``
    (a phrase such as ``"take from my_queue"``, put in the message): ``StoreUnavailable`` or
    ``StoreError``, by the rules in this module's docstring. Raise the result ``from exc``.
    ``TypeError`` for an exception that is not the driver's (``DRIVER_ERRORS``)."""
    if not isinstance(exc, DRIVER_ERRORS):
        raise TypeError(f"classify takes a redis-py error, not {type(exc).__name__}: {exc!r}")
    return translated(client, what, exc)
