"""The DAG runner, on every selected store (``--wd-store``)."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest

from without_durability import Finished, InvalidInput, InvalidValue, Run, resume
from without_durability.dag import Node, run_durably
from without_durability.testing.harness import StoreUnderTest

Store = StoreUnderTest[Any]
LONG = timedelta(hours=1)
_ids = itertools.count()


def wf(label: str) -> str:
    return f"dag-{label}-{next(_ids)}"


async def one_pass(store: Store, workflow: str, body: Any) -> object:
    pass_ = await store.checkpointer.claim(workflow, alive=LONG, budget=LONG)
    try:
        return await resume(store.durable, pass_, body)
    finally:
        await store.checkpointer.release(pass_)


def diamond(calls: list[str], c_result: object = None) -> list[Node]:
    async def a(inputs: dict[str, object]) -> object:
        calls.append("a")
        return 2

    async def b(inputs: dict[str, object]) -> object:
        calls.append("b")
        return {"double": 2 * int(inputs["a"])}  # type: ignore[call-overload]

    async def c(inputs: dict[str, object]) -> object:
        calls.append("c")
        return [inputs["a"], 3] if c_result is None else c_result

    async def d(inputs: dict[str, object]) -> object:
        calls.append("d")
        return {"b": inputs["b"], "c": inputs["c"]}

    return [Node("d", d, ("b", "c")), Node("a", a), Node("b", b, ("a",)), Node("c", c, ("a",))]


async def test_a_graph_runs_dependencies_first_and_each_node_once(wd_store: Store) -> None:
    w = wf("diamond")
    calls: list[str] = []

    async def body(run: Run[Any]) -> object:
        return await run_durably(diamond(calls), run)

    want = {"a": 2, "b": {"double": 4}, "c": [2, 3], "d": {"b": {"double": 4}, "c": [2, 3]}}
    assert await one_pass(wd_store, w, body) == Finished(want)
    assert calls[0] == "a" and calls[-1] == "d" and sorted(calls) == ["a", "b", "c", "d"], calls
    assert await one_pass(wd_store, w, body) == Finished(want), "a replay gave another result"
    assert len(calls) == 4, f"a recorded node ran again: {calls}"
    loaded = await wd_store.checkpointer.load(w)
    assert loaded["dag/d"] == want["d"]


async def test_a_node_returning_a_tuple_is_refused_by_name(wd_store: Store) -> None:
    w = wf("tuple")
    calls: list[str] = []

    async def body(run: Run[Any]) -> object:
        return await run_durably(diamond(calls, c_result=(2, 3)), run)

    with pytest.raises(InvalidValue, match=r"dag node 'c' returned \(2, 3\)"):
        await one_pass(wd_store, w, body)
    assert "d" not in calls, "a dependent ran on a value the store does not hold"


async def test_a_node_that_lost_a_race_takes_the_recorded_value(wd_store: Store) -> None:
    w = wf("race")

    async def a(inputs: dict[str, object]) -> object:
        await wd_store.checkpointer.supply(w, "dag/a", 10)  # another writer got there first
        return 2

    async def b(inputs: dict[str, object]) -> object:
        return {"double": 2 * int(inputs["a"])}  # type: ignore[call-overload]

    async def body(run: Run[Any]) -> object:
        return await run_durably([Node("a", a), Node("b", b, ("a",))], run)

    got = await one_pass(wd_store, w, body)
    assert got == Finished({"a": 10, "b": {"double": 20}}), f"the winner did not stand: {got}"


@pytest.mark.parametrize(
    "graph, message",
    [
        ([Node("a", None), Node("a", None)], "two nodes named 'a'"),  # type: ignore[arg-type]
        ([Node("a", None, ("zz",))], "does not hold"),  # type: ignore[arg-type]
        ([Node("a", None, ("b",)), Node("b", None, ("a",))], "cycle"),  # type: ignore[arg-type]
    ],
)
async def test_a_malformed_graph_is_refused_before_anything_runs(
    wd_store: Store, graph: list[Node], message: str
) -> None:
    async def body(run: Run[Any]) -> object:
        return await run_durably(graph, run)

    with pytest.raises(InvalidInput, match=message):
        await one_pass(wd_store, wf("bad"), body)


async def test_a_cycle_is_refused_naming_a_node_on_it(wd_store: Store) -> None:
    graph = [Node("a", None, ("b",)), Node("b", None, ("a",)), Node("c", None)]  # type: ignore[arg-type]

    async def body(run: Run[Any]) -> object:
        return await run_durably(graph, run)

    with pytest.raises(InvalidInput, match=r"cycle through \['(a|b)', '(a|b)', '(a|b)'\]"):
        await one_pass(wd_store, wf("cycle"), body)


def test_prefix_is_keyword_only_and_a_node_is_immutable() -> None:
    """``prefix`` is keyword-only (a positional string is refused, not taken as the prefix), and
    a Node cannot be changed once made (a graph is shared by passes)."""
    import dataclasses
    import inspect

    assert inspect.signature(run_durably).parameters["prefix"].kind is inspect.Parameter.KEYWORD_ONLY
    node = Node("a", None)  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.name = "b"  # type: ignore[misc]
