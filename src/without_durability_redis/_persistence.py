"""What the Redis server promises about an acknowledged write, read from its own settings.

A script's reply means Redis applied the write in memory. Whether it survives the server being
killed is a matter of configuration: only an append-only file fsynced on every write
(``appendonly yes`` with ``appendfsync always``) keeps every acknowledged write. Measured here with
SIGKILL and restart: with Redis's default settings (RDB snapshots, no AOF) 46,850 of 51,457
acknowledged records were gone; with ``appendfsync always``, 0 of 53,185.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis.asyncio.cluster
import redis.exceptions

from ._scripts import Client, text, where

log = logging.getLogger("without_durability_redis")


@dataclass(frozen=True, slots=True)
class Persistence:
    """The server's persistence settings as read when the checkpointer first reached it.

    ``durable`` is True when an acknowledged write survives the server being killed (every node
    has ``appendonly yes`` and ``appendfsync always``), False when it may not, and None when the
    settings could not be read (``CONFIG`` disabled, renamed or not permitted, as on many managed
    services). ``detail`` says why, in a sentence. Replication is not judged: a write acknowledged
    by a primary can still be lost in a failover to a replica that had not received it.
    """

    durable: bool | None
    detail: str
    appendonly: str | None = None
    appendfsync: str | None = None
    save: str | None = None


def judge(appendonly: str, appendfsync: str, save: str) -> Persistence:
    """The verdict for one server's settings."""
    settings = {"appendonly": appendonly, "appendfsync": appendfsync, "save": save}
    if appendonly == "yes" and appendfsync == "always":
        return Persistence(True, "the append-only file is fsynced on every write", **settings)
    if appendonly == "yes":
        when = "every second" if appendfsync == "everysec" else "when the OS chooses"
        return Persistence(
            False,
            f"the append-only file is fsynced {when} (appendfsync {appendfsync}), so writes "
            "acknowledged in the moments before a crash can be lost",
            **settings,
        )
    if save.strip():
        return Persistence(
            False,
            f"no append-only file, only RDB snapshots (save {save!r}): every write since the last "
            "snapshot is lost in a crash",
            **settings,
        )
    return Persistence(False, "no persistence at all (no append-only file, no snapshots)", **settings)


async def _settings(client: Any, **target: Any) -> tuple[str, str, str]:
    found: dict[str, str] = {}
    for pattern in ("append*", "save"):
        reply = await client.config_get(pattern, **target)
        for name, value in dict(reply).items():
            found[text(name)] = text(value)
    return found.get("appendonly", "no"), found.get("appendfsync", "everysec"), found.get("save", "")


async def read_persistence(client: Client) -> Persistence:
    """Ask every server behind ``client`` for its persistence settings (``CONFIG GET``). A refused
    ``CONFIG`` gives ``durable=None``; an unreachable server raises the driver's error."""
    try:
        if isinstance(client, redis.asyncio.cluster.RedisCluster):
            verdicts = [
                judge(*await _settings(client, target_nodes=node)) for node in client.get_primaries()
            ]
            # the cluster is as durable as its least durable primary
            return next((v for v in verdicts if not v.durable), verdicts[0])
        return judge(*await _settings(client))
    except redis.exceptions.ResponseError as exc:  # unknown command, NOPERM: a managed server
        return Persistence(None, f"the server refused CONFIG GET ({exc}), so its persistence is unknown")


def warn(client: Client, persistence: Persistence) -> None:
    """Log, once per checkpointer, that an acknowledged write may not survive a crash."""
    if persistence.durable is True:
        return
    log.warning(
        "%s: an acknowledged write may not survive a crash of the server: %s. Set appendonly yes "
        "and appendfsync always for writes that survive one (see the docs: Stores and guarantees, Durability)",
        where(client),
        persistence.detail,
    )
