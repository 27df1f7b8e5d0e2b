"""The chaos gate runs wd-chaos as subprocesses; make ``chaos/mutants.py`` importable by them."""

from __future__ import annotations

import os
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH", "")) if p)
