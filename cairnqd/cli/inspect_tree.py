"""`cairnqd inspect --tree`: a task's dependency graph as an indented tree
(docs/workflows.md, "Seeing a graph").

Each root (a task that waits for no task of the graph) starts a tree; under each task
come its dependents in id order. A task with several parents is drawn in full under the
first of them reached, and named again, marked `(above)`, under each of the others.
"""

from __future__ import annotations

from collections import Counter

from cairnqd.cli.listing import state_text, text_value
from cairnqd.store.dependencies import GraphNode, TaskGraph

_BRANCH, _LAST, _PIPE, _BLANK = "├── ", "└── ", "│   ", "    "


def _label(node: GraphNode, focus: str) -> str:
    # Text another client stored as a blob, or a status the protocol lacks: marked.
    parts = [text_value(node.id), text_value(node.name), f"[{text_value(node.queue)}]"]
    parts.append(state_text(node.state))
    if len(node.after) > 1:
        parts.append(f"(after {len(node.after)})")
    if node.id == focus:
        parts.append("<- this task")
    return "  ".join(parts)


def summary(graph: TaskGraph) -> str:
    """One line: how many tasks, in which states."""
    states = Counter(state_text(node.state) for node in graph.nodes)
    counted = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    more = " (cut: more tasks follow)" if graph.truncated else ""
    return f"graph: {len(graph.nodes)} tasks{more}: {counted}"


def tree_lines(graph: TaskGraph, focus: str) -> list[str]:
    """The graph drawn from its roots, the `focus` task marked. Iterative, so a chain
    of any length draws without deep recursion."""
    children = graph.children()
    drawn: set[str] = set()
    lines: list[str] = []
    # (node, the prefix of its line, the prefix of its children's lines)
    stack: list[tuple[GraphNode, str, str]] = [(root, "", "") for root in reversed(graph.roots())]
    while stack:
        node, prefix, child_prefix = stack.pop()
        if node.id in drawn:
            named = f"{text_value(node.id)}  {text_value(node.name)}"
            lines.append(f"{prefix}{named}  {state_text(node.state)}  (above)")
            continue
        drawn.add(node.id)
        lines.append(prefix + _label(node, focus))
        below = children[node.id]
        for index in reversed(range(len(below))):
            last = index == len(below) - 1
            stack.append(
                (
                    below[index],
                    child_prefix + (_LAST if last else _BRANCH),
                    child_prefix + (_BLANK if last else _PIPE),
                )
            )
    return lines


__all__ = ["summary", "tree_lines"]
