"""The dependency graph's drawing on its own (cairnqd/dashboard/graphs.py): layers by
longest path, the order within a layer, the collapse of a wide layer, escaping, and the
states the task page and the lists show."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cairnqd.dashboard.graphs import (
    COLLAPSE_OVER,
    counted,
    graph_page,
    graph_svg,
    layers_of,
    layout,
)
from cairnqd.dashboard.params import BadRequest
from cairnqd.models import Task
from cairnqd.store.dependencies import WAITING_RUN_AT, GraphNode, TaskGraph, state_shown


def node(
    task_id: str, after: Sequence[str] = (), status: str = "succeeded", name: str = "step"
) -> GraphNode:
    run_at = WAITING_RUN_AT if status == "waiting" else 0
    return GraphNode(
        id=task_id,
        name=name,
        queue="q",
        status="queued" if status == "waiting" else status,
        attempt=0 if status in ("waiting", "queued") else 1,
        max_attempts=3,
        run_at_ms=run_at,
        updated_at_ms=0,
        after=tuple(after),
    )


def ids(layers: list[list[GraphNode]]) -> list[list[str]]:
    return [[n.id for n in layer] for layer in layers]


def test_layers_follow_the_longest_path_from_a_root() -> None:
    # a -> b -> c, and a -> c directly: c goes after b, not beside it.
    graph = TaskGraph([node("a"), node("b", ["a"]), node("c", ["a", "b"])])
    assert ids(layers_of(graph)) == [["a"], ["b"], ["c"]]
    # Two roots; a parent outside the graph (purged, or past the cut) is no edge.
    graph = TaskGraph([node("a"), node("b", ["gone"]), node("c", ["a", "b"])])
    assert ids(layers_of(graph)) == [["a", "b"], ["c"]]
    drawing = layout(graph)
    assert drawing.edges == [("a", "c"), ("b", "c")]


def test_a_layer_is_ordered_by_where_its_parents_are() -> None:
    # Roots r1 < r2; w (child of r2) has the smaller id, x (child of r1) the larger:
    # x goes first, so the two edges do not cross.
    graph = TaskGraph([node("r1"), node("r2"), node("x", ["r1"]), node("w", ["r2"])])
    assert ids(layers_of(graph)) == [["r1", "r2"], ["x", "w"]]


def test_a_diamond_is_four_boxes_and_four_edges() -> None:
    graph = TaskGraph(
        [node("a"), node("b", ["a"], "running"), node("c", ["a"]), node("d", ["b", "c"], "waiting")]
    )
    drawing = layout(graph)
    assert [(b.key, b.layer, b.collapsed) for b in drawing.boxes] == [
        ("a", 0, False),
        ("b", 1, False),
        ("c", 1, False),
        ("d", 2, False),
    ]
    assert drawing.edges == [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]
    by_key = {b.key: b for b in drawing.boxes}
    # Columns left to right; a and d centred beside the column of two.
    assert by_key["a"].x < by_key["b"].x == by_key["c"].x < by_key["d"].x
    assert by_key["a"].y == by_key["d"].y
    assert by_key["b"].y < by_key["a"].y < by_key["c"].y
    svg = graph_svg(drawing, "d", lambda n: f"?layer={n}")
    assert svg.count('<a class="node ') == 4 and svg.count('<path class="edge"') == 4
    assert '<a class="node node-waiting current" href="/task/d"' in svg


def test_a_layer_over_the_bound_collapses_into_one_counting_box() -> None:
    def fan(width: int) -> TaskGraph:
        maps = [
            node(f"m{i:04}", ["r"], "running" if i % 4 == 0 else "waiting") for i in range(width)
        ]
        return TaskGraph(
            [node("r", status="running"), *maps, node("z", [m.id for m in maps], "waiting")]
        )

    at_bound = layout(fan(COLLAPSE_OVER))
    assert len(at_bound.boxes) == COLLAPSE_OVER + 2 and not any(b.collapsed for b in at_bound.boxes)
    drawing = layout(fan(1000))
    assert [(b.key, b.collapsed, len(b.members)) for b in drawing.boxes] == [
        ("r", False, 1),
        ("layer-1", True, 1000),
        ("z", False, 1),
    ]
    assert drawing.edges == [("r", "layer-1"), ("layer-1", "z")]
    svg = graph_svg(drawing, "m0002", lambda n: f"/task/m0002/graph?layer={n}#layer")
    assert "<title>1,000 tasks: 750 waiting, 250 running</title>" in svg
    assert 'href="/task/m0002/graph?layer=1#layer"' in svg
    assert "1,000 tasks (this one among them):" in svg  # the task looked at is inside
    assert '<a class="node collapsed current"' in svg
    # Small enough to read: three columns, one box high each.
    assert drawing.width < 800 and drawing.height < 200


def test_names_are_escaped_and_clipped() -> None:
    graph = TaskGraph([node("a", name="<script>x</script>"), node("b", ["a"], name="n" * 80)])
    svg = graph_svg(layout(graph), "a", lambda n: "")
    assert "<script>" not in svg and "&lt;script&gt;x&lt;/script&gt;" in svg
    assert ">" + "n" * 23 + "…</text>" in svg and "n" * 80 in svg  # whole in the title


def test_states_and_counts() -> None:
    assert state_shown("queued", WAITING_RUN_AT) == "waiting"
    assert state_shown("queued", 1) == "queued"
    assert state_shown("canceled", WAITING_RUN_AT) == "canceled"
    assert counted(["succeeded", "waiting", "succeeded", "odd"]) == "1 waiting, 2 succeeded, 1 odd"


def test_a_layer_asked_for_must_be_one_of_the_graph() -> None:
    graph = TaskGraph([node("a"), node("b", ["a"])])
    task = Task(id="a", name="step", queue="q", status="succeeded")
    assert '<section class="layer" id="layer">' in graph_page(task, graph, 2000, "1")
    for bad in ("2", "-1", "x", "1.0"):
        with pytest.raises(BadRequest, match=r"layer: .* is not a layer of this graph \(0 to 1\)"):
            graph_page(task, graph, 2000, bad)


def test_a_graph_cut_at_its_limit_says_so() -> None:
    graph = TaskGraph([node("a"), node("b", ["a"])], truncated=True)
    page = graph_page(Task(id="b", name="step"), graph, 2)
    assert (
        "The graph has more than 2 tasks: only the first 2 (by id, the oldest) are shown." in page
    )
    # The task looked at may be past the cut: the page says so, and highlights nothing.
    past = graph_page(Task(id="z", name="step"), graph, 2)
    assert "; this task is past the cut." in past and "current" not in past
    whole = graph_page(Task(id="b", name="step"), TaskGraph(graph.nodes), 2)
    assert "graph-cut" not in whole
