"""The runtime's catalogue mutants (``without_durability.kits.runtime_mutants``): slips in the
library's Worker and Run, each found by the simulator. A runtime mutant breaks the class in the
process that opens it, so each is judged here in a ``wd-chaos sim`` process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from wd_chaos.mutants import catalogue
from without_durability.kits.runtime_mutants import MUTANTS, RuntimeSlip

FOUND_AT = {
    "runtime-sleep-restarts-each-pass": 0,
    "runtime-worker-answers-a-sleep-as-blocked": 0,
    "runtime-step-runs-its-effect-before-the-lookup": 0,
    "runtime-worker-drops-a-contended-delivery": 6,
    "runtime-wait-loses-its-deadline": 0,
}
"""A seed at which the simulator finds each one it kills (``wd-chaos sim lease-stall --store sqlite
--mutant NAME --seeds 24``: the contended drop on 11 of them, the others on all 24; the same counts
on memory). Their wd-chaos killers (long-wait, budget-overrun: library Workers on SQLite) and the
RetryPolicy and failure-numbering slips' (long-wait's attempt-limit) run in the mutant gate."""


def test_every_runtime_mutant_is_in_the_catalogue_with_harness_killers_only() -> None:
    names = {m.name for m in catalogue()}
    simulated = sorted(m.name for m in MUTANTS if any(k.startswith("sim:") for k in m.killers))
    assert sorted(FOUND_AT) == simulated, "a runtime mutant the simulator kills has no seed below"
    for m in MUTANTS:
        assert m.name in names, f"{m.name} is not in the catalogue (the Memory kit's mutant_modules)"
        assert isinstance(m.wrap, RuntimeSlip), m.name
        # a test killer would open it in the gate's pytest, beside the real stores it would break
        assert m.killers and all(k.startswith(("sim:", "chaos:")) for k in m.killers), m.killers


def test_a_slip_puts_its_method_on_the_class_once_and_hands_the_durable_back() -> None:
    class Part:
        def say(self) -> str:
            return "real"

    def broken(self: Any) -> str:
        return "broken " + slip.original(self)

    slip = RuntimeSlip(Part, "say", broken)
    durable = object()
    assert slip(durable) is durable and slip(durable) is durable
    assert Part().say() == "broken real", "the slip did not take, or took twice"


@pytest.mark.parametrize("mutant", sorted(FOUND_AT))
def test_the_simulator_finds_each_runtime_mutant(mutant: str) -> None:
    m = next(m for m in MUTANTS if m.name == mutant)
    (killer,) = [k for k in m.killers if k.startswith("sim:")]
    _, scenario, checker = killer.split(":")
    command = [sys.executable, "-m", "wd_chaos.cli", "sim", scenario, "--store", m.store]
    command += ["--mutant", mutant, "--seed", str(FOUND_AT[mutant]), "--seeds", "1", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    failing = [name for line in lines for name in line.get("failing", [])]
    assert done.returncode == 1 and checker in failing, (
        f"{mutant}: expected exit 1 with {checker} failing on seed {FOUND_AT[mutant]}, got "
        f"{done.returncode}, {failing}:\n"
        f"{done.stderr[-2000:]}"
    )
