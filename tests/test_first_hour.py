"""Issue #48, what a new user meets first: a run whose loss its scenario expects is a verdict of
its own (EXPECTED, exit 0) in every view; the verdict table's rows say what they mean; ``--json``
carries evidence and the commands to reproduce and shrink."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from rich.console import Console

from wd_chaos import checks
from wd_chaos.analyze import EXPECTED, Outcome, expected_loss
from wd_chaos.commands.common import Result, _junit, _verdict_table
from wd_chaos.commands.run import _worst
from wd_chaos.report import write_report
from wd_chaos.serve import stored_runs


def _relaxed_verdicts(lost: int = 94) -> list[checks.Verdict]:
    """The verdicts of a power-loss-relaxed run as one came out on SQLite: durability counts the
    loss, and fencing fails as its consequence (the token counter was among the writes lost)."""
    return [
        checks.Verdict("fencing", False, "96 fencing violation(s)", [{"why": "same token issued twice", "op": "w:1"}]),
        checks.Verdict("order", True, "every load in order"),
        checks.Verdict(
            "durability",
            not lost,
            f"{lost} of 420 acknowledged writes lost",
            [{"why": "acknowledged, then lost", "workflow": "wf-1", "key": "charge"}] if lost else [],
            {"acknowledged": 420, "lost": lost},
        ),
        checks.Verdict("bite: power-loss-dropped", True, "2 power loss(es) dropped unsynced writes", [], {"bit": 2}),
    ]


def _summary(run_dir: Path, verdicts: list[checks.Verdict], expected: dict[str, Any] | None) -> dict[str, Any]:
    valid = checks.overall(verdicts)
    return {
        "scenario": "power-loss-relaxed", "store": "sqlite", "seed": 1, "time_limit": 12.0, "workers": 4,
        "workflows": 60, "valid": valid, "verdict": EXPECTED if expected else "invalid", "expected": expected,
        "exit_code": 0 if expected else 1, "schedule_from": "seed", "client": "harness", "wall_seconds": 23.4,
        "verdicts": [v.as_dict() for v in verdicts], "counts": {}, "faults": [], "coverage": {},
    }  # fmt: skip


def _outcome(tmp_path: Path, lost: int = 94, expect: str = "lost-writes") -> Outcome:
    verdicts = _relaxed_verdicts(lost)
    valid = checks.overall(verdicts)
    expected = expected_loss(expect, verdicts, valid)
    run_dir = tmp_path / "20261207T061229-power-loss-relaxed-sqlite"
    run_dir.mkdir(parents=True, exist_ok=True)
    summary = _summary(run_dir, verdicts, expected)
    (run_dir / "summary.json").write_text(json.dumps(summary, default=str))
    return Outcome(run_dir, verdicts, valid, summary, expected)


def _table_text(outcome: Outcome) -> str:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(_verdict_table(outcome))
    return console.export_text()


def test_the_loss_a_scenario_expects_is_an_expected_verdict_with_its_figure(tmp_path: Path) -> None:
    outcome = _outcome(tmp_path)
    assert outcome.expected is not None, "a relaxed run that lost writes must be EXPECTED"
    assert (outcome.verdict, outcome.exit_code) == ("expected", 0)
    assert outcome.expected["lost"] == 94 and outcome.expected["consequences"] == ["fencing"]

    result = Result("power-loss-relaxed", "sqlite", 1, outcome)
    record = result.record()
    assert (record["verdict"], record["exit_code"]) == ("expected", 0), record
    assert record["expected"]["lost"] == 94 and "shrink" not in record, record
    assert _worst([result]) == 0

    text = _table_text(outcome)
    assert "EXPECTED" in text and "94 of 420 acknowledged writes lost" in text, text
    assert "INVALID" not in text.splitlines()[0], text.splitlines()[0]

    junit = tmp_path / "r.xml"
    _junit(junit, [result])
    suite = ET.parse(junit).getroot()
    assert suite.get("failures") == "0" and suite.get("errors") == "0", ET.tostring(suite)
    (case,) = suite.findall("testcase")
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["verdict"] == "expected", props
    assert "94 of 420" in str(case.findtext("system-out")), ET.tostring(case)

    (run,) = stored_runs(tmp_path)
    assert run.verdict == "EXPECTED", run

    write_report(outcome.run_dir, outcome.summary, [], {})  # type: ignore[arg-type]
    page = (outcome.run_dir / "report.html").read_text()
    assert ">EXPECTED<" in page and "94 of 420 acknowledged writes" in page, page[:2000]
    assert "smallest failing fault schedule" not in page


def test_a_loss_is_expected_only_where_the_scenario_expects_it_and_only_when_it_happened(tmp_path: Path) -> None:
    assert _outcome(tmp_path / "a", expect="valid").expected is None, "a valid-expected scenario's loss is a failure"
    lossless = _outcome(tmp_path / "b", lost=0)
    assert lossless.expected is None and lossless.verdict == "invalid"  # fencing still failed: no loss explains it
    unbitten = _relaxed_verdicts()
    unbitten[-1] = checks.Verdict("bite: power-loss-dropped", checks.UNKNOWN, "did not bite", [], {"bit": 0})
    assert expected_loss("lost-writes", unbitten, False) is None


def test_an_invalid_run_s_table_and_json_show_evidence_and_the_commands(tmp_path: Path) -> None:
    """Issue #48 items 5 and 8: no empty "e.g. :" under coverage, a bite row says it bit (not
    "valid" beside a failure), and --json carries first evidence, reproduce and shrink."""
    verdicts = [
        checks.Verdict("fencing", False, "1 stale write landed", [{"why": "stale", "workflow": "wf-1", "token": 3}]),
        checks.Verdict(
            "coverage", checks.UNKNOWN, "not tested: stall-mid-step never reached",
            [{"window": "stall-mid-step", "what": "a stall inside a step", "hits": 0}], {"stall-mid-step": 0},
        ),
        checks.Verdict("bite: stall-fenced", True, "1 stalled pass fenced", [], {"bit": 1}),
    ]  # fmt: skip
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    summary = {
        "scenario": "lease-stall", "store": "sqlite", "seed": 3, "time_limit": 24.0, "workers": 4,
        "wall_seconds": 30.0, "valid": False,
    }  # fmt: skip
    outcome = Outcome(run_dir, verdicts, False, summary)
    text = _table_text(outcome)
    assert "e.g. :" not in text and "e.g. a stall inside a step: window=stall-mid-step, hits=0" in text, text
    bite_row = next(line for line in text.splitlines() if "bite: stall-fenced" in line)
    assert "valid" not in bite_row and "bit" in bite_row.split("bite: stall-fenced")[1], bite_row

    record = Result("lease-stall", "sqlite", 3, outcome).record()
    fencing = record["checkers"][0]
    assert fencing["evidence"] == {"why": "stale", "workflow": "wf-1", "token": 3}, fencing
    assert record["reproduce"].startswith("wd-chaos run lease-stall --store sqlite --seed 3"), record
    assert record["shrink"] == f"wd-chaos shrink {run_dir}", record


_WITHOUT_REDIS = '''
import sys


class _NoRedis:
    """As if the redis extra were not installed: redis-py cannot be imported."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("redis", "hiredis"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoRedis())
from wd_chaos.cli import main

sys.argv[0] = "wd-chaos"
main()
'''


def test_a_scenario_whose_store_kit_is_missing_says_which_extra_not_invalid(tmp_path: Path) -> None:
    """Issue #48 item 3: with only [chaos], list showed claim-burst and clock-step "invalid" with
    a machine path. A scenario naming a store whose driver is missing is listed, with the pip
    command for that store's extra; a scenario that also runs elsewhere just runs there."""
    import os
    import subprocess
    import sys

    script = tmp_path / "without_redis.py"
    script.write_text(_WITHOUT_REDIS)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), *args], capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip

    listed = cli("list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["name"]: r for r in map(json.loads, listed.stdout.splitlines()) if r["type"] == "scenario"}
    invalid = {name: r["error"] for name, r in rows.items() if r["error"]}
    assert not invalid, f"scenarios listed invalid for want of a driver: {invalid}"
    burst = rows["claim-burst"]
    assert burst["stores"] == [] and 'pip install ".[redis]"' in burst["install"]["redis"], burst
    assert "sqlite" in rows["clock-step"]["stores"], rows["clock-step"]
    table = cli("list")
    assert table.returncode == 0, table.stderr
    line = next(line for line in table.stdout.splitlines() if "claim-burst" in line)
    assert "needs redis" in line and "invalid" not in table.stdout, table.stdout
    assert str(Path(__file__).resolve().parents[1]) not in table.stdout, "a machine path in the listing"


def test_the_mutant_gate_table_never_splits_a_name_in_a_narrow_pipe() -> None:
    """Issue #48 item 8: piped to a file, wd-chaos mutants' table split names into 6-character pieces."""
    import io

    from wd_chaos.mutants.command import _table
    from wd_chaos.mutants.runner import GateReport, MutantVerdict

    names = ["postgres-claim-upsert-without-its-where-clause", "redis-append-two-numbers-for-one-entry"]
    report = GateReport(
        [MutantVerdict(n, "postgres", "fencing: a stale pass is refused", "", ["fencing"], True, ["fencing"], 12.5)
         for n in names],
        [], 30.0,
    )  # fmt: skip
    out = io.StringIO()
    Console(file=out, width=80).print(_table(report))
    text = out.getvalue()
    for name in names:
        assert name in text, f"{name!r} split in an 80-column pipe:\n{text}"


def test_workflow_help_examples_run_as_printed() -> None:
    """Issue #48 item 7: `wd-chaos workflow --help`'s own examples left out --store sqlite and
    crashed (AttributeError). Each example on a file in examples/ runs from the repository's root
    to a verdict: the first VALID, the upgrade check INVALID as its note says; never a crash."""
    import os
    import shlex
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "COLUMNS": "200"}
    shown = subprocess.run(
        [sys.executable, "-m", "wd_chaos.cli", "workflow", "--help"], capture_output=True, text=True,
        timeout=60, check=False, cwd=root, env=env,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    examples = [line.strip() for line in shown.stdout.splitlines() if line.strip().startswith("wd-chaos workflow examples/")]
    assert len(examples) >= 2, shown.stdout
    for example in examples:
        command, _, note = example.partition("    (")
        words = shlex.split(command)
        assert words[:2] == ["wd-chaos", "workflow"] and "--store" in words, example
        ran = subprocess.run(
            [sys.executable, "-m", "wd_chaos.cli", *words[1:]], capture_output=True, text=True, timeout=120,
            check=False, cwd=root, env=env,
        )  # fmt: skip
        wanted = 1 if note.startswith("exits 1") else 0
        assert ran.returncode == wanted, f"{example}: exit {ran.returncode}\n{ran.stdout[-2000:]}\n{ran.stderr[-2000:]}"
        assert "Traceback" not in ran.stderr and "AttributeError" not in ran.stdout + ran.stderr, ran.stderr


def _serve(root: Path) -> Any:
    import threading

    from wd_chaos.serve import make_server

    server = make_server(root, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _stored(folder: Path, scenario: str = "lease-stall", valid: object = True) -> Path:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({
        "scenario": scenario, "store": "sqlite", "seed": 1, "valid": valid, "verdicts": [], "wall_seconds": 3.0,
    }))  # fmt: skip
    (folder / "report.html").write_text("<html>report</html>")
    return folder


def test_serve_zips_a_run_without_following_links_out_of_the_root(tmp_path: Path) -> None:
    """Issue #48 item 9: the zip followed a symlink in the run folder and shipped a file outside
    the served root (the file route refuses the same link with 403)."""
    import io
    import urllib.error
    import urllib.request
    import zipfile

    import pytest

    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("not yours")
    root = tmp_path / "reports"
    run = _stored(root / "20261207T060000-lease-stall-sqlite")
    (run / "leak.txt").symlink_to(secret)
    (run / "leakdir").symlink_to(secret.parent, target_is_directory=True)
    server = _serve(root)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/runs/{run.name}/leak.txt")
        assert refused.value.code == 403
        body = urllib.request.urlopen(f"{url}/zip/{run.name}.zip").read()
    finally:
        server.shutdown()
        server.server_close()
    names = zipfile.ZipFile(io.BytesIO(body)).namelist()
    assert f"{run.name}/summary.json" in names, names
    assert not any("leak" in n for n in names), f"the zip followed a link out of the root: {names}"


def test_serve_groups_a_shrink_s_candidates_under_it_and_links_the_latest(tmp_path: Path) -> None:
    import urllib.request

    from wd_chaos.serve import stored_runs

    root = tmp_path / "reports"
    _stored(root / "20261207T050000-lease-stall-sqlite", valid=False)
    shrink = root / "20261207T051000-shrink-lease-stall-sqlite"
    for i in range(3):
        _stored(shrink / "runs" / f"20261207T05200{i}-lease-stall-sqlite", valid=i != 1)
    (shrink / "shrink.json").write_text("{}")
    (shrink / "report.md").write_text("# shrink")
    runs = stored_runs(root)
    assert [r.shrink for r in runs].count(shrink.name) == 3, runs
    server = _serve(root)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        index = urllib.request.urlopen(url + "/").read().decode()
        latest = urllib.request.urlopen(url + "/latest")
        landed = latest.geturl()
    finally:
        server.shutdown()
        server.server_close()
    main_table, _, shrinks = index.partition("<h2>Shrinks</h2>")
    assert "20261207T050000-lease-stall-sqlite" in main_table
    assert "20261207T05200" not in main_table, "a shrink's candidate runs listed as runs of their own"
    assert "3 candidate run(s)" in shrinks and shrinks.count("<tr data-verdict") == 3, shrinks
    assert landed.endswith("/runs/20261207T050000-lease-stall-sqlite/report.html"), landed


def test_serve_listens_on_loopback_and_warns_for_any_other_host(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    from without_durability.testing.servers import free_port

    (tmp_path / "reports").mkdir()
    for host, warned in (("127.0.0.1", False), ("0.0.0.0", True)):
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "wd_chaos.cli", "serve", str(tmp_path / "reports"), "--port", str(port),
             "--host", host],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ},
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
        finally:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        assert f"http://{host}:{port}/" in line, line
        assert ("warning" in err and "anyone who can reach" in err) == warned, err
    shown = subprocess.run(
        [sys.executable, "-m", "wd_chaos.cli", "serve", "--help"], capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert "--host" in shown.stdout and "127.0.0.1" in shown.stdout, shown.stdout


def test_smaller_first_hour_items(tmp_path: Path) -> None:
    """Issue #48 item 11: a negative seed is a usage error (as sim's); an alias says which kit it
    means; clean's help says where it looks for servers; the example tests raise no
    PytestConfigWarning where pytest-timeout is not installed (-p no:timeout stands in for that)."""
    import os
    import subprocess
    import sys

    from click.testing import CliRunner

    from wd_chaos.cli import USAGE, main

    refused = CliRunner().invoke(main, ["run", "lease-stall", "--seed", "-1", "--check"])
    assert refused.exit_code == USAGE and "0 or more" in refused.output, refused.output
    alias = CliRunner().invoke(main, ["run", "lease-stall", "--store", "redis", "--check", "--report-dir", str(tmp_path)])
    assert "--store redis is the store kit redis-set" in alias.output, alias.output
    helped = CliRunner().invoke(main, ["clean", "--help"], terminal_width=200)
    assert "temporary folder" in helped.output and "--no-servers" in helped.output, helped.output

    root = Path(__file__).resolve().parents[1]
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "examples/workflows/test_checkout.py", "-q", "-p", "no:timeout",
         "-p", "no:cacheprovider", "-W", "error::pytest.PytestConfigWarning"],
        cwd=root, capture_output=True, text=True, timeout=300, check=False, env={**os.environ},
    )  # fmt: skip
    assert ran.returncode == 0, f"{ran.stdout[-3000:]}\n{ran.stderr[-2000:]}"
    assert "PytestConfigWarning" not in ran.stdout + ran.stderr, ran.stdout
