"""Command-line values checked before anything starts: numbers held to the bounds scenario files
are held to (``scenario.bounded``), and output paths tried for writing. Both raise click's usage
errors, which ``wd-chaos`` exits 64 for."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import click

from .scenario import OptionError, bounded


class Bounded(click.ParamType[Any, Any]):
    """A number held to the bound a scenario file's ``field`` is held to (one place names it)."""

    def __init__(self, kind: Any, base: click.ParamType[Any, Any], field: str) -> None:
        self.kind, self.base, self.field = kind, base, field
        self.name = base.name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = self.base.convert(value, param, ctx)
        try:
            return bounded(self.kind, number, f"as the scenario files' {self.field}")
        except OptionError as exc:
            self.fail(str(exc), param, ctx)


def probe_dir(folder: Path, option: str) -> None:
    """Refuse, before a run starts, a folder its results could not be written to."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".wd-probe-", dir=folder)
        try:
            os.write(fd, b"probe\n")
            os.fsync(fd)  # a full disk shows here, not at open
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise click.BadParameter(
            f"cannot write results to {folder}: {exc.strerror or exc}", param_hint=option
        ) from exc


def probe_file(path: Path, option: str) -> None:
    """Refuse, before a run starts, an output file that could not be written."""
    existed = path.exists()
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "is a directory")
        with path.open("a"):
            pass
    except OSError as exc:
        raise click.BadParameter(f"cannot write {path}: {exc.strerror or exc}", param_hint=option) from exc
    if not existed:
        with contextlib.suppress(OSError):
            path.unlink()
