"""The docs site and the README say what the code does: every scenario-file key is named, every
included snippet exists and works, the README stays a short page for users with no dated runs."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from wd_chaos.faults import FaultSpec, kinds
from wd_chaos.scenario import Lease, Lifecycle, Scenario, Storm, Workload, load_file

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SNIPPET = re.compile(r'^-{2}8<-{2} "([^"]+)"$', re.MULTILINE)
# wording of a lab notebook, not of a manual: dated runs, "this session", machine load of one run
DATED = re.compile(
    r"\b20\d\d-\d\d-\d\d\b|this session|this stop|[Ll]oad average \d|\bour runs?\b|\bwe (ran|measured)\b"
)


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("wd_docs", DOCS / "hooks" / "wd_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pages() -> list[Path]:
    return [p for p in DOCS.rglob("*.md") if "snippets" not in p.parts and "hooks" not in p.parts]


def test_scenario_format_page_names_every_key() -> None:
    # the keys come from the models that validate a scenario file, not from the page's generator
    page = _hook().render((DOCS / "reference" / "scenario-format.md").read_text(), "scenario-format.md")
    sections = {"": Scenario, "lease.": Lease, "workload.": Workload, "lifecycle.": Lifecycle, "storm.": Storm}
    missing = [
        prefix + name
        for prefix, model in sections.items()
        for name in model.model_fields
        if f"`{prefix}{name}`" not in page
    ]
    missing += [f"faults.{name}" for name in FaultSpec.model_fields if name != "kind" and f"`{name}`" not in page]
    for kind_name, kind in kinds().items():
        heading = f'#### `kind = "{kind_name}"`'
        assert heading in page, f"scenario format: expected a section {heading!r}"
        section = page.split(heading, 1)[1].split("\n#### ", 1)[0]
        missing += [
            f"faults.{kind_name}.{name}"
            for name in kind.spec.model_fields
            if name not in FaultSpec.model_fields and f"`{name}`" not in section
        ]
    assert not missing, f"scenario format page: expected every scenario-file key, missing {missing}"


def test_registries_page_names_every_fault_kind_and_checker() -> None:
    from wd_chaos.checks.coverage import windows
    from wd_chaos.checks.registry import bites, checkers

    page = _hook().render((DOCS / "reference" / "faults-and-checkers.md").read_text())
    names = [*kinds(), *checkers(), *bites(), *windows()]
    missing = [name for name in names if f"`{name}`" not in page]
    assert not missing, f"faults-and-checkers page: missing {missing}"


def test_results_pages_render_from_the_baselines() -> None:
    hook = _hook()
    for name in ("benchmarks", "mutation-results"):
        text = hook.GENERATORS[name]()
        assert text.count("\n|") > 5, f"{name}: expected tables from reports/baseline, got {text[:200]!r}"


def test_unknown_generated_part_fails_the_build() -> None:
    with pytest.raises(ValueError, match="unknown generated part"):
        _hook().render("<!-- wd:no-such-part -->")


def test_readme_is_short_and_has_no_dated_runs() -> None:
    text = (ROOT / "README.md").read_text()
    lines = text.count("\n")
    assert lines <= 300, f"README: expected at most 300 lines, got {lines}"
    found = DATED.findall(text)
    assert not found, f"README: expected no dated-run wording, found {found}"
    assert "bash scripts/test" in text, "README: expected the test command CI runs (bash scripts/test)"


def test_docs_pages_have_no_dated_runs() -> None:
    found = {str(p.relative_to(ROOT)): DATED.findall(p.read_text()) for p in _pages()}
    found = {page: hits for page, hits in found.items() if hits}
    assert not found, f"docs: expected no dated-run wording (figures come from reports/baseline), found {found}"


def test_every_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s+([\w/.-]+\.md)\s*$", nav, re.MULTILINE))
    pages = {str(p.relative_to(DOCS)) for p in _pages()}
    assert listed - pages == set(), f"mkdocs.yml nav: no such page {sorted(listed - pages)}"
    assert pages - listed == set(), f"docs pages missing from the nav: {sorted(pages - listed)}"


def test_every_snippet_exists_and_the_scenario_snippet_validates() -> None:
    included = {m for p in _pages() for m in SNIPPET.findall(p.read_text())}
    assert included, "expected the tutorials to include snippets"
    for ref in included:
        path, _, section = ref.partition(":")
        file = ROOT / path
        assert file.is_file(), f"snippet {ref!r}: no such file"
        if section:
            text = file.read_text()
            for end in ("start", "end"):
                assert f"--8<-- [{end}:{section}]" in text, f"snippet {ref!r}: no {end} marker"
        if file.suffix == ".py":
            compile(file.read_text(), str(file), "exec")
        if file.suffix == ".toml" and file.parent == DOCS / "snippets":
            assert load_file(file).name == file.stem


def test_the_store_tutorials_example_imports_and_is_registered() -> None:
    example = ROOT / "examples" / "third_party_store"
    entry = tomllib.loads((example / "pyproject.toml").read_text())["project"]["entry-points"]
    assert entry["without_durability.stores"] == {"jsonfile": "jsonfile_store.kit:KIT"}
    # in a process of its own: the example may not be installed here, and its modules must not stay
    code = (
        "from jsonfile_store.kit import KIT; from jsonfile_store.mutants import MUTANTS; "
        "assert KIT.name == 'jsonfile' and 'workers' in KIT.provides, KIT; "
        "assert [m.name for m in MUTANTS] == ['jsonfile-record-without-fence'], MUTANTS"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(example / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the example store did not import: {done.stderr}"


def test_the_readme_workflow_is_the_example_that_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    example = (ROOT / "examples" / "hello.py").read_text()
    block = readme.split("## A workflow", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert block.strip() and block in example, "README: its workflow must be an excerpt of examples/hello.py"
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "hello.py")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.splitlines()[-1:] == ["ok"], (
        f"examples/hello.py: expected exit 0 and 'ok', got {done.returncode}: {done.stdout}{done.stderr}"
    )


def test_every_wd_chaos_command_the_readme_shows_exists() -> None:
    from wd_chaos.cli import main

    readme = (ROOT / "README.md").read_text()
    shown = set(re.findall(r"^wd-chaos ([a-z-]+)", readme, re.MULTILINE))
    assert shown, "README: expected wd-chaos commands"
    unknown = shown - set(main.commands)
    assert not unknown, f"README shows wd-chaos commands that do not exist: {sorted(unknown)}"


def test_the_cli_reference_shows_real_defaults_and_whole_summaries() -> None:
    """Issue #48 items 4 and 11: the reference page showed ``Sentinel.UNSET`` as a default (click's
    marker for an option given no default) and cut each subcommand's summary at its first line
    break; --help showed RST double backticks."""
    import click
    from click.testing import CliRunner

    from wd_chaos.cli import main

    _hook().tidy_cli_reference()
    unset = getattr(click.core, "UNSET", object())
    left = [
        f"{c.name} {p.name}"
        for c in main.commands.values()
        for p in c.params
        if isinstance(p, click.Option) and p.default is unset
    ]
    assert not left, f"options whose default would show as Sentinel.UNSET: {left}"
    for command in main.commands.values():
        summary = str(command.short_help)
        assert "\n" not in summary and summary.endswith("."), f"{command.name}: summary cut: {summary!r}"
        shown = CliRunner().invoke(main, [str(command.name), "--help"]).output
        assert "``" not in shown, f"wd-chaos {command.name} --help shows RST double backticks:\n{shown}"
    assert _hook().first_sentence("Run a thing (see ``x``). Then more.\n\nDetail.") == "Run a thing (see ``x``)."
