"""``wd-chaos`` as a CI sees it: exit codes (0/1/2 only for verdicts, 64 usage, 130/143 signals,
255 harness), damaged histories refused, CLI numbers held to the scenario files' bounds, and no
process or server left behind by a controller that is killed."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wd_chaos.cli import CRASHED, SIGINT_EXIT, SIGTERM_EXIT, USAGE, main
from wd_chaos.control.runner import Options, check_options
from wd_chaos.scenario import OptionError, parse

ROOT = Path(__file__).resolve().parents[1]
VERDICTS = (0, 1, 2)


def _cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wd_chaos.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        check=False,
    )


def _one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("wd-chaos: error: ")]
    assert len(errors) == 1, f"expected one 'wd-chaos: error:' line, got:\n{done.stderr}"
    return errors[0]


# -- usage errors and option bounds ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "lease-stall", "--workers", "0"], "greater than or equal to 1"),
        (["run", "lease-stall", "--workers", "100"], "less than or equal to 64"),
        (["run", "lease-stall", "--time-limit", "0"], "greater than 0"),
        (["run", "lease-stall", "--time-limit", "-3"], "greater than 0"),
        (["run", "lease-stall", "--time-limit", "nan"], "finite"),
        (["run", "lease-stall", "--time-limit", "inf"], "finite"),
        (["run", "lease-stall", "--time-limit", "1e7"], "less than or equal to 3600"),
        (["run", "lease-stall", "--time-limit", "1"], "first fault"),
        (["run", "lease-stall", "--store", "oracle"], "oracle"),
        (["run", "lease-stall", "--bogus"], "No such option"),
        (["run"], "give a scenario NAME or --all"),
        (["run", "lease-stall", "--mutant", "no-such-mutant"], "no mutant"),
        (["mutants", "--mutant", "no-such-mutant", "--no-chaos"], "no mutant named"),
        (["mutants", "--chaos-seconds", "inf", "--no-chaos"], "finite"),
        (["nosuchcommand"], "No such command"),
    ],
)
def test_a_usage_error_exits_64_naming_the_limit(args: list[str], expected: str) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == USAGE, (
        f"{args}: expected exit {USAGE}, got {result.exit_code}: {result.output}"
    )
    assert expected in result.output, f"{args}: expected {expected!r} in:\n{result.output}"
    assert "Traceback" not in result.output


def test_a_time_limit_may_not_scale_the_workflows_past_their_bound() -> None:
    scenario = parse('name = "big"\ntime_limit = 10\n[workload]\nworkflows = 6000', "big.toml")
    check_options(scenario, Options(time_limit=16.0))
    with pytest.raises(OptionError, match=r"to 9600|to 12000") as caught:
        check_options(scenario, Options(time_limit=20.0))
    assert "workflows: expected a number less than or equal to 10000, got 12000" in str(caught.value)


def test_valid_options_pass_the_check_without_starting_anything(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "run",
            "lease-stall",
            "--workers",
            "64",
            "--time-limit",
            "2.5",
            "--report-dir",
            str(tmp_path),
            "--check",
        ],
    )
    assert result.exit_code == 0, result.output
    assert list(tmp_path.iterdir()) == [], "--check must not start a run"


def test_unwritable_output_paths_are_refused_before_the_run(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for args in (
        ["--report-dir", str(blocker / "reports")],
        ["--report-dir", str(tmp_path), "--junit", str(tmp_path)],
    ):
        started = time.monotonic()
        result = CliRunner().invoke(main, ["run", "lease-stall", "--time-limit", "6", *args])
        assert result.exit_code == USAGE, result.output
        assert "cannot write" in result.output, result.output
        assert time.monotonic() - started < 5, "refused only after running"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"], "no run folder may be started"


NUMBER_TEXT = st.one_of(
    st.integers(min_value=-(10**12), max_value=10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e7", "1e308", "0x10", "1_0", "", " ", "-0", "4.0", "64", "65"]),
    st.text(max_size=8),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workers=NUMBER_TEXT, limit=NUMBER_TEXT, seed=NUMBER_TEXT, chaos_seconds=NUMBER_TEXT)
def test_fuzzed_numbers_give_a_clear_usage_error_or_a_valid_check(
    tmp_path: Path, workers: str, limit: str, seed: str, chaos_seconds: str
) -> None:
    runner = CliRunner()
    result = runner.invoke(
        main,
        [
            "run", "lease-stall", f"--workers={workers}", f"--time-limit={limit}", f"--seed={seed}",
            "--report-dir", str(tmp_path), "--check",
        ],
    )  # fmt: skip
    assert result.exit_code in (0, USAGE), f"exit {result.exit_code}: {result.output}"
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    if result.exit_code == USAGE:
        assert "Error: " in result.output, result.output
    gate = runner.invoke(main, ["mutants", f"--chaos-seconds={chaos_seconds}", "--mutant", "?"])
    assert gate.exit_code == USAGE, f"exit {gate.exit_code}: {gate.output}"
    assert "Traceback" not in gate.output


# -- harness errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value", "store", "scenario"),
    [
        ("WD_POSTGRES_URL", "postgresql://postgres@127.0.0.1:1/postgres", "postgres", "lease-stall"),
        ("WD_POSTGRES_URL", "not a url at all", "postgres", "lease-stall"),
        ("WD_REDIS_URL", "redis://127.0.0.1:1/0", "redis", "lease-stall"),
        ("WD_TOXIPROXY_URL", "http://127.0.0.1:1", "postgres", "partition"),
    ],
)
def test_an_unreachable_server_exits_255_with_one_line(
    tmp_path: Path, variable: str, value: str, store: str, scenario: str
) -> None:
    done = _cli(
        "run",
        scenario,
        "--store",
        store,
        "--time-limit",
        "6",
        "--report-dir",
        str(tmp_path),
        env={variable: value},
    )
    assert done.returncode == CRASHED, f"expected {CRASHED}, got {done.returncode}:\n{done.stderr}"
    line = _one_line_error(done)
    assert scenario in line, line
    runs = list(tmp_path.iterdir())
    assert all((r / "INTERRUPTED").exists() for r in runs), "a run that could not start must say so"


def test_a_bad_scenario_file_exits_255_with_one_line_naming_its_fields(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\ntime_limit = -1\n[workload]\nworkers = 0\n')
    done = _cli("run", str(bad), "--report-dir", str(tmp_path / "reports"))
    assert done.returncode == CRASHED, done.stderr
    line = _one_line_error(done)
    assert "time_limit" in line and "workload.workers" in line, line
    assert not (tmp_path / "reports").exists()


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    done = _cli("--debug", "analyze", str(tmp_path))
    assert done.returncode == CRASHED
    assert "Traceback" in done.stderr


# -- a fault that did not bite -------------------------------------------------------------------


def test_a_run_whose_fault_cannot_bite_is_unknown_and_suggests_no_shrink(tmp_path: Path) -> None:
    """An empty fault schedule: nothing is injected, so nothing can bite and every checker holds.
    The run did not test the store: unknown (exit 2), said plainly, and no shrink command (that
    is for a run that failed); ``analyze`` of the stored run agrees."""
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    reports = tmp_path / "reports"
    done = _cli(
        "run", "lease-stall", "--store", "sqlite", "--schedule", str(empty), "--time-limit", "4",
        "--report-dir", str(reports), env={"COLUMNS": "200"}, timeout=240,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 2, f"expected 2 (unknown), got {done.returncode}:\n{output}"
    assert "wd-chaos shrink" not in output and "smallest failing" not in output, output
    assert "INVALID" not in output and "not tested" in output, output
    (run_dir,) = reports.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["valid"] == "unknown" and summary["exit_code"] == 2, summary
    assert summary["schedule"] == [] and summary["schedule_from"] == str(empty), summary
    (bite,) = [v for v in summary["verdicts"] if str(v["name"]).startswith("bite")]
    assert bite["valid"] == "unknown" and bite["counts"] == {"faults": 0, "bit": 0}, bite
    (covered,) = [v for v in summary["verdicts"] if v["name"] == "coverage"]
    # nothing stalled, so neither of the stall's windows was reached (the scheduler's windows may
    # be: a lease that lapses on its own and a held workflow scheduled again need no fault)
    assert covered["valid"] == "unknown", covered
    assert summary["coverage"]["takeover-during-stall"] == 0, summary["coverage"]
    assert summary["coverage"]["stale-write-refused"] == 0, summary["coverage"]
    rest = [v for v in summary["verdicts"] if v is not bite and v is not covered]
    assert all(v["valid"] is True for v in rest), summary["verdicts"]
    report = (run_dir / "report.html").read_text()
    assert "not tested" in report and "wd-chaos shrink" not in report
    again = _cli("analyze", str(run_dir), env={"COLUMNS": "200"})
    assert again.returncode == 2, again.stdout + again.stderr
    assert "not tested" in again.stdout and "wd-chaos shrink" not in again.stdout, again.stdout


# -- damaged histories --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real short run on SQLite, finished and judged."""
    base = tmp_path_factory.mktemp("finished")
    done = _cli(
        "run", "lease-stall", "--store", "sqlite", "--time-limit", "4", "--report-dir", str(base), timeout=240
    )
    assert done.returncode in VERDICTS, done.stderr
    (run_dir,) = base.iterdir()
    return run_dir


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _cut_mid_line(text: bytes) -> bytes:
    return text[: len(text) - 40]


def _cut_at_line(text: bytes) -> bytes:
    return b"".join(text.splitlines(keepends=True)[:-3])


def _corrupt_line(text: bytes) -> bytes:
    lines = text.splitlines(keepends=True)
    lines[len(lines) // 2] = b'{"type": "complete", "oops"\n'
    return b"".join(lines)


def _altered_value(text: bytes) -> bytes:
    lines = text.splitlines(keepends=True)
    victim = next(i for i, line in enumerate(lines) if b'"outcome": "ok"' in line)
    lines[victim] = lines[victim].replace(b'"outcome": "ok"', b'"outcome": "unknown"')
    return b"".join(lines)


def _drop_end(text: bytes) -> bytes:
    return b"".join(text.splitlines(keepends=True)[:-1])


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (_cut_mid_line, "cut in the middle"),
        (_cut_at_line, "no end line"),
        (_drop_end, "no end line"),
        (lambda text: b"", "empty"),
        (_corrupt_line, "SHA-256"),
        (_altered_value, "SHA-256"),
    ],
    ids=["cut-mid-line", "cut-at-line", "end-line-removed", "emptied", "corrupt-line", "altered"],
)
def test_analyze_refuses_a_damaged_history_and_leaves_the_folder(
    finished_run: Path, tmp_path: Path, damage: object, expected: str
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    assert _cli("analyze", str(run_dir)).returncode in VERDICTS, "the undamaged copy must be judged"
    history = run_dir / "history.jsonl"
    history.write_bytes(damage(history.read_bytes()))  # type: ignore[operator]
    before = _snapshot(run_dir)
    done = _cli("analyze", str(run_dir))
    assert done.returncode == CRASHED, (
        f"expected {CRASHED}, got {done.returncode}:\n{done.stdout}{done.stderr}"
    )
    assert expected in _one_line_error(done)
    assert _snapshot(run_dir) == before, (
        "a refused analyze must leave summary.json and report.html as they were"
    )


@pytest.mark.parametrize("remove", ["final.json", "scenario.json", "run.json", "history.jsonl"])
def test_analyze_refuses_a_folder_missing_a_file(finished_run: Path, tmp_path: Path, remove: str) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    (run_dir / remove).unlink()
    done = _cli("analyze", str(run_dir))
    assert done.returncode == CRASHED, done.stderr
    assert remove in _one_line_error(done)


def test_analyze_refuses_an_interrupted_run(finished_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    (run_dir / "history.jsonl").unlink()
    (run_dir / "INTERRUPTED").write_text("Stopped: SIGTERM\n")
    done = _cli("analyze", str(run_dir))
    assert done.returncode == CRASHED, done.stderr
    assert "did not finish (Stopped: SIGTERM)" in _one_line_error(done)


def test_analyze_of_an_empty_folder_exits_255(tmp_path: Path) -> None:
    done = _cli("analyze", str(tmp_path))
    assert done.returncode == CRASHED
    _one_line_error(done)


# -- signals and orphans ---------------------------------------------------------------------------


def _family(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).children(recursive=True)
    return []


def _wait_for(what: str, condition: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout:.0f}s")
        time.sleep(0.1)


def _living(procs: list[psutil.Process]) -> list[str]:
    alive = []
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{proc.pid} {proc.status()} {' '.join(proc.cmdline())[:100]}")
    return alive


@contextlib.contextmanager
def _started_run(
    tmp_path: Path, store: str
) -> Iterator[tuple[subprocess.Popen[bytes], list[psutil.Process]]]:
    """A real ``wd-chaos run`` in the background, and a list the test fills with its processes:
    whatever of them is left at the end is killed, so a failing test leaves no orphans either."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "wd_chaos.cli", "run", "lease-stall", "--store", store,
         "--time-limit", "60", "--report-dir", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    family: list[psutil.Process] = []
    try:
        yield proc, family
    finally:
        for child in family + _family(proc.pid):
            with contextlib.suppress(psutil.NoSuchProcess):
                child.resume()
                child.kill()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


def _stopped_worker(pid: int) -> bool:
    for child in _family(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() == psutil.STATUS_STOPPED and "wd_chaos.client.workload" in " ".join(child.cmdline()):
                return True
    return False


def _server_dirs(family: list[psutil.Process]) -> list[Path]:
    dirs = []
    for proc in family:
        with contextlib.suppress(psutil.Error):
            line = proc.cmdline()
            if "-D" in line:
                dirs.append(Path(line[line.index("-D") + 1]).parent)
    return dirs


def test_a_sigkilled_run_leaves_no_process_and_says_interrupted(tmp_path: Path) -> None:
    with _started_run(tmp_path, "postgres") as (proc, family):
        # the lease-stall scenario SIGSTOPs a worker inside a step from about 2 s in
        _wait_for("a worker SIGSTOPped by the stall fault", lambda: _stopped_worker(proc.pid), 90)
        family += _family(proc.pid)
        assert any("postgres" in " ".join(p.cmdline()) for p in family), "expected a private postgres"
        servers = _server_dirs(family)
        assert servers, "expected the private postgres's folder on its command line"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        _wait_for(f"every process of the run gone (left: {_living(family)})", lambda: not _living(family), 30)
    (run_dir,) = tmp_path.iterdir()
    _wait_for("the run folder marked INTERRUPTED", lambda: (run_dir / "INTERRUPTED").exists(), 10)
    assert not any(d.exists() for d in servers), f"server folders left behind: {servers}"


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, SIGTERM_EXIT), (signal.SIGINT, SIGINT_EXIT)])
def test_a_signal_stops_the_run_cleanly_with_its_own_code(tmp_path: Path, signum: int, code: int) -> None:
    with _started_run(tmp_path, "sqlite") as (proc, family):
        _wait_for("a worker SIGSTOPped by the stall fault", lambda: _stopped_worker(proc.pid), 90)
        family += _family(proc.pid)
        os.kill(proc.pid, signum)
        assert proc.wait(timeout=60) == code
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        assert "Traceback" not in err, err
        assert not _living(family), _living(family)
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "INTERRUPTED").read_text().startswith("Stopped: ")
    # issue #48 item 8: the log says where the records are and how to judge them
    assert str(run_dir) in err and f"wd-chaos analyze --partial {run_dir}" in err, err


def test_clean_removes_a_server_whose_owner_was_killed(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import time\nfrom without_durability_redis.local_server import local_redis\n"
         "with local_redis() as s:\n    print(s.pid, s.datadir, flush=True)\n    time.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert owner.stdout is not None
    pid, folder = owner.stdout.readline().split()
    owner.kill()
    owner.wait()
    server = psutil.Process(int(pid))
    assert server.is_running(), "the redis-server outlives its killed owner (what clean is for)"
    done = _cli("clean", "--report-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    # clean sweeps the whole machine: another test's clean running beside this one (xdist) may
    # have removed this orphan first, and then this one says there was nothing to clean
    assert folder in done.stdout or not Path(folder).exists(), done.stdout
    _wait_for("the orphaned redis-server gone", lambda: not _living([server]), 10)
    assert not Path(folder).exists()


def test_clean_marks_a_run_whose_controller_is_gone(tmp_path: Path) -> None:
    run_dir = tmp_path / "20260101T000000-lease-stall-sqlite"
    (run_dir / "procs").mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run_dir / "procs" / f"controller.{dead.pid}.jsonl").write_text("")
    finished = tmp_path / "20260101T000001-lease-stall-sqlite"
    (finished / "procs").mkdir(parents=True)
    (finished / "summary.json").write_text(json.dumps({}))
    done = _cli("clean", "--report-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "died without cleaning up" in (run_dir / "INTERRUPTED").read_text()
    assert not (finished / "INTERRUPTED").exists()
