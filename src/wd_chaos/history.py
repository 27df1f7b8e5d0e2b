"""The history: what every process did, as invoke and complete lines, plus fault events.

Each process appends JSON lines to its own file with one ``write`` per line on an ``O_APPEND``
descriptor, so a line is in the kernel before the call returns and a SIGKILL cannot tear or lose a
line already written (it can only leave an invoke without its complete, which is the point).
``merge`` joins the files into one ``history.jsonl`` ordered by the system-wide monotonic clock
and closes it with an ``end`` line (how many lines came before it and their SHA-256), so
``load_finished`` can refuse a merged history that was cut, emptied or altered rather than judge it.

Line kinds (``type``): ``invoke`` and ``complete`` of an operation (same ``op`` id), ``effect`` (a
step's external effect, the world outside the store), ``fault`` (nemesis start/stop events and
failpoint hits), ``info`` (process start/exit and anything else worth keeping). The format is
documented in reports/README.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Outcome = Literal["ok", "fenced", "contended", "failed", "unknown"]
"""How an operation completed (``OUTCOMES``)."""
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
"""How an operation completed. ``unknown``: it may or may not have taken effect (a timeout, a
connection lost mid-call); an invoke with no complete at all (a killed process) is unknown too."""


class ConfigError(ValueError):
    """A config.json or history line that is not the form its reader expects; the message names
    the file (or line), the field and what was wrong. (Defined here, at the bottom, because a
    history line is checked here; ``wd_chaos.config`` re-exports it.)"""


Op = dict[str, Any]
"""One history line, as parsed JSON."""


def errors(exc: ValidationError, source: str) -> str:
    """``exc`` as one line per problem, each naming ``source`` and the field."""
    lines = []
    for err in exc.errors():
        message = str(err["msg"]).removeprefix("Value error, ")
        if not err["loc"]:  # a check across fields: its message names them
            lines.append(f"{source}: {message}")
            continue
        where = ".".join(str(part) for part in err["loc"])
        got = "" if err["type"] == "missing" else f", got {err.get('input')!r}"
        lines.append(f"{source}: {where}: {message}{got}")
    return "; ".join(lines)


class HistoryLine(BaseModel):
    """One history line (``reports/README.md``): its ``type``, the writing process, both clocks,
    and for an operation its id, function and (on complete) outcome. Other fields are kept as
    written."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(pattern=r"^[a-z][a-z-]*$")
    """``invoke``, ``complete``, ``effect``, ``fault`` or ``info``."""
    process: str
    pid: int
    mono: int
    """``time.monotonic_ns()`` when written: the merged history's order."""
    wall: str
    """The wall clock when written, ISO 8601."""
    op: str | None = None
    f: str | None = None
    outcome: Outcome | None = None

    @model_validator(mode="after")
    def _operation_fields(self) -> HistoryLine:
        if self.type in ("invoke", "complete"):
            missing = [name for name in ("op", "f") if getattr(self, name) is None]
            if self.type == "complete" and self.outcome is None:
                missing.append("outcome")
            if missing:
                raise ValueError(f"a {self.type} line needs {', '.join(missing)}")
        return self


def check_line(line: dict[str, Any], source: str) -> None:
    """Raise ``ConfigError`` naming ``source`` when ``line`` is not a ``HistoryLine``."""
    try:
        HistoryLine.model_validate(line)
    except ValidationError as exc:
        raise ConfigError(errors(exc, source)) from exc


def digest(value: object) -> str:
    """A short digest of ``value``'s canonical JSON (sorted keys, compact), the form a read's
    values take in the history: two reads agree on a key's value when their digests do."""
    return hashlib.blake2b(_DIGEST_JSON(value).encode(), digest_size=5).hexdigest()


# json.dumps with these arguments builds this encoder on every call (it keeps no state between
# calls); a read digests every value it saw, thousands a simulated run
_DIGEST_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=repr).encode


def observation(items: Iterable[tuple[str, object]]) -> dict[str, list[str]]:
    """The fields a read's complete line carries: ``keys`` in the order the store returned them,
    and ``digests``, one per key in the same order."""
    pairs = list(items)
    return {"keys": [k for k, _ in pairs], "digests": [digest(v) for _, v in pairs]}


class DamagedHistory(ValueError):
    """A merged history that is not as its run wrote it (cut, emptied, a line altered, no end
    line); the message names the file and what is wrong. Such a history is refused, not judged."""


def _jsonable(value: object) -> object:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


CARELESS_LEDGER_KEY = "ledger~careless"
"""The ledger key a careless effect (``client/careless.py``) writes its row under: any row with it
committed without its record (the transact it ran in never recorded this key). Here, below the
worker that writes it and the ``misuse`` checker that looks for it in the final state."""


MONO_SHIFT_ENV = "WD_CHAOS_MONO_SHIFT_NS"
"""The variable a process started in a time namespace of its own (``faults/reboot.py``) is given:
nanoseconds to add to its ``time.monotonic_ns()`` for the machine's, so its lines' ``mono`` stays
comparable with every other process's (the store's clock restarted, the harness's did not)."""


class HistoryWriter:
    """Appends this process's lines to ``path``. Not shared between processes. ``mono`` is the
    machine's monotonic clock even in a process whose own clock a reboot restarted
    (``MONO_SHIFT_ENV``)."""

    def __init__(self, path: Path, process: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.process = process
        self.pid = os.getpid()
        self._counter = 0
        self._shift = int(os.environ.get(MONO_SHIFT_ENV) or 0)

    def close(self) -> None:
        """Close the file; later writes raise."""
        os.close(self._fd)

    def write(self, line: Op) -> Op:
        """Stamp ``line`` with process, pid and both clocks, check it is a ``HistoryLine``
        (``ConfigError`` if not: nothing is written), and append it."""
        line.setdefault("process", self.process)
        line.setdefault("pid", self.pid)
        line["mono"] = time.monotonic_ns() + self._shift
        line["wall"] = datetime.now(UTC).isoformat()
        for field in ("value", "result"):
            if field in line:
                line[field] = _jsonable(line[field])
        check_line(line, f"history line of {self.process}")
        os.write(self._fd, (json.dumps(line, sort_keys=True) + "\n").encode())
        return line

    def invoke(self, f: str, **fields: Any) -> str:
        """Write the invoke line of an operation ``f``; returns its op id for ``complete``."""
        self._counter += 1
        op = f"{self.process}:{self.pid}:{self._counter}"
        self.write({"type": "invoke", "op": op, "f": f, **fields})
        return op

    def complete(self, op: str, f: str, outcome: str, **fields: Any) -> None:
        """Write the complete line of ``op`` with its outcome (one of ``OUTCOMES``)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        self.write({"type": "complete", "op": op, "f": f, "outcome": outcome, **fields})

    def event(self, kind: str, **fields: Any) -> None:
        """Write a non-operation line (``effect``, ``fault``, ``info``)."""
        self.write({"type": kind, **fields})


def read_lines(path: Path) -> Iterator[Op]:
    """The lines of one history file; a torn last line (a file being written) is skipped."""
    with path.open("rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                return
            yield json.loads(raw)


def merge(files: Iterable[Path], out: Path) -> list[Op]:
    """Merge per-process files into ``out`` ordered by monotonic time, closed by the ``end`` line
    ``load_finished`` verifies; returns the merged ops (without the end line)."""
    ops: list[Op] = []
    for path in files:
        for number, line in enumerate(read_lines(path), 1):
            try:
                check_line(line, f"{path}: line {number}")
            except ConfigError as exc:
                raise DamagedHistory(str(exc)) from exc
            ops.append(line)
    ops.sort(key=lambda o: (o["mono"], o.get("process", ""), o.get("op", "")))
    digest = hashlib.sha256()
    with out.open("wb") as handle:
        for line in ops:
            data = (json.dumps(line, sort_keys=True) + "\n").encode()
            digest.update(data)
            handle.write(data)
        end = {"type": "end", "lines": len(ops), "sha256": digest.hexdigest()}
        handle.write((json.dumps(end, sort_keys=True) + "\n").encode())
        handle.flush()
        os.fsync(handle.fileno())
    return ops


def load(path: Path) -> list[Op]:
    """Read a history file leniently (a torn last line skipped, a trailing ``end`` line dropped),
    for a file still being written; a finished run's history is read by ``load_finished``."""
    ops = list(read_lines(path))
    if ops and ops[-1].get("type") == "end":
        ops.pop()
    return ops


def load_finished(path: Path) -> list[Op]:
    """Read a finished run's merged ``history.jsonl``, verified against its ``end`` line (line
    count and SHA-256); raises ``DamagedHistory`` for anything else. Returns the ops without it."""
    again = "; this history cannot be judged (run the scenario again)"
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DamagedHistory(f"{path}: cannot read: {exc.strerror or exc}{again}") from exc
    if not raw:
        raise DamagedHistory(f"{path}: empty{again}")
    if not raw.endswith(b"\n"):
        raise DamagedHistory(f"{path}: cut in the middle of its last line{again}")
    lines = raw.split(b"\n")[:-1]
    try:
        end = json.loads(lines[-1])
    except ValueError:
        end = None
    if not isinstance(end, dict) or end.get("type") != "end":
        raise DamagedHistory(
            f"{path}: no end line (cut at a line boundary, or not written by a finished run){again}"
        )
    body = lines[:-1]
    if end.get("lines") != len(body):
        raise DamagedHistory(f"{path}: {len(body)} lines, its end line says {end.get('lines')}{again}")
    digest = hashlib.sha256(b"".join(line + b"\n" for line in body)).hexdigest()
    if digest != end.get("sha256"):
        raise DamagedHistory(f"{path}: its lines do not match the SHA-256 of its end line (altered){again}")
    ops: list[Op] = []
    for number, line in enumerate(body, 1):
        try:
            op = json.loads(line)
        except ValueError as exc:
            raise DamagedHistory(f"{path}: line {number} is not JSON: {exc}{again}") from exc
        if not isinstance(op, dict) or not isinstance(op.get("type"), str):
            raise DamagedHistory(f"{path}: line {number} has no 'type' field{again}")
        try:
            check_line(op, f"{path}: line {number}")
        except ConfigError as exc:
            raise DamagedHistory(f"{exc}{again}") from exc
        ops.append(op)
    return ops


class Tail:
    """Reads new complete lines from a growing file, for live progress and the nemesis."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> list[Op]:
        """Lines appended since the last call."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        return [json.loads(raw) for raw in complete if raw]


def pair(ops: Iterable[Op]) -> list[dict[str, Any]]:
    """Join invokes with their completes: one dict per operation with ``invoke`` and ``complete``
    (None for an operation whose process died first: indeterminate)."""
    by_op: dict[str, dict[str, Any]] = {}
    for line in ops:
        if line["type"] == "invoke":
            by_op[line["op"]] = {"invoke": line, "complete": None}
        elif line["type"] == "complete" and line["op"] in by_op:
            by_op[line["op"]]["complete"] = line
    return list(by_op.values())
