"""A run's folder as records: the store's final state (``FinalState``, ``final.json``), the JSON
files a finished run leaves, and the per-process histories an interrupted one leaves.

This module sits at the bottom of the harness beside ``history`` and imports nothing else of it:
the checkers, ``analyze``, ``shrink`` and the CLI all read run folders through it (Jepsen's
``store`` owns run folders the same way). It knows no scenario: ``analyze.read_parts`` validates
``scenario.json`` on top of ``read_objects``.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import history


class DamagedRun(ValueError):
    """A run folder ``analyze`` refuses to judge (interrupted, a file missing, cut or altered);
    the message names the folder, the file and what is wrong."""


class FinalUnread(LookupError):
    """What a checker meets when it reads the store's final state in a partial analysis: an
    interrupted run never read it."""


_ALWAYS_READ = frozenset({"wall_clock_steps", "store_clock", "lease_clock"})
"""What a partial analysis knows without the store: the steps (from the history) and the clocks
(``"unrecorded"``)."""


@dataclass(frozen=True)
class FinalState(Mapping[str, Any]):
    """The store's final state after a run's final heal (``final.json``), as the checkers judge it.

    Typed fields for what the harness writes; a field that is ``None`` was not recorded (a run
    from before it was, or a run without a lifecycle) and is absent from the mapping view and from
    ``to_json``. Keys a run wrote that are not typed here are kept in ``extra``. The mapping view
    (``final["workflows"]``, ``final.get("ledger")``, ``"x" in final``) is what checkers read, so a
    checker written against the JSON keys reads it unchanged. In a partial analysis
    (``FinalState.unread``) any read beyond the clocks and the wall-clock steps raises
    ``FinalUnread``, so a checker that needs the store says unknown instead of judging an empty one.
    """

    workflows: dict[str, dict[str, Any]] | None = None
    """Per workflow: ``history`` (``[key, value, written_at]`` rows) and ``load_keys``."""
    ledger: list[dict[str, Any]] | None = None
    """The chaos ledger's rows (``row``, ``workflow``, ``key``, ``token``)."""
    expected_workflows: list[str] | None = None
    """The workflows the run started."""
    store_clock: str | None = None
    """``"local"`` or ``"remote"``: whose wall clock the store's decisions ran on."""
    lease_clock: str | None = None
    """``"monotonic"`` or ``"wall"``: the clock the store's leases ran on."""
    lifecycle: dict[str, Any] | None = None
    """The scenario's ``[lifecycle]`` with ``claim_budget`` (lifecycle runs only)."""
    failing: list[str] | None = None
    """Workflows whose body failed on purpose (lifecycle runs only)."""
    wall_clock_steps: list[dict[str, Any]] | None = None
    """This machine's wall-clock steps, read from the history (``wallclock.steps``) at judging."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys of ``final.json`` not typed above, kept as written."""
    unread: bool = False
    """A partial analysis: the store's final state was never read."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FinalState:
        """The final state in ``data`` (parsed ``final.json``); unknown keys go to ``extra``."""
        typed = {f.name for f in dataclasses.fields(cls)} - {"extra", "unread"}
        return cls(
            **{k: v for k, v in data.items() if k in typed},
            extra={k: v for k, v in data.items() if k not in typed},
        )

    @classmethod
    def unread_with(cls, wall_clock_steps: list[dict[str, Any]]) -> FinalState:
        """The final state of an interrupted run: the steps, clocks unrecorded, nothing else."""
        return cls(
            store_clock="unrecorded", lease_clock="unrecorded", wall_clock_steps=wall_clock_steps, unread=True
        )

    def with_steps(self, steps: list[dict[str, Any]]) -> FinalState:
        """This state with ``wall_clock_steps`` set."""
        return dataclasses.replace(self, wall_clock_steps=steps)

    def to_json(self) -> dict[str, Any]:
        """The ``final.json`` object: the recorded fields in their order, then ``extra``."""
        return dict(self._items())

    def _items(self) -> Iterator[tuple[str, Any]]:
        for f in dataclasses.fields(self):
            if f.name in ("extra", "unread"):
                continue
            value = getattr(self, f.name)
            if value is not None:
                yield f.name, value
        yield from self.extra.items()

    def __getitem__(self, key: str) -> Any:
        if self.unread and key not in _ALWAYS_READ:
            raise FinalUnread(key)
        for name, value in self._items():
            if name == key:
                return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items())

    def __len__(self) -> int:
        return sum(1 for _ in self._items())


async def read_store_final(
    checkpointer: Any,
    workflows: list[str],
    read_ledger: Callable[[list[str]], Awaitable[list[dict[str, Any]]]],
    more: Mapping[str, Any],
    *,
    read_errors: bool = False,
) -> FinalState:
    """The store's final state after a run, read through the store's own ``history`` and
    ``load``: every workflow's history (``[key, value, written_at]`` rows, values as their JSON
    round trip gives them) and load keys, then the ledger rows of ``workflows``
    (``read_ledger``), the workflows expected, and ``more`` (the clocks, the queue...). The one
    producer of a ``FinalState`` from a store: the process runner's and the simulator's.

    A workflow whose read fails raises, unless ``read_errors``: then it is recorded with no
    records and its ``read_error`` (a store that cannot read its own records holds none we know
    of), for the checkers to judge."""
    out: dict[str, Any] = {}
    for wf in workflows:
        try:
            entries = await checkpointer.history(wf)
            keys = list(await checkpointer.load(wf))
        except Exception as exc:
            if not read_errors:
                raise
            out[wf] = {"history": [], "load_keys": [], "read_error": f"{type(exc).__name__}: {exc}"}
            continue
        out[wf] = {
            "history": [[e.key, e.value, e.written_at.isoformat()] for e in entries],
            "load_keys": keys,
        }
    return FinalState.from_json(
        {
            "workflows": json.loads(json.dumps(out, default=repr)),
            "ledger": await read_ledger(workflows),
            "expected_workflows": list(workflows),
            **more,
        }
    )


def read_final(run_dir: Path) -> FinalState:
    """A finished run's ``final.json``; ``DamagedRun`` naming the folder when it cannot be read."""
    (data,) = read_objects(run_dir, "final.json")
    return FinalState.from_json(data)


def read_objects(run_dir: Path, *names: str) -> list[dict[str, Any]]:
    """The named JSON files of a run folder, each of which must hold an object; anything missing
    or malformed raises ``DamagedRun`` naming the folder."""
    try:
        parts = [json.loads((run_dir / name).read_text()) for name in names]
    except (OSError, ValueError) as exc:
        raise DamagedRun(f"{run_dir}: not a finished run's folder: {exc}") from exc
    if not all(isinstance(part, dict) for part in parts):
        raise DamagedRun(f"{run_dir}: {' and '.join(names)} must each hold a JSON object")
    return parts


def check_finished(run_dir: Path) -> None:
    """Raise ``DamagedRun`` unless ``run_dir`` is a folder whose run finished (an interrupted run's
    folder names what stopped it, and points at ``analyze --partial``)."""
    if not run_dir.is_dir():
        raise DamagedRun(f"{run_dir}: not a run folder (no such directory)")
    stopped = run_dir / "INTERRUPTED"
    if stopped.exists() and not (run_dir / "history.jsonl").exists():
        why = stopped.read_text(errors="replace").strip()
        raise DamagedRun(
            f"{run_dir}: the run did not finish ({why}); nothing to judge as a finished run "
            "(wd-chaos analyze --partial judges what it recorded)"
        )


def finished_history(run_dir: Path) -> list[history.Op]:
    """A finished run's merged ``history.jsonl``, verified (``history.load_finished``); a damaged
    one raises ``DamagedRun``."""
    try:
        return history.load_finished(run_dir / "history.jsonl")
    except history.DamagedHistory as exc:
        raise DamagedRun(str(exc)) from exc


def is_partial(run_dir: Path) -> bool:
    """Whether ``run_dir`` is an interrupted run's folder (``INTERRUPTED``, never merged)."""
    return (run_dir / "INTERRUPTED").exists() and not (run_dir / "history.jsonl").exists()


def partial_history(run_dir: Path) -> tuple[dict[str, Any], list[history.Op]]:
    """An interrupted run's record of itself (the controller's ``run`` line: scenario, store, seed,
    time limit, workers, workflows, schedule) and every complete line its processes wrote, merged
    by monotonic time (a torn last line, cut by the kill, skipped); ``DamagedRun`` when there is
    nothing to judge."""
    files = sorted((run_dir / "procs").glob("*.jsonl"))
    if not files:
        raise DamagedRun(f"{run_dir}: no per-process histories (procs/*.jsonl): nothing was recorded")
    ops: list[history.Op] = []
    for path in files:
        try:
            ops.extend(history.read_lines(path))
        except ValueError as exc:
            raise DamagedRun(
                f"{path}: a line that is not JSON ({exc}); this history cannot be judged"
            ) from exc
    ops.sort(key=lambda o: (o.get("mono", 0), o.get("process", ""), o.get("op", "")))
    started = next((o for o in ops if o.get("type") == "info" and o.get("what") == "run"), None)
    if started is None:
        raise DamagedRun(f"{run_dir}: the controller's history never recorded the run's start")
    meta = {
        k: started.get(k)
        for k in ("scenario", "store", "seed", "time_limit", "workers", "workflows", "schedule")
    }
    return meta, ops


def interrupted_why(run_dir: Path) -> str:
    """What the ``INTERRUPTED`` file of ``run_dir`` says stopped the run."""
    return (run_dir / "INTERRUPTED").read_text(errors="replace").strip()


def shrink_command(run_dir: Path) -> str:
    """The command that shrinks the run stored in ``run_dir`` (printed under a failing verdict)."""
    return f"wd-chaos shrink {shlex.quote(str(run_dir))}"
