"""Compatibility only: the checkers live in ``wd_chaos.checks``, one module per concern, found by
``wd_chaos.checks.registry``. This module keeps the old names importable for code written against
them; new code imports from ``wd_chaos.checks``, and a new checker is a new module there."""

from __future__ import annotations

from .checks.at_least_once import at_least_once
from .checks.core import (
    FENCED_WRITES,
    MAX_EVIDENCE,
    RENEWING,
    SLACK_NS,
    UNKNOWN,
    WRITES,
    Operation,
    Valid,
    Verdict,
    _bit,
    _final_records,
    _final_values,
    _windows,
    canon,
    exit_code,
    operations,
    overall,
)
from .checks.exactly_once import exactly_once
from .checks.fencing import fencing
from .checks.first_writer_wins import first_writer_wins
from .checks.liveness import liveness
from .checks.order import order
from .checks.registry import bite, check, checkers, run_checker
from .checks.take_exclusive import take_exclusive

CHECKERS = checkers()
"""Every checker by name: the registry's own dict."""

__all__ = [
    "CHECKERS",
    "FENCED_WRITES",
    "MAX_EVIDENCE",
    "RENEWING",
    "SLACK_NS",
    "UNKNOWN",
    "WRITES",
    "Operation",
    "Valid",
    "Verdict",
    "_bit",
    "_final_records",
    "_final_values",
    "_windows",
    "at_least_once",
    "bite",
    "canon",
    "check",
    "exactly_once",
    "exit_code",
    "fencing",
    "first_writer_wins",
    "liveness",
    "operations",
    "order",
    "overall",
    "run_checker",
    "take_exclusive",
]
