"""The two records that cross a process boundary in a run, each defined once and validated where
it is written and where it is read:

- ``RunConfig``: the run's ``config.json``, written by the controller (``runner.run``) and read by
  every worker, writer, reader and sweeper process (``workload``) and every locust user
  (``storms``). Its lease, workload, lifecycle and storm sections are the scenario file's own
  models (``scenario.Lease``, ...), so a field added to a scenario is in the config too.
- ``HistoryLine``: one line of a history file, checked by ``history.HistoryWriter`` before it is
  written and by ``history.merge`` / ``history.load_finished`` when read; the lines stay plain
  JSON objects (``history.Op``) for the checkers. It is defined in ``wd_chaos.history`` (with
  ``Outcome``, ``OUTCOMES``, ``check_line``, ``ConfigError`` and ``errors``), the bottom of the
  harness, which imports nothing of it; this module re-exports those names.

Both keep the JSON shapes the files always had (``reports/README.md``). A key a run adds before it
is typed here still travels: ``RunConfig`` keeps unknown keys, readable as ``cfg["key"]`` or
``cfg.get("key")``, which every section also answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .history import OUTCOMES, ConfigError, HistoryLine, Outcome, check_line, errors
from .scenario import Lease, Lifecycle, Storm, Workload

__all__ = [
    "OUTCOMES",
    "Outcome",
    "check_line",
    "ConfigError",
    "HistoryLine",
    "LeaseConfig",
    "LifecycleConfig",
    "RunConfig",
    "StormConfig",
    "WorkloadConfig",
    "errors",
    "load",
]


class _Keyed:
    """Mapping-style reads (``cfg["seed"]``, ``cfg.get("failing", [])``) of a model's fields and
    kept extra keys, so code written against the JSON keys reads the typed record unchanged."""

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default: Any = None) -> Any:
        """The field or kept key ``key``, else ``default``."""
        return getattr(self, key, default)


class LeaseConfig(_Keyed, Lease):
    """The scenario's ``[lease]`` as the processes get it (seconds)."""


class WorkloadConfig(_Keyed, Workload):
    """The scenario's ``[workload]``, with ``workers`` and ``client`` as the command line set them."""


class LifecycleConfig(_Keyed, Lifecycle):
    """The scenario's ``[lifecycle]`` (retention and retries)."""


class StormConfig(_Keyed, Storm):
    """The scenario's ``[storm]`` (locust load)."""


class RunConfig(_Keyed, BaseModel):
    """One run's ``config.json``: everything a worker, writer, reader, sweeper or locust user
    process needs, written once by the controller before it starts them."""

    model_config = ConfigDict(extra="allow", frozen=True)

    run_dir: Path
    """The run's folder: history files (``procs/``), failpoint files, the store file for SQLite."""
    store: dict[str, Any]
    """The store spec ``stores.open_store`` opens: ``store`` (the kit's name; ``kind`` in runs
    recorded before kits) and what that kit needs."""
    lease: LeaseConfig
    workload: WorkloadConfig
    seed: int
    workflows: list[str]
    starts: list[float]
    """Seconds after ``t0`` at which each of ``workflows`` starts (same order)."""
    t0: float
    """The workload's start, wall-clock seconds since the epoch."""
    retry_seconds: float = Field(gt=0)
    """How long a worker retries a call that failed with a store error."""
    lifecycle: LifecycleConfig | None = None
    failing: list[str] = Field(default_factory=list)
    """Workflows whose body fails on purpose (lifecycle runs)."""
    worker_urls: dict[str, str] = Field(default_factory=dict)
    """Each worker's store URL through its own toxiproxy proxy (partition runs)."""
    wakeup_urls: dict[str, str] = Field(default_factory=dict)
    """Each worker's wakeup URL through a toxiproxy proxy of its own (wakeup-loss runs)."""
    worker_specs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Settings a worker lays over ``store`` (a mixed fleet's variant, by worker name)."""
    storm: StormConfig | None = None

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if not isinstance(self.store.get("store") or self.store.get("kind"), str):
            raise ValueError("store: expected a spec with a 'store' (the store kit's name)")
        if len(self.starts) != len(self.workflows):
            raise ValueError(f"starts: expected one per workflow ({len(self.workflows)}), got {len(self.starts)}")
        unknown = sorted(set(self.failing) - set(self.workflows))
        if unknown:
            raise ValueError(f"failing: {unknown} are not among the workflows")
        return self

    def to_json(self) -> str:
        """The config.json text (the same keys and shapes the file always had)."""
        return self.model_dump_json(indent=2)


def validate(data: object, source: str) -> RunConfig:
    """``data`` (parsed JSON) as a ``RunConfig``; raises ``ConfigError`` naming ``source``."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(errors(exc, source)) from exc


def load(path: Path) -> RunConfig:
    """Read and validate a run's config.json; raises ``ConfigError`` naming the file and field."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from exc
    return validate(data, str(path))
