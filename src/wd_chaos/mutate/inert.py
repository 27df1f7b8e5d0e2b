"""Where in a Python module a mutation cannot change what the code does, found from its syntax tree:
annotations (parameter, return and variable annotations, string annotations included) and
docstrings (any bare string statement), plus the enclosing definition of each position, so a
mutant's id can name the function it changes rather than a line number that moves.

Positions are cosmic-ray's (parso's): line from 1, column in characters from 0; ``ast`` counts
columns in UTF-8 bytes, so each is converted by its line.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

Position = tuple[int, int]


@dataclass(frozen=True)
class Span:
    """A stretch of a module, from ``start`` up to ``end`` (exclusive), and what it is."""

    start: Position
    end: Position
    kind: str


class Module:
    """One module's source, read once: its inert spans and its definitions."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = source.splitlines(keepends=True)
        tree = ast.parse(source)
        self.inert: list[Span] = []
        self.definitions: list[tuple[Span, str]] = []
        self._walk(tree, "")

    def _position(self, line: int, byte_col: int) -> Position:
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return line, len(text.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))

    def _span(self, node: ast.AST, kind: str) -> Span:
        start = self._position(node.lineno, node.col_offset)  # type: ignore[attr-defined]
        end = self._position(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
        return Span(start, end, kind)

    def _walk(self, node: ast.AST, qualname: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            qualname = f"{qualname}.{node.name}" if qualname else node.name
            self.definitions.append((self._span(node, "definition"), qualname))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            for arg in every:
                if arg is not None and arg.annotation is not None:
                    self.inert.append(self._span(arg.annotation, "annotation"))
            if node.returns is not None:
                self.inert.append(self._span(node.returns, "annotation"))
        elif isinstance(node, ast.AnnAssign):
            self.inert.append(self._span(node.annotation, "annotation"))
        elif (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            self.inert.append(self._span(node, "docstring"))
        for child in ast.iter_child_nodes(node):
            self._walk(child, qualname)

    def inert_kind(self, start: Position, end: Position) -> str | None:
        """``annotation`` or ``docstring`` when ``start``..``end`` lies wholly in one, else None."""
        for span in self.inert:
            if span.start <= start and end <= span.end:
                return span.kind
        return None

    def definition(self, start: Position) -> str:
        """The dotted name of the innermost function or class holding ``start`` (``<module>``
        outside any)."""
        best = "<module>"
        for span, name in self.definitions:  # outer definitions come before inner ones
            if span.start <= start < span.end:
                best = name
        return best

    def line(self, number: int) -> str:
        """Line ``number`` with its whitespace runs squeezed: a mutant's id leans on it."""
        text = self.lines[number - 1] if 0 < number <= len(self.lines) else ""
        return " ".join(text.split())


def compiles(source: str) -> bool:
    """Whether ``source`` is valid Python (a mutant that is not cannot change any behaviour: it
    cannot even be imported)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "is" with a literal, made by a comparison mutant
        try:
            compile(source, "<mutant>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError):
            return False
    return True
