"""Task dependencies in the dashboard: the task page's "After" and "Dependents" lists,
and the graph page (`/task/ID/graph`), a layered drawing of the whole dependency graph
a task belongs to, as SVG made on the server (docs/dashboard.md, "Dependency graphs").

The drawing. Each task goes in the column of its longest path from a root (a task that
waits for no task of the graph), so every edge runs left to right, parent to child.
Within a column the tasks are ordered by where their parents sit (the mean of their
parents' places), which keeps most edges short and uncrossed. A column of more than
`COLLAPSE_OVER` tasks is drawn as one box counting its tasks by state, linking to the
list of them: a 1,000-wide fan-in stays a drawing of three boxes, not a wall.

No script and no inline style: boxes are links, colors come from the stylesheet's
classes (so the dark scheme applies), and every value is escaped (markup.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cairnqd.dashboard.markup import Markup, join, render
from cairnqd.dashboard.params import BadRequest
from cairnqd.dashboard.values import pair_text
from cairnqd.models import Task
from cairnqd.store.dependencies import GraphNode, TaskGraph, state_shown

#: A column (layer) of more tasks than this is drawn as one box.
COLLAPSE_OVER = 50
#: The most parents, and dependents, the task page lists (the graph shows them all).
LISTED_MAX = 50
#: The order states are counted in, in a collapsed box and the page's summary.
STATES = ("waiting", "queued", "running", "succeeded", "failed", "canceled")

# Geometry of the drawing, in px.
_BOX_W, _BOX_H = 176, 44
_GAP_X, _GAP_Y, _PAD = 56, 12, 8
_LINE = 15
_NAME_CHARS = 24


def _clip(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def counted(states: Sequence[str]) -> str:
    """`3 succeeded, 1 running`: states in a fixed order, the ones present only."""
    found = Counter(states)
    order = [s for s in STATES if s in found] + sorted(set(found) - set(STATES))
    return ", ".join(f"{found[s]} {s}" for s in order)


# -- the task page's lists -------------------------------------------------------------------


def _dep_item(task: Task) -> Markup:
    state = state_shown(task.status, task.run_at_ms)
    # dep-, not st-: `.st-<status>` names only the page's own task's status.
    return render(
        '<li><a class="mono" href="/task/{id}">{id}</a> {name} '
        '<span class="status dep dep-{state}">{state}</span></li>',
        id=task.id,
        name=task.name,
        state=state,
    )


def _listed(tasks: Sequence[Task], total: int) -> Markup:
    """Tasks as a list, the first `LISTED_MAX` of `total`, and how many more the graph
    shows."""
    more = total - min(len(tasks), LISTED_MAX)
    return render(
        "{items}{more}",
        items=join(_dep_item(t) for t in tasks[:LISTED_MAX]),
        more=render('<li class="note more">and {m} more: see the graph.</li>', m=f"{more:,}")
        if more > 0
        else "",
    )


def dependency_sections(
    task: Task,
    parents: Sequence[Task],
    dependents: Sequence[Task],
    dependents_total: int | None = None,
) -> Markup:
    """The task page's "After" (its parents, in the order its submit named them) and
    "Dependents" lists, with a link to the graph; nothing for a task with neither.
    `dependents` may be the first of `dependents_total` (all of them when None)."""
    dependents_total = len(dependents) if dependents_total is None else dependents_total
    if not parents and not dependents:
        return Markup("")
    parts = []
    if parents:
        note = Markup("")
        pending = sum(1 for p in parents if p.status != "succeeded")
        if state_shown(task.status, task.run_at_ms) == "waiting" and pending:
            done = len(parents) - pending
            note = render(
                '<p class="note waits-for">Waits for {n} parent{s} to succeed{done}.</p>',
                n=pending,
                s="" if pending == 1 else "s",
                done=f" ({done} of {len(parents)} already did)" if done else "",
            )
        parts.append(render(
            '<h2>After <small>{n}</small></h2>{note}<ul class="deps after">{items}</ul>',
            n=len(parents), note=note, items=_listed(parents, len(parents)),
        ))  # fmt: skip
    if dependents:
        parts.append(render(
            '<h2>Dependents <small>{n}</small></h2><ul class="deps dependents">{items}</ul>',
            n=f"{dependents_total:,}", items=_listed(dependents, dependents_total),
        ))  # fmt: skip
    link = render(
        '<p class="graph-link"><a href="/task/{id}/graph">Dependency graph</a></p>', id=task.id
    )
    return render('<section class="dependencies">{parts}{link}</section>',
                  parts=join(parts), link=link)  # fmt: skip


# -- the layout ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Box:
    """One box of the drawing: a task, or a collapsed column of tasks."""

    key: str
    layer: int
    members: tuple[GraphNode, ...]
    collapsed: bool
    x: int
    y: int
    w: int
    h: int

    @property
    def node(self) -> GraphNode:
        return self.members[0]


@dataclass(frozen=True)
class Drawing:
    """The graph laid out: its boxes, its edges (box key to box key, parent to child),
    the tasks of each layer, and the drawing's size."""

    boxes: list[Box]
    edges: list[tuple[str, str]]
    layers: list[list[GraphNode]]
    width: int
    height: int


def layers_of(graph: TaskGraph) -> list[list[GraphNode]]:
    """The tasks by their longest path from a root (layer 0: the roots), each layer
    ordered by the mean place of its tasks' parents, then by id."""
    inside = {n.id: [p for p in n.after if p in graph.by_id] for n in graph.nodes}
    children = graph.children()
    depth: dict[str, int] = {}
    indegree = {key: len(parents) for key, parents in inside.items()}
    ready = [n.id for n in graph.nodes if not indegree[n.id]]
    for key in ready:
        depth[key] = 0
    while ready:  # in topological order: every parent before its children
        key = ready.pop()
        for child in children[key]:
            depth[child.id] = max(depth.get(child.id, 0), depth[key] + 1)
            indegree[child.id] -= 1
            if not indegree[child.id]:
                ready.append(child.id)
    layers: list[list[GraphNode]] = []
    for node in graph.nodes:  # id order
        layer = depth.get(node.id, 0)  # a cycle cannot be made; were one there, layer 0
        while len(layers) <= layer:
            layers.append([])
        layers[layer].append(node)
    place: dict[str, float] = {}
    for layer_nodes in layers:
        if len(layer_nodes) <= COLLAPSE_OVER:

            def mean_place(node: GraphNode) -> float:
                found = [place[p] for p in inside[node.id] if p in place]
                return sum(found) / len(found) if found else 0.0

            layer_nodes.sort(key=lambda n: (mean_place(n), n.id))
        for index, node in enumerate(layer_nodes):
            place[node.id] = (index + 0.5) / len(layer_nodes)
    return layers


def _collapsed_height(members: Sequence[GraphNode]) -> int:
    return _LINE * (2 + len({n.state for n in members})) + 12


def layout(graph: TaskGraph) -> Drawing:
    """Boxes in columns by layer, each column centred on the tallest; the edges between
    boxes, one per pair however many tasks a collapsed box holds."""
    layers = layers_of(graph)
    columns: list[list[tuple[str, tuple[GraphNode, ...], bool, int]]] = []
    for number, layer_nodes in enumerate(layers):
        if len(layer_nodes) > COLLAPSE_OVER:
            members = tuple(layer_nodes)
            columns.append([(f"layer-{number}", members, True, _collapsed_height(members))])
        else:
            columns.append([(n.id, (n,), False, _BOX_H) for n in layer_nodes])
    heights = [sum(h for *_, h in column) + _GAP_Y * (len(column) - 1) for column in columns]
    tallest = max(heights, default=0)
    boxes: list[Box] = []
    box_of: dict[str, str] = {}
    for number, column in enumerate(columns):
        x = _PAD + number * (_BOX_W + _GAP_X)
        y = _PAD + (tallest - heights[number]) // 2
        for key, members, collapsed, h in column:
            boxes.append(Box(key, number, members, collapsed, x, y, _BOX_W, h))
            for node in members:
                box_of[node.id] = key
            y += h + _GAP_Y
    edges: dict[tuple[str, str], None] = {}
    for node in graph.nodes:
        for parent in node.after:
            if parent in box_of:
                edges[(box_of[parent], box_of[node.id])] = None
    width = _PAD * 2 + len(columns) * _BOX_W + max(len(columns) - 1, 0) * _GAP_X
    return Drawing(boxes, list(edges), layers, width, tallest + _PAD * 2)


# -- the graph page --------------------------------------------------------------------------


def _edge(source: Box, target: Box) -> Markup:
    x1, y1 = source.x + source.w, source.y + source.h // 2
    x2, y2 = target.x - 4, target.y + target.h // 2  # the arrowhead ends at the box
    bend = (x2 - x1) // 2
    return render(
        '<path class="edge" data-from="{a}" data-to="{b}" '
        'd="M{x1} {y1} C{c1} {y1} {c2} {y2} {x2} {y2}" marker-end="url(#arrow)"></path>',
        a=source.key, b=target.key, x1=x1, y1=y1, c1=x1 + bend, c2=x2 - bend, x2=x2, y2=y2,
    )  # fmt: skip


def _task_box(box: Box, focus: str) -> Markup:
    node = box.node
    state = node.state
    # Another client's text in either column is shown as it is, marked (values.py).
    attempts = f" · {pair_text(node.attempt, node.max_attempts)}" if node.attempt else ""
    return render(
        '<a class="node node-{state}{current}" href="/task/{id}" data-task="{id}">'
        "<title>{name} ({id}): {state}{attempts}{this}</title>"
        '<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6"></rect>'
        '<text class="name" x="{tx}" y="{y1}">{short}</text>'
        '<text class="state" x="{tx}" y="{y2}">{state}{attempts}</text></a>',
        state=state,
        current=" current" if node.id == focus else "",
        id=node.id,
        name=node.name,
        attempts=attempts,
        this=" (this task)" if node.id == focus else "",
        x=box.x, y=box.y, w=box.w, h=box.h, tx=box.x + 8,
        y1=box.y + 18, y2=box.y + 35,
        short=_clip(node.name, _NAME_CHARS),
    )  # fmt: skip


def _collapsed_box(box: Box, focus: str, href: str) -> Markup:
    states = Counter(n.state for n in box.members)
    order = [s for s in STATES if s in states] + sorted(set(states) - set(STATES))
    inside = any(n.id == focus for n in box.members)
    lines = [
        render('<text class="name" x="{x}" y="{y}">{n} tasks{this}:</text>',
               x=box.x + 8, y=box.y + 18, n=f"{len(box.members):,}",
               this=" (this one among them)" if inside else "")
    ]  # fmt: skip
    for i, state in enumerate(order):
        lines.append(render(
            '<text class="state count-{s}" x="{x}" y="{y}">{n} {s}</text>',
            s=state, x=box.x + 8, y=box.y + 18 + _LINE * (i + 1), n=f"{states[state]:,}",
        ))  # fmt: skip
    # A bar along the bottom, each state's share of it in its color.
    bar, left = [], 0.0
    for state in order:
        share = states[state] / len(box.members) * (box.w - 16)
        bar.append(render(
            '<rect class="share node-{s}" x="{x}" y="{y}" width="{w}" height="4"></rect>',
            s=state, x=f"{box.x + 8 + left:.1f}", y=box.y + box.h - 10, w=f"{share:.1f}",
        ))  # fmt: skip
        left += share
    return render(
        '<a class="node collapsed{current}" href="{href}" data-layer="{layer}">'
        "<title>{n} tasks: {summary}</title>"
        '<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6"></rect>{lines}{bar}</a>',
        current=" current" if inside else "",
        href=href,
        layer=box.layer,
        n=f"{len(box.members):,}",
        summary=counted([n.state for n in box.members]),
        x=box.x, y=box.y, w=box.w, h=box.h,
        lines=join(lines),
        bar=join(bar),
    )  # fmt: skip


def graph_svg(drawing: Drawing, focus: str, layer_href: Callable[[int], str]) -> Markup:
    """The drawing as inline SVG: edges under boxes; `layer_href(n)` is where a
    collapsed box of layer n links to."""
    by_key = {b.key: b for b in drawing.boxes}
    edges = join(_edge(by_key[a], by_key[b]) for a, b in drawing.edges)
    boxes = join(
        _collapsed_box(b, focus, layer_href(b.layer)) if b.collapsed else _task_box(b, focus)
        for b in drawing.boxes
    )
    return render(
        '<div class="graph-wrap"><svg class="graph" xmlns="http://www.w3.org/2000/svg" '
        'viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="group" '
        'aria-label="dependency graph: {n} boxes, {e} edges">'
        '<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="8" '
        'markerHeight="8" orient="auto-start-reverse"><path class="arrow" d="M0 0 L8 4 L0 8 z">'
        '</path></marker></defs><g class="edges">{edges}</g><g class="nodes">{boxes}</g>'
        "</svg></div>",
        w=drawing.width,
        h=drawing.height,
        n=len(drawing.boxes),
        e=len(drawing.edges),
        edges=edges,
        boxes=boxes,
    )


def _layer_list(drawing: Drawing, layer: int, focus: str) -> Markup:
    """The tasks of one layer (where a collapsed box links to), in id order."""
    nodes = sorted(drawing.layers[layer], key=lambda n: n.id)
    rows = join(
        render(
            '<tr{current}><td><a class="mono" href="/task/{id}">{id}</a></td><td>{name}</td>'
            '<td>{queue}</td><td><span class="status st-{state}">{state}</span></td>'
            '<td class="num">{attempts}</td></tr>',
            current=Markup(' class="current"') if n.id == focus else Markup(""),
            id=n.id,
            name=n.name,
            queue=n.queue,
            state=n.state,
            attempts=pair_text(n.attempt, n.max_attempts),
        )
        for n in nodes
    )
    return render(
        '<section class="layer" id="layer"><h2>Layer {n} <small>{count} tasks: {summary}'
        "</small></h2>"
        '<table class="grid"><thead><tr><th scope="col">id</th><th scope="col">name</th>'
        '<th scope="col">queue</th><th scope="col">status</th>'
        '<th scope="col" class="num">attempt</th></tr></thead><tbody>{rows}</tbody></table>'
        "</section>",
        n=layer,
        count=f"{len(nodes):,}",
        summary=counted([n.state for n in nodes]),
        rows=rows,
    )


def graph_live(graph: TaskGraph) -> bool:
    """Whether the graph may still change by itself: some task is queued or running."""
    return any(n.status in ("queued", "running") for n in graph.nodes)


def graph_page(task: Task, graph: TaskGraph, limit: int, layer: str | None = None) -> Markup:
    """The graph page's main part: a summary, the cut if any, the drawing, and with
    `layer` (the query's, checked here) the list of that layer's tasks."""
    drawing = layout(graph)
    shown_layer = _layer_param(drawing, layer)
    base = f"/task/{task.id}/graph"
    summary = render(
        '<p class="graph-summary"><a class="mono" href="/task/{id}">{id}</a> belongs to a '
        "graph of {n} task{s} in {layers} layer{ls}: {states}.</p>",
        id=task.id,
        n=f"{len(graph.nodes):,}",
        s="" if len(graph.nodes) == 1 else "s",
        layers=len(drawing.layers),
        ls="" if len(drawing.layers) == 1 else "s",
        states=counted([n.state for n in graph.nodes]),
    )
    cut = Markup("")
    if graph.truncated:
        cut = render(
            '<p class="warn graph-cut">The graph has more than {limit} tasks: only the first '
            "{limit} (by id, the oldest) are shown{missing}.</p>",
            limit=f"{limit:,}",
            missing="; this task is past the cut" if task.id not in graph.by_id else "",
        )
    alone = (
        Markup('<p class="empty">This task has no parents and no dependents.</p>')
        if len(graph.nodes) <= 1
        else Markup("")
    )
    return render(
        "{summary}{cut}{alone}{svg}"
        '<p class="note">Each box is a task (its name, its state and attempts), in the '
        "column of its longest path from a task that waits for nothing; arrows go from a "
        "task to the tasks that wait for it. A column of more than {over} tasks is one box "
        "counting them: it links to their list.</p>{listed}",
        summary=summary,
        cut=cut,
        alone=alone,
        svg=graph_svg(drawing, task.id, lambda n: f"{base}?layer={n}#layer"),
        over=COLLAPSE_OVER,
        listed=_layer_list(drawing, shown_layer, task.id) if shown_layer is not None else "",
    )


def _layer_param(drawing: Drawing, value: str | None) -> int | None:
    """The `layer` parameter as a layer of the drawing, None when not given; a 400
    naming it when it is not one."""
    if value is None or value == "":
        return None
    count = len(drawing.layers)
    if not value.isdigit() or int(value) >= count:
        raise BadRequest(f"layer: {value[:20]!r} is not a layer of this graph (0 to {count - 1})")
    return int(value)


__all__ = [
    "COLLAPSE_OVER",
    "LISTED_MAX",
    "Box",
    "Drawing",
    "counted",
    "dependency_sections",
    "graph_live",
    "graph_page",
    "graph_svg",
    "layers_of",
    "layout",
]
