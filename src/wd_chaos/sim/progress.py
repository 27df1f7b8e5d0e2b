"""A sweep's progress on a terminal (``wd-chaos sim``): one rich progress bar on stderr with the
runs done, the invalid and unknown ones so far, the rate and the time left. Nothing is drawn when
stderr is not a terminal (CI, a pipe, ``--json`` read by a program): the lines a sweep prints
are the same with or without it."""

from __future__ import annotations

from types import TracebackType

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress


class Progress:
    """A context manager drawing the sweep's bar while it is open (when ``console`` is a terminal;
    by default stderr's). ``advance`` counts one run; ``echo`` prints a line above the bar (or
    plainly, when there is none)."""

    def __init__(self, total: int, console: Console | None = None) -> None:
        self.console = console if console is not None else Console(stderr=True)
        self.shown = self.console.is_terminal
        """Whether a bar is drawn (stderr is a terminal)."""
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None
        self.total = total

    def __enter__(self) -> Progress:
        if self.shown:
            self._bar = RichProgress(
                TextColumn("sim"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("runs, {task.fields[invalid]} invalid, {task.fields[unknown]} unknown"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
                # the verdict lines stay on stdout, a pipe's or a file's when it is one
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task("sim", total=self.total, invalid=0, unknown=0)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, exc, tb)
            self._bar = None

    def advance(self, invalid: int, unknown: int) -> None:
        """One more run done; ``invalid`` and ``unknown``: the counts so far."""
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, advance=1, invalid=invalid, unknown=unknown)

    def echo(self, line: str) -> None:
        """Print ``line`` on stdout; with a bar drawn, above it (the bar is redrawn below)."""
        if self._bar is not None:
            self._bar.stop()
            click.echo(line)
            self._bar.start()
        else:
            click.echo(line)
