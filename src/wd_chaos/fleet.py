"""A fleet of workers whose settings differ (``mixed-fleet``) or change under load (a ``deploy``
fault, ``rolling-deploy``): a scenario's ``[fleet]``, each worker's variant, and where a deployed
worker finds the settings it restarts with.

A variant is a dict: keys of the store kit's worker spec laid over the run's store spec (e.g.
Postgres's ``fast_failover``; keys the kit's spec does not have are dropped, so one scenario runs
on every store), and optionally ``lease``, a dict of ``alive``, ``budget``, ``visibility`` and
``poll_interval`` seconds laid over the run's ``[lease]``, and ``workflow_version``: which version of
the test workflow the worker runs (1, the default; 2 adds a step, ``audit``, after ``seen``, a
compatible change: either version finishes a workflow the other started)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

FleetValue = bool | int | float | str
Variant = dict[str, FleetValue | dict[str, float]]

LEASE_KEYS = ("alive", "budget", "visibility", "poll_interval")
WORKFLOW_VERSIONS = (1, 2)
"""The versions of the test workflow a variant may name (``workflow_version``)."""
DEPLOYED = "deployed"
"""The run folder's subfolder where a deploy leaves each restarted worker's new variant."""
REPLACE_MARKER = ".replace"
"""The suffix of the marker (``deployed/worker-N.replace``) a ``replace`` fault leaves to ask the
run for a replacement of a worker it stopped, started beside it under its name."""


def check_variant(variant: Variant) -> Variant:
    """``variant`` itself, or ValueError naming what is wrong with its ``lease`` or
    ``workflow_version``."""
    version = variant.get("workflow_version", 1)
    if isinstance(version, bool) or version not in WORKFLOW_VERSIONS:
        raise ValueError(f"workflow_version: expected one of {WORKFLOW_VERSIONS}, got {version!r}")
    lease = variant.get("lease")
    if lease is None:
        return variant
    if not isinstance(lease, dict):
        raise ValueError(f"lease: expected a table of {', '.join(LEASE_KEYS)}, got {lease!r}")
    for key, value in lease.items():
        if key not in LEASE_KEYS:
            raise ValueError(f"lease.{key}: no such lease setting (expected one of {', '.join(LEASE_KEYS)})")
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"lease.{key}: expected a number of seconds > 0, got {value!r}")
    return variant


class Fleet(BaseModel):
    """A mixed fleet. Worker ``i`` runs ``variants[i % len(variants)]`` (see the module
    docstring), keeps it across a restart (a deploy changes it), and names it in its history's
    start line."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    variants: list[Variant] = Field(min_length=2)
    """The settings the workers take in turn (a variant listed twice runs on twice as many
    workers); at least two that differ, or the fleet is not mixed."""

    @field_validator("variants")
    @classmethod
    def _mixed(cls, variants: list[Variant]) -> list[Variant]:
        for variant in variants:
            check_variant(variant)
        if len({json.dumps(v, sort_keys=True) for v in variants}) < 2:
            raise ValueError("expected at least two different variants: every worker has the same settings")
        return variants

    def of(self, index: int) -> Variant:
        """The settings worker ``index`` runs with."""
        return self.variants[index % len(self.variants)]


def fleet_specs(fleet: Fleet | None, workers: int) -> dict[str, Variant]:
    """Each worker's variant by process name (``worker-0`` ...); {} for a fleet whose workers are
    alike (``fleet`` None)."""
    if fleet is None:
        return {}
    return {f"worker-{i}": dict(fleet.of(i)) for i in range(workers)}


def laid_over(base: Variant, change: Variant) -> Variant:
    """``change`` laid over ``base``, ``lease`` merged key by key."""
    out: Variant = {k: v for k, v in {**base, **change}.items() if k != "lease"}
    lease = {**_lease(base), **_lease(change)}
    if lease:
        out["lease"] = lease
    return out


def _lease(variant: Variant) -> dict[str, float]:
    lease = variant.get("lease")
    return dict(lease) if isinstance(lease, dict) else {}


def deployed_file(run_dir: Path, name: str) -> Path:
    """Where a deploy leaves worker ``name``'s new variant (JSON)."""
    return run_dir / DEPLOYED / f"{name}.json"


def deploy(run_dir: Path, name: str, variant: Variant) -> None:
    """Leave ``variant`` for worker ``name``'s next start (written whole, then renamed, so a
    worker starting meanwhile reads the old one or the new one, never half)."""
    path = deployed_file(run_dir, name)
    path.parent.mkdir(exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(variant, sort_keys=True))
    os.replace(partial, path)


def current(run_dir: Path, name: str, configured: Variant) -> Variant:
    """Worker ``name``'s variant now: the last one a deploy left for it, else ``configured``."""
    path = deployed_file(run_dir, name)
    if path.exists():
        found: Variant = json.loads(path.read_text())
        return found
    return configured


def workflow_version(variant: Variant) -> int:
    """The test workflow's version ``variant`` runs (1 unless it says ``workflow_version``)."""
    version = variant.get("workflow_version", 1)
    return version if isinstance(version, int) and not isinstance(version, bool) else 1


def effective(variant: Variant, store: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """What ``variant`` changes for a store whose spec is ``store``: (spec keys it has, lease)."""
    return {k: v for k, v in variant.items() if k != "lease" and k in store}, _lease(variant)
