"""The task lists: the Tasks page (filters, keyset pages, a checkbox per row and the
bulk actions on a selection or on the filter), the search box's results, and the
confirmation page of a bulk action by filter (docs/dashboard.md, "Login and actions").
Every value is escaped as in pages.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cairnqd.dashboard.markup import Markup, join, render
from cairnqd.dashboard.pages import Viewer, action_form, status_badge, when
from cairnqd.dashboard.params import BULK_STATUSES, encode_cursor, with_params
from cairnqd.dashboard.reads import next_cursor
from cairnqd.dashboard.values import attempts_text
from cairnqd.models import STATUSES
from cairnqd.store.browse import SORTS, SearchResult, TaskQuery, TaskSummary
from cairnqd.store.dependencies import state_shown

#: The most tasks the search page lists.
SEARCH_SHOWN = 100


def _task_table(
    rows: Sequence[TaskSummary],
    *,
    pick: bool = False,
    keys: Sequence[str | None] | None = None,
) -> Markup:
    """Tasks as list rows; `pick` adds a checkbox per row (name `id`), `keys` a key column."""
    body_rows = join(
        render(
            "<tr>{pick}"
            '<td><a class="mono" href="/task/{id}">{id}</a></td><td>{name}</td>{key}'
            '<td>{queue}</td><td>{status}</td><td class="num">{attempt}</td>'
            "<td>{created}</td><td>{run_at}</td><td>{finished}</td></tr>",
            pick=render(
                '<td class="pick"><input type="checkbox" name="id" value="{id}" '
                'aria-label="select {id}"></td>',
                id=t.id,
            )
            if pick
            else Markup(""),
            id=t.id,
            name=t.name,
            key=render("<td>{k}</td>", k=keys[i] or "-") if keys is not None else Markup(""),
            queue=t.queue,
            status=status_badge(state_shown(t.status, t.run_at_ms)),
            attempt=attempts_text(t.attempt, t.max_attempts),
            created=when(t.created_at_ms),
            run_at="after its parents"
            if state_shown(t.status, t.run_at_ms) == "waiting"
            else when(t.run_at_ms),
            finished=when(t.completed_at_ms),
        )
        for i, t in enumerate(rows)
    )
    return render(
        '<table class="grid"><thead><tr>{pick}<th scope="col">id</th>'
        '<th scope="col">name</th>{key}'
        '<th scope="col">queue</th><th scope="col">status</th>'
        '<th scope="col" class="num">attempt</th><th scope="col">created</th>'
        '<th scope="col">due</th><th scope="col">finished</th></tr></thead>'
        "<tbody>{rows}</tbody></table>",
        pick=Markup('<th scope="col" class="pick"><input type="checkbox" id="pick-all" '
                    'aria-label="select every task shown"></th>')
        if pick else Markup(""),
        key=Markup('<th scope="col">key</th>') if keys is not None else Markup(""),
        rows=body_rows,
    )  # fmt: skip


def _matching_links(values: Mapping[str, str], query: TaskQuery, viewer: Viewer) -> Markup:
    """ "Cancel all matching…" and "Retry all matching…", to the confirmation page, when
    the list is filtered in a way a bulk action by filter can take over."""
    if not viewer.can_act or query.key is not None:
        return Markup("")
    ranged = query.from_ms is not None or query.to_ms is not None
    if ranged and query.sort != "created":
        return Markup("")  # the range is on due or finish time: no bulk filter has it
    if not (query.status or query.queue or query.name or ranged):
        return Markup("")
    links = []
    for op, statuses in BULK_STATUSES.items():
        if query.status is not None and query.status not in statuses:
            continue
        params = {k: values.get(k) for k in ("status", "queue", "name", "from", "to")}
        links.append(render(
            '<a class="bulk-link" href="{href}">{label} all matching…</a>',
            href=with_params("/bulk", {"op": op, **params}),
            label=op.capitalize(),
        ))  # fmt: skip
    return render('<p class="bulk-links">{links}</p>', links=join(links, " · "))


def tasks_page(
    values: Mapping[str, str],
    query: TaskQuery,
    rows: Sequence[TaskSummary],
    more: bool,
    viewer: Viewer,
    here: str = "/tasks",
) -> Markup:
    status_options = join(
        render('<option value="{v}"{sel}>{label}</option>', v=v, label=v or "any status",
               sel=Markup(" selected") if (query.status or "") == v else Markup(""))
        for v in ("", *STATUSES)
    )  # fmt: skip
    sort_options = join(
        render('<option value="{v}"{sel}>newest {label}</option>', v=v,
               label={"run_at": "due"}.get(v, v),
               sel=Markup(" selected") if query.sort == v else Markup(""))
        for v in SORTS
    )  # fmt: skip
    form = render(
        '<form method="get" action="/tasks" class="filters">'
        '<label>status <select name="status">{status_options}</select></label>'
        '<label>queue <input name="queue" value="{queue}" size="10"></label>'
        '<label>name <input name="name" value="{name}" size="14"></label>'
        '<label>key <input name="key" value="{key}" size="14"></label>'
        '<label>from <input name="from" value="{from_}" size="16" '
        'placeholder="2026-12-01T08:00"></label>'
        '<label>to <input name="to" value="{to}" size="16" placeholder="UTC, or +01:00"></label>'
        '<label>sort <select name="sort">{sort_options}</select></label>'
        '<button type="submit">Filter</button> <a href="/tasks">clear</a></form>',
        status_options=status_options, sort_options=sort_options,
        queue=values.get("queue", ""), name=values.get("name", ""), key=values.get("key", ""),
        from_=values.get("from", ""), to=values.get("to", ""),
    )  # fmt: skip
    keep = {k: v for k, v in values.items() if k not in ("cursor",)}
    pager = []
    if query.cursor is not None:
        pager.append(render('<a href="{href}">first page</a>', href=with_params("/tasks", keep)))
    last = rows[-1] if more and rows else None
    # The sort value as stored (`TaskSummary.from_row`): after a real another client wrote, the next
    # page starts at the integer below it.
    after = next_cursor(last.sort_value(query.sort), last.id) if last is not None else None
    if after is not None:
        cursor = encode_cursor(query.sort, *after)
        pager.append(render(
            '<a rel="next" href="{href}">next page</a>',
            href=with_params("/tasks", {**keep, "cursor": cursor}),
        ))  # fmt: skip
    pick = viewer.can_act and bool(rows)
    table = (
        _task_table(rows, pick=pick) if rows else Markup('<p class="empty">No task matches.</p>')
    )
    if pick and viewer.session is not None:
        # One form around the list: the checkboxes are its `id` fields.
        table = render(
            '<form method="post" action="/actions/tasks-selected" class="selection">'
            '<input type="hidden" name="next" value="{here}">'
            '<input type="hidden" name="csrf" value="{csrf}">'
            '<div class="selection-bar"><button type="submit" name="op" value="cancel" '
            'class="danger" data-confirm="Cancel the selected tasks?">Cancel selected</button>'
            '<button type="submit" name="op" value="retry" '
            'data-confirm="Retry the selected tasks?">Retry selected</button>'
            '<span class="note" id="picked"></span></div>{table}</form>',
            here=here, csrf=viewer.session.csrf, table=table,
        )  # fmt: skip
    return render(
        '{form}{matching}{table}<nav class="pager">{pager}</nav>'
        '<p class="note">Times are UTC.</p>',
        form=form, matching=_matching_links(values, query, viewer), table=table,
        pager=join(pager, " · "),
    )  # fmt: skip


def search_page(text: str, result: SearchResult | None, scan: int) -> Markup:
    """What the header's search box found (an id that names a task never gets here:
    it goes to the task's page)."""
    if result is None:
        return Markup(
            '<p class="note">Type a task id (to open it), the start of a key or a task '
            "name, or text inside a payload, in the box above.</p>"
        )
    said = render(
        '<p class="note">Tasks whose key or name starts with “{t}”, or whose payload holds '
        "it (letters in any case), newest first.</p>",
        t=text,
    )
    cut = (
        render(
            '<p class="warn search-cut">Searched the newest {n} tasks only: older ones were '
            "not looked through (a task whose key is exactly “{t}” is found however old).</p>",
            n=f"{result.scanned:,}",
            t=text,
        )
        if result.cut
        else Markup("")
    )
    if not result.hits:
        return render('{said}{cut}<p class="empty">No task matches.</p>', said=said, cut=cut)
    shown = render(
        '<p class="note">{n} shown{most}.</p>',
        n=len(result.hits),
        most=" (the most shown: narrow the search)" if len(result.hits) >= SEARCH_SHOWN else "",
    )
    table = _task_table([h.task for h in result.hits], keys=[h.key for h in result.hits])
    return render("{said}{cut}{shown}{table}", said=said, cut=cut, shown=shown, table=table)


def bulk_page(
    op: str, values: Mapping[str, str], count: int, described: str, viewer: Viewer
) -> Markup:
    """The confirmation step of a bulk action by filter: how many tasks it covers now."""
    back = with_params("/tasks", {k: values.get(k) for k in ("status", "queue", "name",
                                                             "from", "to")})  # fmt: skip
    verb = op.capitalize()
    question = render(
        '<p class="message">{verb} all <b class="bulk-count">{n}</b> matching task(s): '
        "{described}?</p>",
        verb=verb, n=f"{count:,}", described=described,
    )  # fmt: skip
    if count == 0:
        return render(
            '{q}<p class="empty">Nothing to do.</p><p><a href="{back}">back to the list</a></p>',
            q=question, back=back,
        )  # fmt: skip
    fields = {k: v for k, v in values.items() if k != "op" and v}
    fields.update(op=op, count=str(count))
    button = action_form(
        viewer, "tasks-matching", f"{verb} all {count:,}", fields, back, danger=op == "cancel"
    )
    if not button:
        button = Markup('<p class="note">This login may not act.</p>')
    note = (
        '<p class="note">Running tasks are asked to cancel: their handlers end them as '
        "canceled.</p>"
        if op == "cancel"
        else '<p class="note">Each goes back to the queue, due now.</p>'
    )
    return render(
        '{q}{note}<div class="controls">{button} <a href="{back}">no, back to the list</a></div>',
        q=question, note=Markup(note), button=button, back=back,
    )  # fmt: skip


__all__ = ["SEARCH_SHOWN", "bulk_page", "search_page", "tasks_page"]
