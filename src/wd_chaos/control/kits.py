"""Which installed store kits a scenario runs on: a scenario says what it needs (``Scenario.requires``),
a kit says what it provides (``StoreKit.provides``), and every kit that provides it qualifies, unless
the scenario names its ``stores``. Nothing here names a store."""

from __future__ import annotations

import re
from importlib import metadata

from without_durability.testing.kit import KitError, StoreKit, broken_kits, find_kit, kits

from ..scenario import OptionError, Scenario


def chaos_kits() -> dict[str, StoreKit]:
    """Every installed kit whose store worker processes can open (what every wd-chaos run needs)."""
    return {name: kit for name, kit in kits().items() if "workers" in kit.provides}


def why_not(scenario: Scenario, store: str) -> str | None:
    """Why ``scenario`` cannot run on the kit ``store`` (unknown, not among its ``stores``, or
    lacking what it needs), or None when it can."""
    try:
        kit = find_kit(store)
    except KitError as exc:
        return str(exc)
    if scenario.stores is not None and kit.name not in scenario.stores:
        return f"scenario {scenario.name!r} applies to {scenario.stores}, not {kit.name!r}"
    lacking = kit.lacks(scenario.requires())
    if lacking:
        return (
            f"scenario {scenario.name!r} needs {', '.join(sorted(scenario.requires()))}; "
            f"store kit {kit.name!r} does not provide {', '.join(lacking)}"
        )
    return None


def stores_for(scenario: Scenario) -> list[str]:
    """The installed kits ``scenario`` runs on, by name."""
    return [name for name in kits() if why_not(scenario, name) is None]


def check_store(scenario: Scenario, store: str) -> str:
    """``store``'s kit name when ``scenario`` runs on it, else ``OptionError`` saying why."""
    reason = why_not(scenario, store)
    if reason is not None:
        raise OptionError(f"--store: {reason}")
    return find_kit(store).name


def _extra_for(module: str) -> str | None:
    """The extra of this distribution that installs ``module`` (a requirement of the same name)."""
    try:
        requires = metadata.requires("without-durability") or []
    except metadata.PackageNotFoundError:
        return None
    wanted = module.replace("_", "-").lower()
    for line in requires:
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", line)
        name = re.match(r"[A-Za-z0-9._-]+", line)
        if extra and name and name.group(0).replace("_", "-").lower() == wanted:
            return extra.group(1)
    return None


def missing_kits(scenario: Scenario) -> dict[str, str]:
    """The stores ``scenario`` names whose kits are registered but not loadable here (a driver
    not installed), each with what to install: ``{"redis": 'the redis extra: pip install ".[redis]"'}``."""
    if scenario.stores is None:
        return {}
    installed = kits()
    broken = broken_kits()
    out: dict[str, str] = {}
    for name in scenario.stores:
        if name in installed:
            continue
        why = next((w for k, w in broken.items() if k == name or k.startswith(name + "-")), None)
        if why is None:
            continue
        module = re.search(r"No module named '([^'.]+)", why)
        extra = _extra_for(module.group(1)) if module else None
        out[name] = (
            f'the {extra} extra: pip install ".[{extra}]" (in a checkout)'
            if extra
            else f"its kit, which failed to load: {why}"
        )
    return out
