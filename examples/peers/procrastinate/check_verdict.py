"""Run one scenario on the procrastinate kit and compare its verdict with the one the docs page
"procrastinate under wd-chaos" (``docs/peers/procrastinate.md``) publishes for it: the run's
verdict, and which checkers said no. Exit 0 when they agree; 1, saying how they differ, when not.

    python examples/peers/procrastinate/check_verdict.py take-storm [--report-dir reports/peers]

The seed and time limit are the page's (the row's ``seed`` and the page's stated time limit), so
the run is the one the page reports, repeated."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "peers" / "procrastinate.md"
TIME_LIMIT = re.compile(r"`--time-limit (\d+(?:\.\d+)?)`")


def published(scenario: str, page: Path = PAGE) -> tuple[int, str, set[str], float]:
    """The page's row for ``scenario`` in its scenario table: seed, verdict (VALID, INVALID or
    UNKNOWN), the checkers it names as saying no; and the time limit the page says every run had."""
    text = page.read_text()
    limit = TIME_LIMIT.search(text)
    if limit is None:
        raise SystemExit(f"{page}: no `--time-limit N` stated")
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0] == f"`{scenario}`":
            seed, verdict, said_no = (
                int(cells[1]),
                cells[2].strip("*"),
                set(re.findall(r"`([\w-]+)`", cells[3])),
            )
            return seed, verdict, said_no, float(limit.group(1))
    raise SystemExit(f"{page}: no row for scenario {scenario!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario")
    parser.add_argument("--report-dir", type=Path, default=ROOT / "reports" / "peers")
    parser.add_argument(
        "--page", type=Path, default=PAGE, help="the page to compare with (default: the docs page)"
    )
    args = parser.parse_args()
    seed, verdict, said_no, limit = published(args.scenario, args.page)
    before = set(args.report_dir.glob("*/summary.json"))
    exe = Path(sys.executable).with_name("wd-chaos")
    command = [str(exe), "run", args.scenario, "--store", "procrastinate", "--seed", str(seed),
               "--time-limit", str(limit), "--report-dir", str(args.report_dir)]  # fmt: skip
    print("$", " ".join(command[1:]), flush=True)
    done = subprocess.run(command, check=False)
    found = sorted(set(args.report_dir.glob("*/summary.json")) - before)
    if len(found) != 1:
        print(
            f"FAILED: expected one new run folder under {args.report_dir}, found {len(found)} (exit {done.returncode})"
        )
        return 1
    summary = json.loads(found[0].read_text())
    got = str(summary["verdict"]).upper()
    got_no = {v["name"] for v in summary["verdicts"] if v.get("valid") is False}
    where = found[0].parent.name
    if (got, got_no) != (verdict, said_no):
        print(
            f"FAILED: {args.scenario} on procrastinate (seed {seed}) was {got}, checkers saying no "
            f"{sorted(got_no)}; {args.page} publishes {verdict}, {sorted(said_no)} "
            f"(run folder {where}): rerun the page's runs and update it, or find what changed"
        )
        return 1
    print(
        f"ok: {args.scenario} on procrastinate (seed {seed}) is {got}, {sorted(got_no)}, as published ({where})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
