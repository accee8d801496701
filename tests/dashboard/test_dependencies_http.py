"""Task dependencies in the dashboard over real HTTP, served by a real daemon, on SQLite
and Postgres: a task page's parents and dependents, the graph page of a diamond with
live statuses, a wide fan-in collapsed into one box and its list, waiting shown apart
in the lists and the overview, a viewer's view, and the 404 and 400s."""

from __future__ import annotations

import re

from cairnqd import CairnQ
from cairnqd.dashboard.graphs import COLLAPSE_OVER, LISTED_MAX
from tests.dashboard.conftest import SCRIPT_RAW, VIEWER_TOKEN, Dash, Reply
from tests.support.waiting import wait_for

#: A queue no group of the test daemon claims: its tasks stay as submitted.
IDLE_QUEUE = "idle"


def _boxes(page: Reply) -> dict[str, str]:
    """The graph's task boxes: task id -> the box's classes."""
    return dict(
        (task, classes)
        for classes, task in re.findall(
            r'<a class="node ([^"]*)" href="/task/[^"]+" data-task="([^"]+)">', page.text
        )
    )


def _edges(page: Reply) -> set[tuple[str, str]]:
    return set(re.findall(r'<path class="edge" data-from="([^"]+)" data-to="([^"]+)"', page.text))


def _row(page: Reply, task_id: str) -> str:
    found = re.search(rf'<tr>(?:(?!</tr>).)*href="/task/{task_id}"(?:(?!</tr>).)*</tr>', page.text)
    assert found, f"no row of {task_id}"
    return found.group(0)


def test_a_diamond_on_the_task_pages_the_graph_and_the_lists(dash: Dash) -> None:
    release = dash.tmp / "release-diamond"

    async def diamond(q: CairnQ) -> dict[str, str]:
        a = await q.submit("d.echo", {"step": "a"}, queue="work")
        b = await q.submit("d.block", {"until": str(release)}, queue="work", after=[a])
        c = await q.submit("d.echo", {"step": "c"}, queue="work", after=[a])
        d = await q.submit("d.echo", {"step": "d"}, queue="work", after=[b, c])
        return {"a": a.id, "b": b.id, "c": c.id, "d": d.id}

    ids = dash.run(diamond)
    a, b, c, d = ids["a"], ids["b"], ids["c"], ids["d"]
    try:
        dash.wait_status(c, "succeeded")
        dash.wait_status(b, "running")
        assert dash.status(d) == "queued"  # waiting on b
        http = dash.http()

        # The waiting task: its parents in the order named, each a link with its state.
        page = http.get(f"/task/{d}")
        assert page.status == 200
        assert '<span class="status st-waiting">waiting</span>' in page.text
        assert "<dd>once its parents have succeeded</dd>" in page.text
        after = page.text[
            page.text.index("<h2>After") : page.text.index("</ul>", page.text.index("<h2>After"))
        ]
        assert after.index(b) < after.index(c)
        assert f'<a class="mono" href="/task/{b}">{b}</a> d.block' in after
        assert '<span class="status dep dep-running">running</span>' in after
        assert '<span class="status dep dep-succeeded">succeeded</span>' in after
        assert "Waits for 1 parent to succeed (1 of 2 already did)." in page.text
        assert "<h2>Dependents" not in page.text
        assert f'href="/task/{d}/graph"' in page.text

        # The root: its dependents, no parents.
        root = http.get(f"/task/{a}").text
        assert "<h2>After" not in root and "<h2>Dependents <small>2</small></h2>" in root
        assert f'href="/task/{b}"' in root and f'href="/task/{c}"' in root
        assert "Waits for" not in root
        # A task without dependencies shows neither list, nor a graph link.
        plain = http.get(f"/task/{dash.tasks['succeeded']}").text
        assert "<h2>After" not in plain and "<h2>Dependents" not in plain
        assert "/graph" not in plain
        alone = http.get(f"/task/{dash.tasks['succeeded']}/graph")
        assert alone.status == 200 and "This task has no parents and no dependents." in alone.text
        assert len(_boxes(alone)) == 1 and not _edges(alone)

        # The graph: four boxes with their states, four edges, the task looked at
        # highlighted, live while a task of it runs.
        graph = http.get(f"/task/{d}/graph")
        assert graph.status == 200
        boxes = _boxes(graph)
        assert set(boxes) == {a, b, c, d}
        assert boxes[a] == "node-succeeded" and boxes[c] == "node-succeeded"
        assert boxes[b] == "node-running" and boxes[d] == "node-waiting current"
        assert _edges(graph) == {(a, b), (a, c), (b, d), (c, d)}
        assert "graph of 4 tasks in 3 layers: 1 waiting, 1 running, 2 succeeded" in graph.text
        assert "data-live=" in graph.text
        assert "graph-cut" not in graph.text
        # The same graph from its root: only the highlight moves.
        from_root = _boxes(http.get(f"/task/{a}/graph"))
        assert from_root[a] == "node-succeeded current" and from_root[d] == "node-waiting"

        # The task list and the overview show the waiting task apart.
        listed = http.get("/tasks?queue=work")
        assert '<span class="status st-waiting">waiting</span>' in _row(listed, d)
        assert "after its parents" in _row(listed, d)
        assert '<span class="status st-running">running</span>' in _row(listed, b)

        def overview() -> str | None:
            text = http.get("/").text
            return text if "<b>1</b> waiting</span>" in text else None

        text = wait_for("the overview's waiting count", overview)
        assert 'dependencies">waiting</th>' in text
        assert '<td class="num waiting-n">1</td>' in text

        # A viewer sees the graph; an unknown task is a 404, a bad layer a 400.
        viewer = dash.http(login=False)
        viewer.login(token=VIEWER_TOKEN, who="vera")
        seen = viewer.get(f"/task/{d}/graph")
        assert seen.status == 200 and set(_boxes(seen)) == {a, b, c, d}
        missing = http.get("/task/task_01JNOSUCHTASK0000000000000/graph")
        assert missing.status == 404 and "no task task_01JNOSUCHTASK0000000000000" in missing.text
        bad = http.get(f"/task/{d}/graph?layer=7")
        assert (
            bad.status == 400
            and "layer: &#x27;7&#x27; is not a layer of this graph (0 to 2)" in bad.text
        )
        assert http.get(f"/task/{d}/graph?color=red").status == 400
        assert http.get("/task/x%3Cy/graph").status == 400
        assert http.get("/task//graph").status == 400
        # A task whose id is "graph" is a task page, not a graph page.
        assert "no task graph " in http.get("/task/graph").text
    finally:
        release.touch()

    # Once every task ended the graph is final: no longer live.
    dash.wait_status(d, "succeeded")
    done = http.get(f"/task/{d}/graph")
    assert set(_boxes(done).values()) == {"node-succeeded", "node-succeeded current"}
    assert "data-live=" not in done.text
    assert "<dd>once its parents have succeeded</dd>" not in http.get(f"/task/{d}").text


def test_a_wide_fan_in_collapses_into_one_box(dash: Dash) -> None:
    width = 200

    async def fan_in(q: CairnQ) -> list[str]:
        items: list[dict[str, object]] = [{"name": "split", "queue": IDLE_QUEUE}]
        items += [
            {"name": "map", "payload": {"n": n}, "queue": IDLE_QUEUE, "after": [0]}
            for n in range(width)
        ]
        items.append({"name": "reduce", "queue": IDLE_QUEUE, "after": list(range(1, width + 1))})
        return [t.id for t in await q.submit_many(items)]

    ids = dash.run(fan_in)
    split, maps, reduce = ids[0], ids[1:-1], ids[-1]
    http = dash.http()

    graph = http.get(f"/task/{reduce}/graph")
    assert graph.status == 200
    assert width > COLLAPSE_OVER
    # Three boxes: the split, one for the 200 maps, the reduce; one edge each way.
    boxes = _boxes(graph)
    assert boxes == {split: "node-queued", reduce: "node-waiting current"}
    collapsed = re.findall(
        r'<a class="node collapsed" href="([^"]+)" data-layer="1"><title>([^<]*)</title>',
        graph.text,
    )
    assert collapsed == [(f"/task/{reduce}/graph?layer=1#layer", f"{width} tasks: {width} waiting")]
    assert _edges(graph) == {(split, "layer-1"), ("layer-1", reduce)}
    assert f"graph of {width + 2} tasks in 3 layers" in graph.text

    # The box links to the list of its tasks, each a link to its page.
    layer = http.get(f"/task/{reduce}/graph?layer=1")
    assert layer.status == 200
    listed = layer.text[layer.text.index('<section class="layer"') :]
    assert f"Layer 1 <small>{width} tasks: {width} waiting</small>" in listed
    assert all(f'href="/task/{m}"' in listed for m in maps)
    assert listed.count('<span class="status st-waiting">waiting</span>') == width

    # The reduce waits for 200 parents and lists the first; the split, its first
    # dependents.
    page = http.get(f"/task/{reduce}").text
    assert f"Waits for {width} parents to succeed." in page
    assert "<h2>After <small>200</small></h2>" in page
    assert page.count('class="status dep dep-waiting"') == LISTED_MAX
    assert f"and {width - LISTED_MAX} more: see the graph." in page
    assert f'href="/task/{maps[LISTED_MAX - 1]}"' in page and maps[LISTED_MAX] not in page
    split_page = http.get(f"/task/{split}").text
    assert f"<h2>Dependents <small>{width}</small></h2>" in split_page
    assert split_page.count('class="status dep dep-waiting"') == LISTED_MAX
    assert f"and {width - LISTED_MAX} more: see the graph." in split_page

    # User data in a graph stays text: a task after the seeded one named like a script.
    async def after_script(q: CairnQ) -> str:
        return (await q.submit("d.echo", queue=IDLE_QUEUE, after=[dash.tasks["queued"]])).id

    behind = dash.run(after_script)
    for path in (f"/task/{behind}", f"/task/{behind}/graph", f"/task/{dash.tasks['queued']}"):
        text = http.get(path).text
        assert SCRIPT_RAW not in text and "&lt;script&gt;window.__xss=4" in text, path

    # A map's page: after the split, before the reduce.
    one = http.get(f"/task/{maps[0]}").text
    assert "<h2>After <small>1</small></h2>" in one and "Waits for 1 parent to succeed." in one
    assert "<h2>Dependents <small>1</small></h2>" in one
