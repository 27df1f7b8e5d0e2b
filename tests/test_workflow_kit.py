"""The workflow author's kit (``without_durability.testing.workflow``, ``wd-chaos workflow``): it
says how often each effect can run, and it says no to a nondeterministic body, to a store that
forgets a record, and to a new version that would re-run an in-flight run's effect. The tutorial's
commands run here exactly as the page shows them."""

from __future__ import annotations

import random
import re
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from wd_chaos.cli import main
from without_durability import ManualClock, MemoryCheckpointer, MemoryDurable, MemoryScheduler, Run
from without_durability.testing import (
    EffectLedger,
    ManualTestClock,
    MissingInput,
    StoreUnderTest,
    WorkflowKit,
    check_upgrade,
    check_workflow,
)

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorials" / "test-your-workflow.md"


def reserve(state: dict[str, Any]) -> object:
    state["held"] = state.get("held", 0) + 1
    return state["held"]


async def two_steps(run: Run[Any]) -> object:
    async def charge() -> object:
        return {"id": "ch-1"}

    async def ship() -> object:
        return "shipped"

    held = await run.transact("reserve", reserve, int)
    payment = await run.step("charge", charge, dict)
    await run.sleep("cooling-off", timedelta(days=30))  # skipped: costs no real time
    return [held, payment["id"], await run.step("ship", ship, str)]


async def renamed(run: Run[Any]) -> object:
    async def charge() -> object:
        return {"id": "ch-1"}

    async def ship() -> object:
        return "shipped"

    held = await run.transact("reserve", reserve, int)
    payment = await run.step("charge-card", charge, dict)
    await run.sleep("cooling-off", timedelta(days=30))
    return [held, payment["id"], await run.step("ship", ship, str)]


async def reshaped(run: Run[Any]) -> object:
    async def charge() -> object:
        return "ch-1"

    async def ship() -> object:
        return "shipped"

    def text(value: object) -> str:
        if not isinstance(value, str):
            raise TypeError(f"expected the charge id as text, got {value!r}")
        return value

    held = await run.transact("reserve", reserve, int)
    payment = await run.step("charge", charge, text)
    await run.sleep("cooling-off", timedelta(days=30))
    return [held, payment, await run.step("ship", ship, str)]


async def random_key(run: Run[Any]) -> object:
    async def charge() -> object:
        return 1

    return await run.step(f"charge-{random.random()}", charge, int)


async def random_result(run: Run[Any]) -> object:
    async def charge() -> object:
        return 1

    await run.step("charge", charge, int)
    return random.random()


async def test_a_two_step_body_reports_how_often_each_effect_runs() -> None:
    ledger = EffectLedger()
    report = await check_workflow(two_steps, ledger=ledger)
    assert report.valid, report.explain()
    assert report.result == [1, "ch-1", "shipped"]
    runs = {s.key: (s.kind, s.most_runs) for s in report.steps}
    assert runs == {
        "reserve": ("transact", 1),
        "charge": ("step", 2),
        "cooling-off": ("sleep", 0),
        "ship": ("step", 2),
    }
    # crash before each of 4 operations, after the body returned, and inside each of 3 effects
    assert report.runs == 1 + 5 + 3
    assert ledger.most("charge") == 2 and ledger.most("ship") == 2


async def test_a_key_chosen_by_random_outside_a_step_is_nondeterministic() -> None:
    report = await check_workflow(random_key)
    assert not report.valid
    problem = report.problems[0]
    assert problem.kind == "nondeterministic" and problem.key.startswith("charge-")
    assert "crashed before the first operation" in problem.message


async def dated_outside(run: Run[Any]) -> object:
    """Keys its charge by the day it runs, read outside any step: after a sleep into another day
    the resumed pass asks another key, and in production charges again."""
    day = date.today().isoformat()

    async def charge() -> object:
        return {"id": f"ch-{day}"}

    payment = await run.step(f"charge-{day}", charge, dict)
    await run.sleep("cooling-off", timedelta(days=2))
    return payment["id"]


async def dated_inside(run: Run[Any]) -> object:
    """The same body with the day taken inside a step: recorded once, read back on every pass."""

    async def today() -> object:
        return date.today().isoformat()

    day = await run.step("day", today, str)

    async def charge() -> object:
        return {"id": f"ch-{day}"}

    payment = await run.step(f"charge-{day}", charge, dict)
    await run.sleep("cooling-off", timedelta(days=2))
    return payment["id"]


async def hour_outside(run: Run[Any]) -> object:
    """A report keyed by the hour (``datetime.now``), read outside any step, across a sleep of hours."""
    hour = datetime.now(UTC).strftime("%Y-%m-%dT%H")

    async def send() -> object:
        return hour

    sent = await run.step(f"report-{hour}", send, str)
    await run.sleep("wait", timedelta(hours=3))
    return sent


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_a_key_from_the_date_outside_a_step_is_caught_and_inside_one_is_not(store: str) -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC).date()  # the day the kit's store clock starts on
    bad = await check_workflow(dated_outside, store=store)
    assert not bad.valid and bad.problems[0].kind == "nondeterministic", bad.explain()
    for day in (start, start + timedelta(days=2)):
        assert f"charge-{day.isoformat()}" in bad.explain(), bad.explain()
    good = await check_workflow(dated_inside, store=store)
    assert good.valid, good.explain()
    assert good.result == f"ch-{start.isoformat()}", good.result  # the store's clock, not the machine's


async def test_a_key_from_the_hour_outside_a_step_is_caught() -> None:
    report = await check_workflow(hour_outside)
    assert not report.valid and report.problems[0].kind == "nondeterministic", report.explain()


async def test_the_body_clock_is_the_machines_again_after_a_check() -> None:
    await check_workflow(dated_inside)
    assert date.today().year < 2030, "the kit left the body's clock patched"


async def test_a_result_chosen_by_random_is_nondeterministic() -> None:
    report = await check_workflow(random_result)
    assert [p.kind for p in report.problems] == ["nondeterministic"]
    assert "returned" in report.problems[0].message


async def test_a_store_that_forgets_a_record_is_caught() -> None:
    """The 'never again' claim can fail: on a store whose load drops 'charge', a crash after
    'charge' was recorded makes the resumed pass charge again."""

    class Forgetful(MemoryCheckpointer):
        async def load(self, workflow: str) -> dict[str, object]:
            return {k: v for k, v in (await super().load(workflow)).items() if k != "charge"}

    @asynccontextmanager
    async def forgetful() -> AsyncIterator[StoreUnderTest[Any]]:
        clock = ManualClock()
        checkpointer = Forgetful(clock=clock)
        durable = MemoryDurable(checkpointer, MemoryScheduler(clock=clock))
        yield StoreUnderTest("forgetful", durable, ManualTestClock(clock), None)  # type: ignore[arg-type]

    report = await check_workflow(two_steps, store=forgetful)
    assert [(p.kind, p.key) for p in report.problems] == [("repeated", "charge")], report.explain()
    assert (
        await check_workflow(two_steps, store="memory")
    ).valid  # and the same body on the real store is fine


async def test_a_renamed_step_fails_the_upgrade_naming_the_old_key() -> None:
    report = await check_upgrade(renamed, two_steps)
    assert [(p.kind, p.key) for p in report.problems] == [("renamed", "charge")]
    assert "'charge-card'" in report.problems[0].message


async def test_a_version_replays_against_itself() -> None:
    report = await check_upgrade(two_steps, two_steps)
    assert report.valid, report.explain()
    assert report.replayed == 5  # stopped before each of its 4 operations, and after it returned


async def test_a_removed_step_is_not_a_rename() -> None:
    async def without_charge(run: Run[Any]) -> object:
        async def ship() -> object:
            return "shipped"

        held = await run.transact("reserve", reserve, int)
        await run.sleep("cooling-off", timedelta(days=30))
        return [held, "ch-1", await run.step("ship", ship, str)]

    report = await check_upgrade(without_charge, two_steps)
    assert report.valid, report.explain()
    assert report.notes == ["the new version never reads 'charge', which the old version recorded"]


async def test_a_changed_shape_fails_the_upgrade() -> None:
    report = await check_upgrade(reshaped, two_steps)
    assert [(p.kind, p.key) for p in report.problems] == [("shape", "charge")], report.explain()


async def test_an_awaited_key_without_input_is_a_usage_error() -> None:
    async def waits(run: Run[Any]) -> object:
        return await run.awaiting("order", dict)

    with pytest.raises(MissingInput, match="'order'"):
        await check_workflow(waits)
    assert (await check_workflow(waits, inputs={"order": {"n": 1}})).result == {"n": 1}


async def test_the_fixture(wd_workflow: WorkflowKit) -> None:
    report = await wd_workflow.check(two_steps)
    assert report.valid and wd_workflow.ledger.most("charge") == 2


# -- the command line ----------------------------------------------------------------------------


def _run(args: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(main, args)
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["examples/workflows/nope.py:checkout"], "no file"),
        (["no_such_module_here:checkout"], "cannot import module"),
        (["examples/workflows/checkout.py:as_dict"], "not an async function"),
        (["examples/workflows/checkout.py:checkout"], "the inputs do not give"),
        (["examples/workflows/checkout.py:checkout", "--input", "[1]"], "expected a JSON object"),
        (["checkout"], "expected MODULE:FUNCTION"),
    ],
)
def test_usage_errors_exit_64_saying_what_to_do(
    args: list[str], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, output = _run(["workflow", *args], monkeypatch)
    assert code == 64 and says in output, output


def test_a_body_failing_without_faults_exits_1_naming_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    # checkout's transact effect is SQL: on the Memory store it fails before any crash
    order = '{"order": {"sku": "piano", "amount": 4200}}'
    code, output = _run(
        ["workflow", "examples/workflows/checkout.py:checkout", "--input", order], monkeypatch
    )
    assert code == 1 and "store's language" in output, output


def test_a_harness_failure_exits_255(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("the kit broke")

    monkeypatch.setattr("wd_chaos.workflow_cmd.check_workflow", broken)
    code, output = _run(["workflow", "examples/workflows/lucky.py:lucky_fixed"], monkeypatch)
    assert code == 255, output


def _tutorial_commands() -> list[tuple[str, int]]:
    """Every ``wd-chaos workflow`` and ``python -m pytest`` command of the tutorial, with the exit
    status the page says it ends with (the comment on its last line)."""
    text = TUTORIAL.read_text().replace("\\\n", " ")
    found = re.findall(r"^((?:wd-chaos workflow|python -m pytest) .+?)\s+# exits (\d+)", text, re.MULTILINE)
    return [(" ".join(cmd.split()), int(code)) for cmd, code in found]


def test_the_tutorial_shows_the_commands_tested_here() -> None:
    commands = _tutorial_commands()
    assert len(commands) >= 5, commands
    assert {code for _, code in commands} == {0, 1}


@pytest.mark.parametrize(
    "command",
    [c for c, _ in _tutorial_commands() if c.startswith("wd-chaos")],
    ids=lambda c: " ".join(a.rpartition("/")[2] for a in shlex.split(c)[2:] if not a.startswith("{")),
)
def test_the_tutorial_commands_exit_as_the_page_says(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    want = dict(_tutorial_commands())[command]
    code, output = _run(shlex.split(command)[1:], monkeypatch)
    assert code == want, f"{command}: expected exit {want}, got {code}:\n{output}"
    if "--replay-against" in command and want == 1:
        assert "renamed at 'charge'" in output, output


def test_the_tutorials_pytest_command_passes() -> None:
    (command, want), *_ = [c for c in _tutorial_commands() if c[0].startswith("python -m pytest")]
    argv = [sys.executable, *shlex.split(command)[1:], "-p", "no:cacheprovider"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == want, done.stdout + done.stderr
