"""``wd-chaos`` as a CI gate (issue 30): every run reported in the JUnit file even when some could
not start, a pre-flight that reaches the servers, usage errors with the names meant, one JSON line
per run, repeats with distinct seeds, help and completion, partial runs judged."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from wd_chaos.cli import CRASHED, USAGE, main
from without_durability.testing.servers import free_port

ROOT = Path(__file__).resolve().parents[1]


def _cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wd_chaos.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "80", **(env or {})},
        check=False,
    )


def _refused_postgres() -> str:
    """A Postgres URL on a loopback port nothing listens on."""
    return f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"


# -- item 1: the JUnit file is always written ---------------------------------------------------


def test_run_all_with_a_refused_server_writes_every_run_as_an_error_case(tmp_path: Path) -> None:
    junit = tmp_path / "all.xml"
    done = _cli(
        "run", "--all", "--store", "postgres", "--junit", str(junit), "--report-dir", str(tmp_path / "r"),
        env={"WD_POSTGRES_URL": _refused_postgres()},
    )  # fmt: skip
    assert done.returncode == CRASHED, f"expected {CRASHED}, got {done.returncode}:\n{done.stderr}"
    assert junit.exists(), f"no JUnit file written:\n{done.stderr}"
    suite = ET.parse(junit).getroot()
    cases = suite.findall("testcase")
    names = {c.get("name") for c in cases}
    assert "lease-stall[postgres]" in names and len(cases) > 3, names
    assert suite.get("errors") == str(len(cases)), ET.tostring(suite)[:500]
    for case in cases:
        error = case.find("error")
        assert error is not None, ET.tostring(case)
        assert "WD_POSTGRES_URL" in str(error.get("message")), error.get("message")
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert props["store"] == "postgres" and props["seed"] == "1", props
    assert "Traceback" not in done.stderr and "psycopg" not in done.stderr, done.stderr


def test_junit_cases_carry_json_evidence_and_properties(tmp_path: Path) -> None:
    """A finished run's case: properties name seed, store, duration and run folder; evidence is
    JSON, not a Python repr."""
    from wd_chaos import checks
    from wd_chaos.cli import Result, _junit
    from wd_chaos.control.runner import Outcome

    bad = checks.Verdict("fencing", False, "1 stale write landed", [{"why": "stale", "token": 3, "ok": True}])
    good = checks.Verdict("order", True, "ok")
    outcome = Outcome(tmp_path / "run", [bad, good], False, {"scenario": "s", "store": "sqlite", "seed": 7})
    junit = tmp_path / "f.xml"
    _junit(junit, [Result("s", "sqlite", 7, outcome, seconds=3.5)])
    (case,) = ET.parse(junit).getroot().findall("testcase")
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props == {
        "scenario": "s", "store": "sqlite", "seed": "7", "seconds": "3.5",
        "run_dir": str(tmp_path / "run"), "partial": "false", "verdict": "invalid",
    }, props  # fmt: skip
    failure = case.find("failure")
    assert failure is not None and "fencing" in str(failure.get("message"))
    evidence = json.loads(str(failure.text))
    assert evidence[0]["evidence"] == [{"why": "stale", "token": 3, "ok": True}], evidence


# -- item 2: --check is a pre-flight -------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value", "store", "scenario", "expected"),
    [
        ("WD_POSTGRES_URL", None, "postgres", "lease-stall", "did not accept a connection"),
        ("WD_POSTGRES_URL", "not a url at all", "postgres", "lease-stall", "is not a URL"),
        ("WD_REDIS_URL", "redis://127.0.0.1:{port}/0", "redis", "lease-stall", "did not accept a connection"),
        ("WD_TOXIPROXY_URL", "http://127.0.0.1:{port}", "sqlite", "lease-stall", None),
    ],
)
def test_check_reaches_the_servers_and_names_the_variable(
    tmp_path: Path, variable: str, value: str | None, store: str, scenario: str, expected: str | None
) -> None:
    url = _refused_postgres() if value is None else value.format(port=free_port())
    args = ("run", scenario, "--store", store, "--time-limit", "6", "--report-dir", str(tmp_path))
    checked = _cli(*args, "--check", env={variable: url})
    if expected is None:  # a run that uses no toxiproxy does not care about its variable
        assert checked.returncode == 0, checked.stderr
        return
    assert checked.returncode == CRASHED, f"--check: expected {CRASHED}, got {checked.returncode}: {checked.stdout}"
    assert variable in checked.stderr and expected in checked.stderr, checked.stderr
    assert "would run" not in checked.stdout, checked.stdout
    ran = _cli(*args, env={variable: url})
    assert ran.returncode == CRASHED, ran.stderr
    # the real run meets the same and says the same, not the driver's own message
    message = checked.stderr.split(": cannot get its servers: ")[-1].strip()
    assert message in ran.stderr, f"--check said:\n{message}\nthe run said:\n{ran.stderr}"
    assert list(tmp_path.iterdir()) == [], "no run folder for a run that could not start"


def test_check_prints_the_plan(tmp_path: Path) -> None:
    done = _cli("run", "lease-stall", "--store", "sqlite", "--seed", "5", "--workers", "3", "--check")
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    for part in ("lease-stall on sqlite", "seed 5", "3 workers", "time limit 24 s", "about", "no server"):
        assert part in line, f"{part!r} not in {line!r}"
    every = _cli("run", "--all", "--store", "sqlite", "--check")
    assert every.returncode == 0, every.stderr
    assert "min in all" in every.stdout.splitlines()[-1], every.stdout


@contextlib.contextmanager
def _http_server() -> Iterator[int]:
    """A plain HTTP server on a loopback port: it accepts TCP, and is no store server."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("variable", "scheme", "store"),
    [("WD_POSTGRES_URL", "postgresql://postgres@", "postgres"), ("WD_REDIS_URL", "redis://", "redis")],
)
def test_a_url_at_a_server_of_another_kind_fails_the_check_and_the_run_within_seconds(
    tmp_path: Path, variable: str, scheme: str, store: str
) -> None:
    """Issue #48 item 2: --check once said "answered" to anything that accepted TCP, and the run
    then hung. Both must log in, and exit 255 naming the variable and the server's error."""
    with _http_server() as port:
        url = f"{scheme}127.0.0.1:{port}/0"
        args = ("run", "lease-stall", "--store", store, "--report-dir", str(tmp_path))
        started = time.monotonic()
        checked = _cli(*args, "--check", env={variable: url}, timeout=60)
        took = time.monotonic() - started
        assert checked.returncode == CRASHED, f"--check exit {checked.returncode}: {checked.stdout}{checked.stderr}"
        assert took < 10, f"--check took {took:.1f} s"
        assert variable in checked.stderr and "did not let us in" in checked.stderr, checked.stderr
        started = time.monotonic()
        ran = _cli(*args, env={variable: url}, timeout=120)
        took = time.monotonic() - started
        assert ran.returncode == CRASHED, f"run exit {ran.returncode}: {ran.stderr}"
        assert took < 30, f"the run took {took:.1f} s to fail"
        assert variable in ran.stderr, ran.stderr


def test_check_logs_in_and_shows_the_server_s_own_error() -> None:
    """A real Postgres, a database that does not exist: the server's own words, not "answered"."""
    from without_durability.testing.kit import find_kit
    from without_durability.testing.servers import provide

    recipe = find_kit("postgres").recipe
    assert recipe is not None
    with provide(recipe, private=True) as server:
        good = _cli("run", "lease-stall", "--store", "postgres", "--check", env={"WD_POSTGRES_URL": server.url})
        assert good.returncode == 0, good.stderr
        wrong = server.url.rsplit("/", 1)[0] + "/no_such_database"
        bad = _cli("run", "lease-stall", "--store", "postgres", "--check", env={"WD_POSTGRES_URL": wrong})
    assert bad.returncode == CRASHED, bad.stdout
    assert "WD_POSTGRES_URL" in bad.stderr and "no_such_database" in bad.stderr, bad.stderr
    assert "does not exist" in bad.stderr, bad.stderr


# -- item 3: usage errors with the names meant ---------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "lease-stal"], "did you mean 'lease-stall'"),
        (["run", "lease-stall", "--store", "postgress"], "did you mean 'postgres'"),
        (["run", "--all", "--store", "sqlit", "--check"], "did you mean 'sqlite'"),
        (["run", "--all", "--store", "memory", "--check"], "no scenario runs on store 'memory'"),
    ],
)
def test_an_unknown_name_is_a_usage_error_with_a_suggestion(args: list[str], expected: str) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == USAGE, f"{args}: expected {USAGE}, got {result.exit_code}: {result.output}"
    assert expected in result.output, result.output


def test_a_typo_in_a_scenario_files_key_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "typo.toml"
    bad.write_text('name = "typo"\ntime_limt = 10\n[workload]\nworkrs = 2\n')
    done = _cli("run", str(bad), "--check")
    assert done.returncode == USAGE, f"expected {USAGE}, got {done.returncode}: {done.stderr}"
    assert "time_limt: no such key; did you mean 'time_limit'?" in done.stderr, done.stderr
    assert "workload.workrs: no such key; did you mean 'workers'" in done.stderr, done.stderr


# -- item 7: no durability warning about a server the harness started ---------------------------


def test_no_durability_warning_for_the_harness_s_own_redis_but_one_for_a_user_s(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The harness's private redis-server is not an operator's deployment: its runs open the store
    without the "may not survive a crash" warning; a server named by WD_REDIS_URL keeps it."""
    import asyncio
    import logging

    from wd_chaos.control.services import services
    from without_durability.testing.kit import find_kit
    from without_durability_redis.local_server import local_redis

    kit = find_kit("redis-set")

    async def first_contact(spec: dict[str, object]) -> None:
        opened = await kit.open_worker(spec)
        try:
            await opened.durable.checkpointer.read_persistence()
        finally:
            await opened.close()

    caplog.set_level(logging.WARNING, logger="without_durability_redis")
    os.environ.pop("WD_REDIS_URL", None)
    with services("redis-set", tmp_path, []) as own:
        assert own.server is not None and own.server.source == "local"
        asyncio.run(first_contact(own.spec))
    assert "may not survive" not in caplog.text, caplog.text
    with local_redis() as users:  # a server of the user's, named by the variable
        os.environ["WD_REDIS_URL"] = users.url
        try:
            with services("redis-set", tmp_path, []) as theirs:
                assert theirs.server is not None and theirs.server.source == "env"
                asyncio.run(first_contact(theirs.spec))
        finally:
            del os.environ["WD_REDIS_URL"]
    assert "may not survive a crash" in caplog.text, caplog.text


# -- item 4: one machine-readable line; names and paths whole when piped -------------------------


@pytest.mark.parametrize("columns", ["80", "50"])
def test_list_never_cuts_a_name_when_piped(columns: str) -> None:
    result = CliRunner().invoke(main, ["list"], env={"COLUMNS": columns})  # captured: not a terminal
    assert result.exit_code == 0, result.output
    for name in ("redis-cluster-stream", "kill-between-effect-and-record", "redis-set (also redis)"):
        assert name in result.stdout, f"{name!r} cut in:\n{result.stdout}"
    assert "…" not in result.stdout, f"something was cut:\n{result.stdout}"


def test_list_json_is_one_object_per_line() -> None:
    result = CliRunner().invoke(main, ["list", "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    stores = {r["name"]: r for r in rows if r["type"] == "store"}
    scenarios = {r["name"]: r for r in rows if r["type"] == "scenario"}
    assert stores["redis-set"]["aliases"] == ["redis"] and "workers" in stores["postgres"]["provides"]
    assert "sqlite" in scenarios["lease-stall"]["stores"] and scenarios["lease-stall"]["error"] is None


def test_run_json_repeat_prints_one_object_per_run_and_nothing_else(tmp_path: Path) -> None:
    """``--json --repeat 2``: stdout holds exactly two JSON objects, with distinct seeds, each
    naming its verdict, exit code, run folder and checkers; tables and progress went to stderr."""
    done = _cli(
        "run", "lease-stall", "--store", "sqlite", "--time-limit", "4", "--seed", "11", "--repeat", "2",
        "--json", "--report-dir", str(tmp_path), timeout=300,
    )  # fmt: skip
    assert done.returncode in (0, 1, 2), done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2, f"expected two JSON lines on stdout, got:\n{done.stdout}"
    runs = [json.loads(line) for line in lines]
    assert [r["seed"] for r in runs] == [11, 12], runs
    for r in runs:
        assert r["scenario"] == "lease-stall" and r["store"] == "sqlite", r
        assert r["verdict"] in ("valid", "invalid", "unknown") and r["exit_code"] == {"valid": 0, "invalid": 1}.get(
            r["verdict"], 2
        ), r
        assert Path(r["run_dir"]).is_dir() and Path(r["run_dir"]).parent == tmp_path, r
        names = {c["name"] for c in r["checkers"]}
        assert {"fencing", "liveness"} <= names, names
        assert all(c["verdict"] in ("valid", "invalid", "unknown") for c in r["checkers"]), r
        assert r["coverage"] == json.loads((Path(r["run_dir"]) / "summary.json").read_text())["coverage"], r
        assert json.loads((Path(r["run_dir"]) / "run.json").read_text())["seed"] == r["seed"]
    assert "lease-stall on sqlite (seed 11)" in done.stderr, "the verdict tables go to stderr"


def test_run_prints_the_run_folder_whole_at_start_and_end(tmp_path: Path) -> None:
    deep = tmp_path / ("a-rather-long-folder-name-" * 3) / "reports"
    done = _cli(
        "run", "lease-stall", "--store", "sqlite", "--time-limit", "4", "--report-dir", str(deep),
        env={"COLUMNS": "60"}, timeout=300,
    )  # fmt: skip
    assert done.returncode in (0, 1, 2), done.stderr
    (run_dir,) = deep.iterdir()
    lines = done.stdout.splitlines()
    assert lines[0] == f"run: lease-stall on sqlite, seed 1: {run_dir}", lines[0]
    assert f"run folder: {run_dir}" in lines, done.stdout


# -- item 5: repeats, random seeds, stopping on a failure ----------------------------------------


def test_seed_random_picks_a_seed_and_repeats_count_up_from_it() -> None:
    seeds = []
    for _ in range(2):
        result = CliRunner().invoke(main, ["run", "lease-stall", "--seed", "random", "--repeat", "3", "--check", "--json"])
        assert result.exit_code == 0, result.output
        planned = [json.loads(line) for line in result.stdout.splitlines()]
        assert len(planned) == 3, result.output
        first = planned[0]["seed"]
        assert [p["seed"] for p in planned] == [first, first + 1, first + 2], planned
        seeds.append(first)
    assert seeds[0] != seeds[1], "two random seeds in a row were the same"


def test_stop_on_fail_starts_no_more_runs(tmp_path: Path) -> None:
    junit = tmp_path / "f.xml"
    done = _cli(
        "run", "--all", "--store", "postgres", "--stop-on-fail", "--junit", str(junit),
        "--report-dir", str(tmp_path / "r"), env={"WD_POSTGRES_URL": _refused_postgres()},
    )  # fmt: skip
    assert done.returncode == CRASHED, done.stderr
    assert len(ET.parse(junit).getroot().findall("testcase")) == 1, junit.read_text()
    assert "--stop-on-fail" in done.stdout + done.stderr


# -- item 6: version, -h, global options anywhere, defaults, examples, completion ----------------


def test_version_and_short_help() -> None:
    from wd_chaos import __version__

    version = CliRunner().invoke(main, ["--version"])
    assert version.exit_code == 0 and version.stdout.strip() == f"wd-chaos {__version__}", version.output
    for args in (["-h"], ["run", "-h"], ["list", "-h"]):
        shown = CliRunner().invoke(main, args)
        assert shown.exit_code == 0 and "Usage: " in shown.stdout, (args, shown.output)


def test_every_help_shows_defaults_and_examples() -> None:
    for name in ["", *main.commands]:
        args = [name, "--help"] if name else ["--help"]
        shown = CliRunner().invoke(main, args, env={"COLUMNS": "120"})
        assert shown.exit_code == 0, (args, shown.output)
        assert "Examples:" in shown.stdout, f"wd-chaos {name} --help has no examples:\n{shown.stdout}"
    run_help = CliRunner().invoke(main, ["run", "--help"], env={"COLUMNS": "120"}).stdout
    assert "[default: reports]" in run_help and "[default: 1;" in run_help, run_help


def test_debug_is_accepted_after_the_subcommand(tmp_path: Path) -> None:
    done = _cli("analyze", str(tmp_path), "--debug")
    assert done.returncode == CRASHED, done.stderr
    assert "Traceback" in done.stderr, done.stderr


def test_shell_completion_knows_scenarios_and_stores() -> None:
    def complete(words: str, cword: int) -> list[str]:
        env = {"COMP_WORDS": words, "COMP_CWORD": str(cword), "_WD_CHAOS_COMPLETE": "bash_complete"}
        done = subprocess.run(
            [sys.executable, "-c", "from wd_chaos.cli import main; main(prog_name='wd-chaos')"],
            capture_output=True, text=True, env={**os.environ, **env}, check=False, timeout=60,
        )  # fmt: skip
        return [line.split(",", 1)[1] for line in done.stdout.splitlines() if "," in line]

    assert complete("wd-chaos run lease", 2) == ["lease-stall"]
    assert "redis-cluster-stream" in complete("wd-chaos run lease-stall --store red", 4)
    assert "redis" in complete("wd-chaos run lease-stall --store red", 4)


# -- item 8: judging an interrupted run, removing interrupted folders ----------------------------


def _interrupted_run(base: Path, junit: Path) -> Path:
    """A real run on SQLite stopped by SIGTERM once its stall fault has stopped a worker."""
    import signal
    import time

    import psutil

    proc = subprocess.Popen(
        [sys.executable, "-m", "wd_chaos.cli", "run", "lease-stall", "--store", "sqlite",
         "--time-limit", "60", "--report-dir", str(base), "--junit", str(junit)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not any(
            c.status() == psutil.STATUS_STOPPED for c in psutil.Process(proc.pid).children(recursive=True)
        ):
            assert time.monotonic() < deadline, "no worker was stalled within 90 s"
            time.sleep(0.1)
        time.sleep(1.0)  # let the other workers record a little more (a margin, not a wait for a condition)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (run_dir,) = base.iterdir()
    assert (run_dir / "INTERRUPTED").exists() and not (run_dir / "history.jsonl").exists()
    return run_dir


def test_analyze_partial_judges_an_interrupted_run_and_clean_removes_it(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    stopped = tmp_path / "stopped.xml"
    run_dir = _interrupted_run(reports, stopped)
    (case,) = ET.parse(stopped).getroot().findall("testcase")  # written though the run was stopped
    error = case.find("error")
    assert error is not None and "stopped by SIGTERM" in str(error.get("message")), ET.tostring(case)
    refused = _cli("analyze", str(run_dir))
    assert refused.returncode == CRASHED and "--partial" in refused.stderr, refused.stderr
    junit = tmp_path / "partial.xml"
    done = _cli("analyze", "--partial", str(run_dir), "--json", "--junit", str(junit), env={"COLUMNS": "200"})
    assert done.returncode in (1, 2), f"a partial run is never valid: {done.returncode}\n{done.stderr}"
    (record,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert record["partial"] is True and record["verdict"] in ("invalid", "unknown"), record
    assert "PARTIAL" in done.stderr, done.stderr  # the table (on stderr with --json)
    checkers = {c["name"]: c for c in record["checkers"]}
    assert checkers["fencing"]["verdict"] in ("valid", "invalid"), checkers["fencing"]  # judged on history
    assert "final state" in checkers["liveness"]["summary"], checkers["liveness"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["partial"] is True and summary["interrupted"].startswith("Stopped"), summary
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert props["partial"] == "true", props
    finished = reports / "finished-run"
    finished.mkdir()
    (finished / "summary.json").write_text("{}")
    cleaned = _cli("clean", "--interrupted", "--report-dir", str(reports))
    assert cleaned.returncode == 0, cleaned.stderr
    assert not run_dir.exists() and finished.exists(), cleaned.stdout
    assert f"removed interrupted run folder {run_dir}" in cleaned.stdout, cleaned.stdout
