"""``wd-chaos``: list, run, analyze and shrink scenarios' runs, and clean up after a killed run.

Exit codes, and nothing else produces them: 0 valid, 1 invalid, 2 unknown (a verdict); 64 a usage
error (a bad option or value, an unknown scenario, store or scenario-file key, an output path that
cannot be written; the run never started); 130 interrupted by SIGINT, 143 by SIGTERM (the run's
folder says ``INTERRUPTED``); 255 the harness itself failed (a server could not be had or reached,
a bad scenario file, a damaged run folder), with one line naming the cause (``--debug`` adds the
traceback). Of several runs (``--all``, ``--repeat``): 255 if any could not start or finish, else
the worst verdict. docs/cli-gate.md is the reference of the CI-facing options.
"""

from __future__ import annotations

import click

from . import __version__
from .commands.common import _DEBUG_HELP, _Cli, _set_debug

# the names tests and scripts import from here (exit codes, the JSON/JUnit record of a run)
from .commands.common import CRASHED as CRASHED
from .commands.common import DOCUMENTED as DOCUMENTED
from .commands.common import SIGINT_EXIT as SIGINT_EXIT
from .commands.common import SIGTERM_EXIT as SIGTERM_EXIT
from .commands.common import USAGE as USAGE
from .commands.common import HarnessError as HarnessError
from .commands.common import Result as Result
from .commands.common import Stopped as Stopped
from .commands.common import _junit as _junit
from .commands.listing import list_, show_cmd
from .commands.run import run_cmd
from .commands.stored import analyze_cmd, clean_cmd, shrink_cmd
from .mutants.command import mutants_command
from .mutate.command import mutate_command
from .serve import serve_command
from .sim.command import sim_command
from .workflow_cmd import workflow_command

MAIN_EXAMPLES = """\b
Examples:
  wd-chaos list
  wd-chaos run lease-stall --store postgres --check
  wd-chaos run --all --junit chaos.xml
  wd-chaos analyze reports/20261203T120000-lease-stall-postgres
  wd-chaos clean --interrupted
"""
EXAMPLES = {
    "list": "\b\nExamples:\n  wd-chaos list\n  wd-chaos list --json | jq -r '.name'",
    "analyze": "\b\nExamples:\n  wd-chaos analyze reports/RUN --junit run.xml\n"
    "  wd-chaos analyze --partial reports/RUN    (a run that was interrupted)",
    "shrink": "\b\nExamples:\n  wd-chaos shrink reports/RUN --budget-minutes 10",
    "clean": "\b\nExamples:\n  wd-chaos clean\n  wd-chaos clean --interrupted --report-dir reports",
    "mutants": "\b\nExamples:\n  wd-chaos mutants --store postgres\n  wd-chaos mutants --store redis --no-chaos",
    "mutate": "\b\nExamples:\n  wd-chaos mutate --store postgres",
    "show": "\b\nExamples:\n  wd-chaos show lease-stall > my.toml    (then set its name to \"my\")",
    "serve": "\b\nExamples:\n  wd-chaos serve\n  wd-chaos serve reports --port 0    (a free port; the URL is printed)",
    "sim": "\b\nExamples:\n  wd-chaos sim --seeds 500 --jobs 2 --json\n"
    "  wd-chaos sim --seed 77 --seeds 1    (replay one seed)\n"
    "  wd-chaos sim --seeds 100000 --jobs 2 --failures sim-failures.txt    (a long sweep)",
}
"""The examples each command's ``--help`` ends with (``run`` and the group have their own)."""


@click.group(
    cls=_Cli,
    epilog=MAIN_EXAMPLES,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
@click.version_option(__version__, "--version", "-V", prog_name="wd-chaos", message="%(prog)s %(version)s")
@click.option("--debug", is_flag=True, expose_value=False, callback=_set_debug, help=_DEBUG_HELP)
def main() -> None:
    """Fault-injection harness for without-durability's stores. Exit codes: 0 valid, 1 invalid,
    2 unknown; 64 a usage error; 130/143 stopped by SIGINT/SIGTERM; 255 the harness failed."""


main.add_command(list_)
main.add_command(show_cmd)
main.add_command(run_cmd)
main.add_command(analyze_cmd)
main.add_command(shrink_cmd)
main.add_command(clean_cmd)
main.add_command(mutants_command)
main.add_command(mutate_command)
main.add_command(serve_command)
main.add_command(workflow_command)
main.add_command(sim_command)
for _name, _command in main.commands.items():
    # global options work after the subcommand too (wd-chaos run NAME --debug)
    if not any(p.name == "debug" for p in _command.params):
        _command.params.append(
            click.Option(["--debug"], is_flag=True, expose_value=False, callback=_set_debug, help=_DEBUG_HELP)
        )
    if _command.epilog is None and _name in EXAMPLES:
        _command.epilog = EXAMPLES[_name]


def _plain(text: str | None) -> str | None:
    # docstrings are RST (``name``); a terminal (and the Markdown reference) wants `name`
    return None if text is None else text.replace("``", "`")


def _plain_help(command: click.Command) -> None:
    command.help = _plain(command.help)
    for param in command.params:
        if isinstance(param, click.Option):
            param.help = _plain(param.help)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _plain_help(sub)


_plain_help(main)

if __name__ == "__main__":
    main()
