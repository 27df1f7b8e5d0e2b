"""The pieces every mutation run shares (``wd_chaos.mutation``): the pytest session, the JUnit
reader and the HTML page. Each is shown to tell a failing or stopped session from a passing one."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil

from wd_chaos.mutation import junit, page, session

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_x" name="test_ok[sqlite]" time="0.5"/>
<testcase classname="tests.test_x" name="test_bad[sqlite-a b]" time="1.25">
  <failure message="assert 1 == 2">long text</failure></testcase>
<testcase classname="tests.test_x" name="test_broken" time="0"><error>fixture exploded</error></testcase>
<testcase classname="tests.test_y" name="test_skip" time=""><skipped message="no server"/></testcase>
</testsuite></testsuites>
"""


def test_the_junit_reader_gives_each_case_its_outcome_evidence_and_id(tmp_path: Path) -> None:
    path = tmp_path / "r.xml"
    path.write_text(JUNIT)
    got = [(c.nodeid, c.outcome, c.seconds, c.evidence) for c in junit.read(path)]
    assert got == [
        ("tests/test_x.py::test_ok[sqlite]", "passed", 0.5, ""),
        ("tests/test_x.py::test_bad[sqlite-a b]", "failed", 1.25, "assert 1 == 2"),
        ("tests/test_x.py::test_broken", "error", 0.0, "fixture exploded"),
        ("tests/test_y.py::test_skip", "skipped", 0.0, ""),
    ], got
    assert junit.timings(path)["tests/test_x.py::test_bad[sqlite-a b]"] == 1.25


def test_a_session_names_its_failures_and_one_out_of_time_is_stopped_whole(tmp_path: Path) -> None:
    (tmp_path / "test_toy.py").write_text(
        "import subprocess, sys, time\n"
        "def test_passes():\n    pass\n"
        "def test_fails():\n    assert 1 == 2\n"
        "def test_sleeps():\n"
        "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "    open('child.pid', 'w').write(str(child.pid))\n"
        "    time.sleep(60)\n"
    )
    argv = session.command(["test_toy.py"], summary=True, python=sys.executable)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # a bare pytest starts in a blink
    done = session.run([*argv, "-k", "not sleeps"], env=env, cwd=tmp_path, timeout=120)
    assert (done.code, done.failed, done.failures) == (
        1,
        "test_toy.py::test_fails",
        ["test_toy.py::test_fails"],
    )
    assert "1 passed" in done.stdout, done.tail
    started = time.monotonic()
    stopped = session.run([*argv, "-k", "sleeps"], env=env, cwd=tmp_path, timeout=10)
    assert stopped.code == -1 and stopped.failed == "timeout after 10s", stopped.tail
    assert time.monotonic() - started < 40
    pid = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the session's child outlived its session"
        time.sleep(0.1)


def test_the_page_escapes_text_colours_rows_by_verdict_and_keeps_markup() -> None:
    table = page.Table(
        ["mutant", "diff"],
        [("killed", ["<a>", page.pre("x < y")]), ("survived", ["b", page.code("old", "new")])],
        heading="Mutants & more",
    )
    text = page.render("t <1>", "2 > 1", [table])
    assert "<title>t &lt;1&gt;</title>" in text and "<p>2 &gt; 1</p>" in text
    assert "<h2>Mutants &amp; more</h2>" in text
    assert '<tr class="good"><td>&lt;a&gt;</td><td><pre>x &lt; y</pre></td></tr>' in text
    assert '<tr class="bad"><td>b</td><td><code>old</code><br><code>new</code></td></tr>' in text
