"""Fault kinds, one module each, and the nemesis that runs them.

A kind's module holds everything about it (``base.FaultKind``): its ``[[faults]]`` entry and
scheduled event (pydantic models), how ``scenario.plan`` turns an entry into events, the nemesis's
action and final heal, what it needs from a store's kit and from the run's servers, its bite checks
(``checks.core.bite_check``, found by ``checks.registry``), and how the report draws it.
``base.kinds`` finds every kind in this package, so adding a kind is adding one module here.
"""

from __future__ import annotations

from .base import TARGET_WAIT, EventSpec, FaultKind, FaultSpec, Marker, kind, kinds, launching, service_needs
from .nemesis import Active, Nemesis

__all__ = [
    "TARGET_WAIT",
    "Active",
    "EventSpec",
    "FaultKind",
    "FaultSpec",
    "Marker",
    "Nemesis",
    "kind",
    "kinds",
    "launching",
    "service_needs",
]
