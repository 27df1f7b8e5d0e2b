"""Which installed store kits a scenario runs on: a scenario says what it needs (``Scenario.requires``),
a kit says what it provides (``StoreKit.provides``), and every kit that provides it qualifies, unless
the scenario names its ``stores``. Nothing here names a store."""

from __future__ import annotations

from without_durability.testing.kit import KitError, StoreKit, find_kit, kits

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
