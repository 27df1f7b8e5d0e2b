"""``wd-chaos serve`` seen through a browser: a real stored run, the real command, Debian's headless
Chromium driven by Playwright (no browser download). What is checked is what a person would see:
the run listed at ``/`` with its verdict, a filter hiding it, its report opening on a click, the
timeline answering a hover with the operation's call, and the run folder coming down as a zip.

In CI (``CI`` set) a missing Chromium or Playwright fails this module; elsewhere it skips, saying
how to install them (``bash scripts/install-servers``; ``pip install -e ".[dev]"``)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("WD_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# The machine's network is closed: without these Chromium's own background connections are
# refused at every start (and a sandbox needs privileges a CI container may not have).
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def _missing(why: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{why}: CI must run the browser test (bash scripts/install-servers installs it)")
    pytest.skip(f"{why} (bash scripts/install-servers installs chromium; pip install -e '.[dev]')")


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding one real stored run: lease-stall on SQLite, short."""
    reports = tmp_path_factory.mktemp("served") / "reports"
    done = subprocess.run(
        [sys.executable, "-m", "wd_chaos.cli", "run", "lease-stall", "--store", "sqlite",
         "--time-limit", "3", "--report-dir", str(reports)],
        capture_output=True, text=True, timeout=240, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1, 2), f"the run crashed ({done.returncode}):\n{done.stdout}{done.stderr}"
    (run_dir,) = reports.iterdir()
    assert (run_dir / "summary.json").is_file() and (run_dir / "report.html").is_file()
    return reports


@pytest.fixture(scope="module")
def served(stored: Path) -> Iterator[str]:
    """``wd-chaos serve DIR --port 0``: its URL, from the one line it prints; stopped by SIGINT."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "wd_chaos.cli", "serve", str(stored), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the line, or EOF if it died
    if not (line.startswith("serving ") and " at http://127.0.0.1:" in line):
        proc.kill()
        _, err = proc.communicate(timeout=20)
        pytest.fail(f"expected one line 'serving DIR at URL', got {line!r}; stderr: {err}")
    url = line.split(" at ", 1)[1].strip()
    yield url
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(timeout=20)
    finally:
        proc.kill()
    assert code == 130, f"Ctrl-C: expected exit 130, got {code}"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium under Playwright, headless."""
    if not Path(CHROMIUM).is_file():
        _missing(f"no Chromium at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright for Python is not installed")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """(Asked for first, so a missing browser is reported before the run is made.) A fresh page (its own context, so downloads are accepted and nothing carries over)."""
    context = browser.new_context(accept_downloads=True)
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    yield pg
    context.close()


def _summary(stored: Path) -> dict[str, Any]:
    (run_dir,) = stored.iterdir()
    summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return summary


def _shown(valid: object) -> str:
    return {True: "VALID", False: "INVALID"}.get(valid, "UNKNOWN")  # type: ignore[call-overload, no-any-return]


def test_the_index_lists_the_run_with_its_verdict_and_a_filter_hides_it(
    page: Any, served: str, stored: Path
) -> None:
    from playwright.sync_api import expect

    summary = _summary(stored)
    verdict = _shown(summary["valid"])
    page.goto(served)
    rows = page.locator("#runs tbody tr")
    expect(rows).to_have_count(1)
    row = rows.first
    expect(row).to_be_visible()
    for shown in ("lease-stall", "sqlite", verdict, str(summary["seed"])):
        expect(row).to_contain_text(shown)
    other = next(v for v in ("VALID", "INVALID", "UNKNOWN") if v != verdict)
    page.select_option("#filter-verdict", other)
    expect(row).to_be_hidden()
    expect(page.locator("#shown")).to_have_text("0 of 1 runs shown")
    page.select_option("#filter-verdict", verdict)
    expect(row).to_be_visible()
    page.select_option("#filter-store", "sqlite")
    expect(row).to_be_visible()


def test_clicking_a_run_opens_its_report_whose_timeline_answers_a_hover(
    page: Any, served: str, stored: Path
) -> None:
    from playwright.sync_api import expect

    page.goto(served)
    page.locator("#runs tbody tr a", has_text="lease-stall").first.click()
    expect(page).to_have_title("lease-stall on sqlite")
    expect(page.locator("h1")).to_contain_text(_shown(_summary(stored)["valid"]))
    timeline = page.locator("svg#timeline")
    expect(timeline).to_be_visible()
    op = page.locator("svg#timeline rect.op[data-f='claim'][data-worker^='worker-']").first
    op.hover(force=True)
    tip = page.locator("#tip")
    expect(tip).to_be_visible()
    expect(tip).to_contain_text("claim(workflow=")  # the call, as made
    expect(tip).to_contain_text("result")
    expect(tip).to_contain_text(op.get_attribute("data-worker"))
    # the worker filter leaves only that worker's operations drawn
    worker = op.get_attribute("data-worker")
    page.select_option("#tl-worker", worker)
    others = page.locator(f"svg#timeline rect.op:not([data-worker='{worker}'])")
    assert others.count() > 0
    expect(others.first).to_be_hidden()
    # the raw files are one click away
    page.locator("a", has_text="summary.json").first.click()
    assert json.loads(page.locator("body").inner_text())["scenario"] == "lease-stall"


def test_a_run_folder_downloads_as_a_zip(page: Any, served: str, stored: Path, tmp_path: Path) -> None:
    page.goto(served)
    with page.expect_download() as info:
        page.locator("#runs tbody tr a", has_text="zip").first.click()
    got = tmp_path / "run.zip"
    info.value.save_as(got)
    (run_dir,) = stored.iterdir()
    with zipfile.ZipFile(got) as zf:
        names = set(zf.namelist())
        assert {f"{run_dir.name}/summary.json", f"{run_dir.name}/report.html"} <= names, names
        assert json.loads(zf.read(f"{run_dir.name}/summary.json")) == _summary(stored)


@pytest.mark.parametrize(
    "path",
    [
        "/runs/../../../../etc/passwd",
        "/runs/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/runs/..%2f..%2f..%2fetc/passwd",
        "/zip/..%2f..%2f...zip",
    ],
)
def test_paths_outside_the_served_folder_are_refused(served: str, path: str) -> None:
    host, port = served.removeprefix("http://").rstrip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", path)  # sent as written: no client normalises the '..' away
    answer = conn.getresponse()
    body = answer.read()
    assert answer.status in (403, 404), f"{path}: expected 403/404, got {answer.status}: {body[:200]!r}"
    assert b"root:" not in body


def test_a_column_header_sorts_the_runs(page: Any, tmp_path: Path) -> None:
    """Issue #48 item 9: the index had no sort. A click on a header sorts by that column (numbers
    as numbers), a second click reverses it."""
    import threading

    from playwright.sync_api import expect

    from wd_chaos.serve import make_server

    root = tmp_path / "reports"
    for stamp, seed in (("20261207T050000", 9), ("20261207T060000", 10), ("20261207T070000", 2)):
        run = root / f"{stamp}-lease-stall-sqlite"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({
            "scenario": "lease-stall", "store": "sqlite", "seed": seed, "valid": True, "verdicts": [],
        }))  # fmt: skip
    server = make_server(root, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        seeds = page.locator("#runs tbody tr td:nth-child(4)")
        expect(seeds).to_have_text(["2", "10", "9"])  # newest first
        page.locator("#runs thead th", has_text="seed").click()
        expect(seeds).to_have_text(["2", "9", "10"])
        page.locator("#runs thead th", has_text="seed").click()
        expect(seeds).to_have_text(["10", "9", "2"])
        expect(page.locator("#latest")).to_have_attribute("href", "/latest")
    finally:
        server.shutdown()
        server.server_close()
