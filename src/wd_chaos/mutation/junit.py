"""The JUnit XML file pytest writes (``--junitxml``), read into one record per test case: the one
reader the mutation runs share (a gate's verdicts, a job's per-test timings)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Case:
    """One test case: ``outcome`` is passed, failed, error or skipped; ``evidence`` the failure's
    or error's message (or text)."""

    classname: str
    name: str
    outcome: str
    seconds: float
    evidence: str = ""

    @property
    def nodeid(self) -> str:
        """The test's id as pytest prints it (``tests/test_x.py::test_y[param]``), rebuilt from the
        dotted class name of a test module at the top of a folder tree."""
        return f"{self.classname.replace('.', '/')}.py::{self.name}"


def read(path: Path) -> list[Case]:
    """Every test case in the JUnit file at ``path``, in file order."""
    cases: list[Case] = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, evidence = "passed", ""
        for tag in ("failure", "error"):
            node = case.find(tag)
            if node is not None:
                outcome = "failed" if tag == "failure" else "error"
                evidence = (node.get("message") or node.text or "").strip()
        if case.find("skipped") is not None:
            outcome = "skipped"
        cases.append(
            Case(
                case.get("classname", ""),
                case.get("name", ""),
                outcome,
                float(case.get("time", 0) or 0),
                evidence,
            )
        )
    return cases


def timings(path: Path) -> dict[str, float]:
    """Test id -> seconds, from the JUnit file at ``path`` (ids as pytest prints them)."""
    return {case.nodeid: case.seconds for case in read(path)}
