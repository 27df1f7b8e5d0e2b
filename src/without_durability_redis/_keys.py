"""Key names: every key of a workflow carries its ``{id}`` hash tag, so a Redis Cluster keeps the
workflow on one slot and every script about it is a single-slot script."""

from __future__ import annotations

from without_durability.errors import InvalidInput, InvalidWorkflowId
from without_durability.rules import check_workflow

MAX_WORKFLOW_ID_BYTES = 256
"""The longest workflow id the Redis store accepts, in UTF-8 bytes. Ids become part of every key
name, and a key is sent with every call."""


def hash_tag(key: str) -> str:
    """The part of ``key`` Redis Cluster hashes: the text between the first ``{`` and the first
    ``}`` after it, when that is non-empty; otherwise the whole key."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def check_id(workflow: object) -> str:
    """Refuse an id the Redis store cannot hold: not a non-empty string, containing a brace (it
    would change the key's hash tag), or longer than ``MAX_WORKFLOW_ID_BYTES``."""
    workflow = check_workflow(workflow)
    if "{" in workflow or "}" in workflow:
        raise InvalidWorkflowId(
            f"workflow id {workflow!r} contains a brace: the Redis store builds key names from "
            "ids and a brace would change the key's {hash tag}, splitting the workflow across "
            "cluster slots; choose an id without '{' or '}'"
        )
    try:
        size = len(workflow.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidWorkflowId(f"workflow id {workflow!r} is not valid UTF-8 text") from exc
    if size > MAX_WORKFLOW_ID_BYTES:
        raise InvalidWorkflowId(
            f"workflow id {workflow[:40]!r}... is {size} bytes: the Redis store accepts ids of at "
            f"most {MAX_WORKFLOW_ID_BYTES} bytes (every key name carries the id); use a "
            "shorter id, for example a hash of this one"
        )
    return workflow


def check_name(what: str, name: object, *, allow_empty: bool = False) -> str:
    """Refuse a prefix or namespace that is not a string or that contains a brace."""
    if not isinstance(name, str) or (not name and not allow_empty):
        kind = "string" if allow_empty else "non-empty string"
        raise InvalidInput(f"{what} must be a {kind}, got {name!r}")
    if "{" in name or "}" in name:
        raise InvalidInput(
            f"{what} {name!r} contains a brace, which would change the hash tag of "
            "every key built from it; choose one without '{' or '}'"
        )
    return name
