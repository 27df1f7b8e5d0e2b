"""wd-chaos in a store's own pytest (entry point ``pytest11``, so installing the package is enough).

``pytest --wd-chaos SCENARIO[,SCENARIO...] --wd-store NAME[,NAME...]`` adds one test case per
(scenario, store), named ``wd-chaos::SCENARIO[STORE]`` and marked ``wd_chaos`` (``-m wd_chaos``
runs them alone). Each case is a real ``wd-chaos run`` in this process (real worker processes, real
servers, real signals) whose verdict is the assertion: valid passes; invalid fails with each
checker's evidence, the run folder and the commands that reproduce and shrink it; an unknown run
(its fault did not bite) tested nothing, so it runs again on another seed, at most
``--wd-chaos-runs`` times, and fails only when every run was unknown, naming each. ``all`` as a
scenario means every scenario expected valid that applies to the store (as ``wd-chaos run --all``).

``--wd-store`` is the conformance suite's option: one flag picks the store for both. Without
``--wd-chaos`` nothing is collected and nothing of wd-chaos is imported.

The ``wd_chaos_run`` fixture runs a scenario from a test of one's own (a mutant that must be caught,
a scenario with options) and hands back its ``Outcome``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .analyze import Outcome
    from .gate import Case, Judged

DEFAULT_RUNS = 3
"""Runs of one case at most, when its runs come out unknown (``gate.RUNS``)."""

_CASES: pytest.StashKey[list[Case]] = pytest.StashKey()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("wd-chaos", "wd-chaos: fault-injection runs as test cases")
    group.addoption(
        "--wd-chaos",
        action="append",
        default=[],
        metavar="SCENARIO[,SCENARIO...]",
        help="run these wd-chaos scenarios (or 'all') on each --wd-store as test cases whose "
        "verdict is the assertion (repeatable; select them alone with -m wd_chaos)",
    )
    group.addoption(
        "--wd-chaos-seconds",
        type=float,
        default=None,
        metavar="S",
        help="cap each run's workload at S seconds (a scenario shorter keeps its own; default: "
        "each scenario's own time limit)",
    )
    group.addoption(
        "--wd-chaos-report-dir",
        default=None,
        metavar="DIR",
        help="store each case's runs under DIR/<case> (default: reports/wd-chaos)",
    )
    group.addoption(
        "--wd-chaos-runs",
        type=int,
        default=DEFAULT_RUNS,
        metavar="N",
        help=f"run a case at most N times while its runs come out unknown, each on another seed "
        f"(default {DEFAULT_RUNS})",
    )
    group.addoption(
        "--wd-chaos-seed",
        type=int,
        default=None,
        metavar="N",
        help="the first run's seed (default: each scenario's own)",
    )
    group.addoption(
        "--wd-chaos-mutant",
        default=None,
        metavar="NAME",
        help="break the store the way this catalogue mutant says (wd-chaos mutants lists them): "
        "every case must then fail, which shows the cases catch it",
    )
    group.addoption(
        "--wd-chaos-scenario-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of your own scenarios (NAME.toml) beside the built-in ones (repeatable)",
    )


def _names(values: Sequence[str] | None) -> list[str]:
    return [n.strip() for value in values or [] for n in value.split(",") if n.strip()]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "wd_chaos: a wd-chaos case added by --wd-chaos")
    scenarios = _names(config.getoption("wd_chaos"))
    if not scenarios:
        return  # a normal run: nothing imported, nothing collected
    try:
        from .gate import OptionError, SelectionError, chaos_stores, options_for, select
    except ImportError as exc:
        raise pytest.UsageError(
            f"--wd-chaos needs wd-chaos's own dependencies ({exc}): pip install \".[chaos]\" in a checkout"
        ) from exc
    stores = _names(config.getoption("wd_store", default=None))
    runs = int(config.getoption("wd_chaos_runs"))
    if runs < 1:
        raise pytest.UsageError(f"--wd-chaos-runs: expected 1 or more, got {runs}")
    if not stores:
        raise pytest.UsageError(
            "--wd-chaos: name the store(s) to run on with --wd-store NAME[,NAME...]; "
            f"the stores worker processes can open: {', '.join(chaos_stores(['all']))}"
        )
    dirs = _scenario_dirs(config)
    try:
        cases = select(scenarios, stores, dirs)
        for case in cases:
            if case.skip is None:  # refused options are a usage error now, not a failure later
                options_for(case, **_options(config), mutant=config.getoption("wd_chaos_mutant"))
    except (SelectionError, OptionError) as exc:
        raise pytest.UsageError(f"--wd-chaos: {exc}") from exc
    config.stash[_CASES] = cases


def _scenario_dirs(config: pytest.Config) -> list[Path]:
    return [Path(d) for d in config.getoption("wd_chaos_scenario_dir") or []]


def _options(config: pytest.Config) -> dict[str, Any]:
    """What the command line says about every run: the time cap, the first seed, scenario folders."""
    return {
        "seconds": config.getoption("wd_chaos_seconds"),
        "seed": config.getoption("wd_chaos_seed"),
        "scenario_dirs": _scenario_dirs(config),
    }


def report_root(config: pytest.Config) -> Path:
    """Where this session's runs are stored: ``--wd-chaos-report-dir``, else ``reports/wd-chaos``
    under the folder pytest was started in."""
    given = config.getoption("wd_chaos_report_dir", default=None)
    base = config.invocation_params.dir
    return (base / given) if given else base / "reports" / "wd-chaos"


def _folder_name(name: str) -> str:
    # one folder per test: cases run side by side (xdist), and two of one scenario may not share one
    return re.sub(r"[^\w.-]+", "_", name).strip("_") or "case"


class ChaosFailure(AssertionError):
    """A case's verdict was not its scenario's expectation, every run was unknown, or its servers
    could not be had; the message is the whole account (``gate.describe``)."""


class ChaosCollector(pytest.Collector):
    """The ``wd-chaos`` node the cases of ``--wd-chaos`` hang from."""

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        cases: list[Case] = self.config.stash.get(_CASES, [])
        return [ChaosItem.from_parent(self, name=case.id, case=case) for case in cases]


class ChaosItem(pytest.Item):
    """One (scenario, store) case: a run judged as ``wd_chaos_run.check`` judges it. After it ran,
    ``outcome`` is the run that gave the verdict (None before)."""

    def __init__(self, *, case: Case, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.outcome: Outcome | None = None
        self.add_marker("wd_chaos")
        if self.config.pluginmanager.hasplugin("timeout"):  # pytest-timeout: room for every run
            self.add_marker(pytest.mark.timeout(_timeout(self.config, case)))

    def setup(self) -> None:
        if self.case.skip is not None:
            pytest.skip(self.case.skip)

    def runtest(self) -> None:
        runner = ChaosRun(self.config, report_root(self.config) / _folder_name(self.name))
        judged = runner.judge(
            self.case.scenario, self.case.store, mutant=self.config.getoption("wd_chaos_mutant")
        )
        self.outcome = judged.outcome
        s = judged.outcome.summary
        self.user_properties += [
            ("wd_chaos_verdict", judged.outcome.verdict),
            ("wd_chaos_seed", str(s.get("seed"))),
            ("wd_chaos_run_dir", str(judged.outcome.run_dir)),
            ("wd_chaos_unknown_runs", str(len(judged.misses))),
        ]
        if judged.outcome.expected:  # a pass that says what it passed on (pytest -rA shows it)
            from .analyze import expected_text

            self.add_report_section("call", "wd-chaos verdict", expected_text(judged.outcome.expected))
        runner.expect(judged)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ChaosFailure):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"wd-chaos {self.case.scenario} on {self.case.store}"


def _timeout(config: pytest.Config, case: Case) -> float:
    """A hard bound on a case: each run's workload, heal and four minutes of start and checks."""
    from .gate import options_for

    if case.skip is not None:
        return 60.0
    scenario, opts = options_for(case, **_options(config))
    limit = opts.time_limit if opts.time_limit is not None else scenario.time_limit
    return float(config.getoption("wd_chaos_runs")) * (limit + scenario.heal_seconds + 240.0)


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect, so they apply to the cases too
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    if not config.stash.get(_CASES, None):
        return
    collector = ChaosCollector.from_parent(session, name="wd-chaos", nodeid="wd-chaos")
    made = [node for node in collector.collect() if isinstance(node, pytest.Item)]
    # reported as collected, so "collected N items" counts them
    config.hook.pytest_collectreport(report=pytest.CollectReport(collector.nodeid, "passed", None, list(made)))
    items[:0] = made  # first: they are the long ones, which two workers (-n 2) should start early


class ChaosRun:
    """Runs a scenario on a store for a test and hands back its ``Outcome`` (the ``wd_chaos_run``
    fixture). An unknown run is run again on another seed, at most ``runs`` times (the test fails
    when all were unknown, naming each); servers that cannot be had fail the test saying why.
    Options the scenario refuses fail it too, naming the option."""

    def __init__(self, config: pytest.Config, report_dir: Path) -> None:
        self.config = config
        self.report_dir = report_dir
        self.last: Judged | None = None
        """The last call's runs: the outcome and the unknown runs before it."""

    def judge(
        self,
        scenario: str,
        store: str,
        *,
        runs: int | None = None,
        seconds: float | None = None,
        **options: Any,
    ) -> Judged:
        """Like calling this object, but hands back the ``Judged`` runs (the outcome, the scenario,
        the options and the unknown runs before it)."""
        from .gate import (
            AllUnknown,
            Case,
            OptionError,
            SelectionError,
            Unavailable,
            chaos_stores,
            options_for,
            run_judged,
        )

        given = _options(self.config)
        if seconds is not None:
            given["seconds"] = seconds
        if "seed" in options:  # the command line's, unless the test gives its own
            given["seed"] = options.pop("seed")
        options.setdefault("report_dir", self.report_dir)
        try:
            (kit,) = chaos_stores([store])
            sc, opts = options_for(Case(scenario, kit), **given, **options)
            judged = run_judged(sc, opts, runs=runs or int(self.config.getoption("wd_chaos_runs")))
        except (SelectionError, OptionError, AllUnknown, Unavailable) as exc:
            raise ChaosFailure(
                f"{scenario} on {store}: {exc}"
                if isinstance(exc, (SelectionError, OptionError))
                else str(exc)
            ) from exc
        self.last = judged
        return judged

    def __call__(
        self,
        scenario: str,
        store: str,
        *,
        runs: int | None = None,
        seconds: float | None = None,
        **options: Any,
    ) -> Outcome:
        """Run ``scenario`` (a name, or a .toml file's path) on ``store`` (a kit name or alias)
        until a run gives a real verdict and return that run's ``Outcome``, whatever its verdict.
        ``seconds`` caps the time limit (default ``--wd-chaos-seconds``); ``runs`` bounds the runs
        (default ``--wd-chaos-runs``); ``options`` are ``wd_chaos.control.runner.Options`` fields (``seed``,
        ``time_limit``, ``workers``, ``client``, ``mutant``, ``schedule``, ``report_dir``)."""
        return self.judge(scenario, store, runs=runs, seconds=seconds, **options).outcome

    def check(
        self,
        scenario: str,
        store: str,
        *,
        runs: int | None = None,
        seconds: float | None = None,
        **options: Any,
    ) -> Outcome:
        """As calling this object, and the verdict must be the scenario's expectation (valid; or
        invalid with the writes it loses by design counted), or the test fails with the evidence,
        the run folder and the commands that reproduce and shrink the run."""
        judged = self.judge(scenario, store, runs=runs, seconds=seconds, **options)
        self.expect(judged)
        return judged.outcome

    @staticmethod
    def expect(judged: Judged) -> None:
        """Fail (``ChaosFailure``) unless ``judged``'s verdict is its scenario's expectation."""
        from .gate import unexpected

        failure = unexpected(judged)
        if failure is not None:
            raise ChaosFailure(failure)


@pytest.fixture
def wd_chaos_run(request: pytest.FixtureRequest) -> ChaosRun:
    """Run a wd-chaos scenario from a test: ``wd_chaos_run("lease-stall", "sqlite", mutant=...)``
    returns the ``Outcome`` of the first run with a real verdict; ``wd_chaos_run.check(...)`` also
    asserts the verdict the scenario expects. Runs are stored under ``--wd-chaos-report-dir`` (default
    ``reports/wd-chaos``), in a folder named after the test."""
    return ChaosRun(request.config, report_root(request.config) / _folder_name(request.node.name))
