"""Store kits: found by entry point, matched to scenarios by what they provide, and the mutant
catalogue they name checked for killers that exist."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from wd_chaos.control.kits import check_store, stores_for, why_not
from wd_chaos.mutants import CatalogueError, Mutant, catalogue, check_killers
from wd_chaos.scenario import OptionError, find, parse
from without_durability.testing import kit as kit_module
from without_durability.testing.kit import KitError, StoreKit, find_kit, kits, resolve

ROOT = Path(__file__).resolve().parents[1]
BUILT_IN = {"memory", "sqlite", "postgres", "redis-set", "redis-stream", "redis-cluster", "redis-cluster-stream"}


def test_every_built_in_store_registers_its_kit_by_entry_point() -> None:
    found = kits()
    assert set(found) >= BUILT_IN, sorted(found)
    for name, one in found.items():
        assert one.name == name, (name, one.name)
    assert resolve("redis") == "redis-set"  # the name wd-chaos used before kits


def test_an_unknown_store_names_the_installed_kits_and_the_entry_point_group() -> None:
    with pytest.raises(KitError) as caught:
        find_kit("oracle")
    message = str(caught.value)
    assert "no store kit 'oracle'" in message and "sqlite" in message, message
    assert "without_durability.stores" in message, message


class _Entry:
    def __init__(self, name: str, value: Any) -> None:
        self.name, self.value, self._value = name, "pkg.mod:KIT", value

    def load(self) -> Any:
        return self._value


class _Named(StoreKit):
    name = "other"


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (_Entry("mine", _Named()), "the entry's name must be the kit's name"),
        (_Entry("mine", object()), "not a StoreKit"),
    ],
)
def test_a_malformed_entry_point_is_refused_with_what_it_gave(entry: _Entry, expected: str) -> None:
    with pytest.raises(KitError, match=expected):
        kit_module._load(entry)


def test_a_scenario_runs_on_every_kit_that_provides_what_it_needs() -> None:
    assert {"sqlite", "postgres", "redis-set", "redis-stream", "redis-cluster"} <= set(
        stores_for(find("lease-stall"))
    )
    assert "memory" not in stores_for(find("lease-stall"))  # one process only: no workers
    partition = stores_for(find("partition"))
    assert {"postgres", "redis-set", "redis-stream"} <= set(partition), partition
    assert "sqlite" not in partition and "redis-cluster" not in partition, partition
    assert stores_for(find("transact-stall")) == ["postgres"]
    assert "sqlite" not in stores_for(find("store-restart"))


def test_a_store_that_lacks_a_need_is_refused_naming_what_it_lacks() -> None:
    reason = why_not(find("partition"), "redis-cluster")
    assert reason is not None and "does not provide proxy" in reason, reason
    with pytest.raises(OptionError, match=r"--store: .*does not provide restart"):
        check_store(find("store-restart"), "sqlite")
    assert check_store(find("lease-stall"), "redis") == "redis-set"


class _Replicating(StoreKit):
    name = "replicating"
    provides = frozenset({"workers", "failover"})


def test_failover_runs_on_every_kit_that_provides_it_and_a_new_one_touches_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kit's ``provides`` alone puts it under the failover scenarios: no list in the harness
    or the scenario files names the stores that replicate."""
    for name in ("failover", "failover-async"):
        assert stores_for(find(name)) == ["postgres", "redis-set"], name
    reason = why_not(find("failover"), "redis-stream")
    assert reason is not None and "does not provide failover" in reason, reason
    monkeypatch.setattr(kit_module, "_KITS", {**kits(), "replicating": _Replicating()})
    assert "replicating" in stores_for(find("failover"))
    assert "replicating" in stores_for(find("failover-async"))


def test_a_failover_run_on_a_kit_without_replication_says_so() -> None:
    from wd_chaos.control.services import check_available

    reason = check_available("sqlite", False, True)
    assert reason is not None and "'sqlite' does not provide failover" in reason, reason
    with pytest.raises(KitError, match="cannot start a replicated deployment"):
        find_kit("sqlite").replicated(synchronous=True)


def test_a_scenario_can_still_name_its_stores_and_declare_extra_needs() -> None:
    only = parse('name = "x"\nstores = ["redis"]\nneeds = ["restart"]', "x.toml")
    assert only.stores == ["redis-set"]
    assert stores_for(only) == ["redis-set"]
    assert "restart" in only.requires()


def _mutant(*killers: str) -> Mutant:
    return Mutant("m", "sqlite", "g", "d", killers, lambda durable: durable)


@pytest.mark.parametrize(
    ("killer", "expected"),
    [
        ("test_no_such_conformance_test", "is not a test of the conformance suite"),
        ("tests/test_sqlite.py::test_no_such_test", "defines no test"),
        ("chaos:no-such-scenario:fencing", "no scenario 'no-such-scenario'"),
        ("chaos:lease-stall:no-such-checker", "runs no checker 'no-such-checker'"),
        ("chaos:lease-stall", "is not chaos:<scenario>:<checker>"),
    ],
)
def test_a_killer_that_names_nothing_is_refused(killer: str, expected: str, monkeypatch: Any) -> None:
    monkeypatch.chdir(ROOT)
    with pytest.raises(CatalogueError, match=expected):
        check_killers([_mutant(killer)])


def test_a_killer_file_missing_here_is_an_error_only_where_the_gate_runs_it(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    check_killers([_mutant("tests/test_sqlite.py::test_x")])  # loaded from elsewhere: not judged
    with pytest.raises(CatalogueError, match=r"no file tests/test_sqlite\.py"):
        check_killers([_mutant("tests/test_sqlite.py::test_x")], files_required=True)


def test_every_killer_in_the_catalogue_exists(monkeypatch: Any) -> None:
    monkeypatch.chdir(ROOT)
    mutants = catalogue()
    check_killers(mutants, files_required=True)
    assert {"memory", "sqlite", "postgres", "redis-set"} <= {m.store for m in mutants}


def test_wd_chaos_list_shows_every_installed_store_and_where_each_scenario_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "wd_chaos.cli", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for name in kits():
        assert any(line.startswith(f"│ {name} ") for line in lines), f"{name} missing:\n{done.stdout}"
    transact = next(line for line in lines if line.startswith("│ transact-stall "))
    assert "transact-pause" in transact and "postgres" in transact and "sqlite" not in transact, transact
    lease = next(line for line in lines if line.startswith("│ lease-stall "))
    assert "redis-stream" in lease and "redis-cluster" in lease, lease
