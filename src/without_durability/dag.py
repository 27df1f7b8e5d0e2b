"""A small DAG runner on top of a ``Run``: each node's result is recorded once and verified.

A graph feeds a node's result straight to its dependents, so a result the store cannot carry
faithfully (a tuple under ``JsonCodec`` comes back a list) would reach them as one thing on the
pass that computed it and as another on every pass that restores it. ``run_durably`` holds both
the value the node returned and the value the store now has, so it compares them and refuses the
node, by name, on the pass that wrote it, rather than hand its dependents a value that will change.
"""

from __future__ import annotations

import asyncio
import graphlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidInput, InvalidValue
from .run import Run


@dataclass(frozen=True)
class Node:
    """One node: ``fn`` is called with the results of the nodes named in ``after`` (a dict by node
    name) and returns this node's result, which must survive the store's codec unchanged.

    ``fn`` runs at least once per graph (again after a pass dies between running it and recording
    it); once recorded, later passes hand its dependents the recorded value and do not call it.
    """

    name: str
    fn: Callable[[dict[str, object]], Awaitable[object]]
    after: tuple[str, ...] = field(default=())


async def run_durably(graph: Iterable[Node], run: Run[Any], *, prefix: str = "dag/") -> dict[str, object]:
    """Run every node of ``graph`` once, dependencies first and independent nodes concurrently,
    recording each result under ``prefix + name``; return every node's result by name.

    Refuses (``InvalidInput``, before running anything) a graph with duplicate names, a dependency
    on a node it does not hold, or a cycle. Refuses (``InvalidValue``, naming the node) a result
    that the store does not hand back equal, on the pass that recorded it. If another pass recorded
    a node first, its value stands and is what the dependents see.
    """
    nodes: dict[str, Node] = {}
    for node in graph:
        if node.name in nodes:
            raise InvalidInput(f"workflow {run.workflow!r}: the graph has two nodes named {node.name!r}")
        nodes[node.name] = node
    sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for node in nodes.values():
        missing = [d for d in node.after if d not in nodes]
        if missing:
            raise InvalidInput(
                f"workflow {run.workflow!r}: node {node.name!r} runs after {missing!r}, which the "
                "graph does not hold"
            )
        sorter.add(node.name, *node.after)
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        raise InvalidInput(
            f"workflow {run.workflow!r}: the graph has a cycle through {exc.args[1]!r}"
        ) from exc

    results: dict[str, object] = {}

    async def one(name: str) -> None:
        node = nodes[name]
        inputs = {dep: results[dep] for dep in node.after}
        produced, recorded = await run._checkpoint(prefix + name, lambda: node.fn(inputs))
        # won means this pass's encoding is the stored one; unequal on the way back means the
        # codec changed the value, which a dependent on a later pass would see and this one not.
        if recorded is not None and recorded.won and recorded.value != produced:
            raise InvalidValue(
                f"workflow {run.workflow!r}: dag node {name!r} returned {produced!r} "
                f"({type(produced).__name__}), which the store hands back as {recorded.value!r} "
                f"({type(recorded.value).__name__}); return values that survive the store's codec "
                "(under JsonCodec: lists, not tuples; string keys)"
            )
        results[name] = run._records[prefix + name]

    while sorter.is_active():
        ready = sorter.get_ready()
        await asyncio.gather(*(one(name) for name in ready))
        sorter.done(*ready)
    return results
