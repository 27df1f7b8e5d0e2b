"""A scenario's ``[fleet]``: workers of one run that open the store with different settings, as a
rolling deploy or an admin script beside the workers does (``mixed-fleet``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

FleetValue = bool | int | float | str


class Fleet(BaseModel):
    """A mixed fleet. Worker ``i`` opens the store with ``variants[i % len(variants)]`` laid over
    the run's store spec (keys of the store kit's worker spec, e.g. Postgres's ``fast_failover``);
    its history's start line names the variant it runs, and a restarted worker keeps its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    variants: list[dict[str, FleetValue]] = Field(min_length=2)
    """The settings the workers take in turn (a variant listed twice runs on twice as many
    workers); at least two that differ, or the fleet is not mixed."""

    @field_validator("variants")
    @classmethod
    def _mixed(cls, variants: list[dict[str, FleetValue]]) -> list[dict[str, FleetValue]]:
        if len({tuple(sorted(v.items())) for v in variants}) < 2:
            raise ValueError("expected at least two different variants: every worker has the same settings")
        return variants

    def of(self, index: int) -> dict[str, FleetValue]:
        """The settings worker ``index`` runs with."""
        return self.variants[index % len(self.variants)]


def fleet_specs(fleet: Fleet | None, workers: int) -> dict[str, dict[str, Any]]:
    """Each worker's variant by process name (``worker-0`` ...); {} for a fleet whose workers are
    alike (``fleet`` None)."""
    if fleet is None:
        return {}
    return {f"worker-{i}": dict(fleet.of(i)) for i in range(workers)}
