"""The dashboard's pages, rendered on the server with every value escaped (markup.py).

Each function returns the page's main part; `layout` wraps it. Pages drawn from the
shared snapshot (overview, failed, workers, schedules) and a running task's page are
marked live: the script re-reads them every `dashboard.refresh` and swaps the main
part in, without a reload. Action forms appear only when actions are enabled and the
viewer is logged in; each carries the session's CSRF value.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cairnqd.attempts import AttemptRecord, error_attempt, error_label
from cairnqd.config import Config, ScheduleConfig
from cairnqd.config.units import elapsed_text, format_duration
from cairnqd.dashboard.attempts import attempt_timeline
from cairnqd.dashboard.auth import Flash, Session
from cairnqd.dashboard.charts import ms_text
from cairnqd.dashboard.data import HOUR_MINUTES, HostView, LimitRow, Overview, QueueRow
from cairnqd.dashboard.graphs import dependency_sections
from cairnqd.dashboard.markup import Markup, join, render
from cairnqd.dashboard.params import with_params
from cairnqd.dashboard.values import (
    SHOWN_MAX,
    attempts_text,
    field_text,
    fraction,
    number_text,
    pretty,
    raw_text,
    time_text,
    unreadable,
)
from cairnqd.limits import NO_PARTITION, Limit
from cairnqd.models import STATUSES, Task
from cairnqd.schedules import from_ms
from cairnqd.store.base import wall_clock_ms
from cairnqd.store.dependencies import state_shown
from cairnqd.store.tables.fleet import versions
from cairnqd.store.tables.limits import PartitionUsage, RoomWait, full_budgets, span_text
from cairnqd.store.tables.schedules import ScheduleRow

NAV = (
    ("/", "Overview"),
    ("/tasks", "Tasks"),
    ("/charts", "Charts"),
    ("/failed", "Failed"),
    ("/workers", "Workers"),
    ("/schedules", "Schedules"),
)


@dataclass(frozen=True)
class Viewer:
    """Who looks, and what they may do."""

    session: Session | None
    login_required: bool
    actions: bool
    refresh_ms: int
    #: The one-shot message the last action left for this page.
    flash: Flash | None = None

    @property
    def can_act(self) -> bool:
        return self.actions and self.session is not None and self.session.may_act


# -- small pieces --------------------------------------------------------------------------


def when(ms: object) -> str:
    """A time of a row (epoch ms) as UTC; a value another client stored that is not
    one is shown as its text, marked (values.py)."""
    return time_text(ms)


def _no_daemon_note(overview: Overview) -> Markup:
    """Why this host's groups are missing, when no daemon runs here (empty otherwise)."""
    if overview.daemon is not None:
        return Markup("")
    return render('<p class="note">No daemon on this host: {why}.</p>', why=overview.daemon_note)


def age(seconds: float | None) -> str:
    return "-" if seconds is None else elapsed_text(seconds, " ")


def size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(n)


def status_badge(status: str) -> Markup:
    return render('<span class="status st-{s}">{s}</span>', s=status)


def action_form(
    viewer: Viewer,
    action: str,
    label: str,
    fields: Mapping[str, str],
    back: str,
    *,
    confirm: str | None = None,
    danger: bool = False,
    extra: Markup | None = None,
) -> Markup:
    """A POST form for one action, or nothing when the viewer may not act."""
    if not viewer.can_act or viewer.session is None:
        return Markup("")
    hidden = join(
        render('<input type="hidden" name="{k}" value="{v}">', k=k, v=v)
        for k, v in {**fields, "next": back, "csrf": viewer.session.csrf}.items()
    )
    return render(
        '<form method="post" action="/actions/{action}" class="act"{confirm}>{hidden}{extra}'
        '<button type="submit" class="{cls}">{label}</button></form>',
        action=action,
        hidden=hidden,
        extra=extra or Markup(""),
        label=label,
        cls="danger" if danger else "",
        confirm=render(' data-confirm="{c}"', c=confirm) if confirm else Markup(""),
    )


#: The intervals a live page offers (seconds); the configured refresh joins them.
LIVE_CHOICES_S = (1, 2, 5, 10, 30, 60)


def _live_controls(viewer: Viewer) -> Markup:
    """Pause and interval of the live refresh (the script binds them; it remembers the
    interval chosen in the browser)."""
    default_s = viewer.refresh_ms / 1000
    choices = sorted({default_s, *(c for c in LIVE_CHOICES_S if c >= default_s)})
    options = join(
        render(
            '<option value="{ms}"{sel}>{label}</option>',
            ms=int(c * 1000),
            label=f"every {c:g}s",
            sel=Markup(" selected") if c == default_s else Markup(""),
        )
        for c in choices
    )
    return render(
        '<span class="live-controls"><button type="button" id="live-pause" '
        'aria-pressed="false">Pause</button> <select id="live-every" '
        'aria-label="refresh interval">{options}</select></span>',
        options=options,
    )


def _flash(flash: Flash | None) -> Markup:
    if flash is None:
        return Markup("")
    if flash.ok:
        return render('<div id="flash" class="flash ok" role="status">{m}</div>', m=flash.message)
    return render('<div id="flash" class="flash error" role="alert">{m}</div>', m=flash.message)


def layout(
    title: str, path: str, body: Markup, viewer: Viewer, *, live: bool, search: str = ""
) -> Markup:
    nav = join(
        render(
            '<a href="{href}"{current}>{label}</a>',
            href=href,
            label=label,
            current=Markup(' aria-current="page"') if _section(path) == href else Markup(""),
        )
        for href, label in NAV
    )
    if viewer.session is not None:
        who = render(
            '<form method="post" action="/logout" class="who"><span>{who}</span>'
            '<input type="hidden" name="csrf" value="{csrf}">'
            '<button type="submit">Log out</button></form>',
            who=viewer.session.who
            if viewer.session.may_act
            else f"{viewer.session.who} (read-only)",
            csrf=viewer.session.csrf,
        )
    else:
        who = Markup('<span class="who">read-only</span>')
    return render(
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>{title} · cairnqd</title>"
        '<link rel="stylesheet" href="/static/dashboard.css">'
        '<script src="/static/dashboard.js" defer></script></head>'
        '<body><header><a class="brand" href="/">cairnqd</a><nav>{nav}</nav>'
        '<form class="search" method="get" action="/search" role="search">'
        '<input type="search" name="q" value="{search}" maxlength="1000" '
        'placeholder="task id, key, name or payload text" aria-label="search tasks">'
        '<button type="submit">Search</button></form>{who}</header>{flash}'
        '<main id="page"{live}><h1>{title}</h1>{body}</main>'
        '<footer><span id="live-state">{footer}</span>{controls} · host {host}</footer>'
        "</body></html>\n",
        title=title,
        nav=nav,
        search=search,
        who=who,
        flash=_flash(viewer.flash),
        live=render(' data-live="{ms}"', ms=viewer.refresh_ms) if live else Markup(""),
        body=body,
        footer=f"live, every {viewer.refresh_ms / 1000:g}s" if live else "not live",
        controls=render(" {c}", c=_live_controls(viewer)) if live else Markup(""),
        host=socket.gethostname(),
    )


def _section(path: str) -> str:
    if path.startswith("/task"):
        return "/tasks"
    return path


def problem_note(overview: Overview) -> Markup:
    if overview.problem is None:
        return Markup("")
    return render('<p class="problem" role="alert">{p}</p>', p=overview.problem)


def snapshot_note(overview: Overview) -> Markup:
    return render(
        '<p class="note" data-snapshot="{n}">Counts read at {t} UTC.</p>',
        n=overview.serial,
        t=when(overview.taken_at_ms),
    )


# -- overview --------------------------------------------------------------------------------


def chart(row: QueueRow) -> Markup:
    """The last hour of one queue, a bar per minute: succeeded below, failed on top."""
    top = max([a + b for a, b in row.per_minute] + [1])
    height, width = 28, 3
    bars = []
    for i, (ok, bad) in enumerate(row.per_minute):
        h_ok = round(ok / top * height)
        h_bad = round(bad / top * height)
        x = i * width
        if h_ok:
            bars.append(render(
                '<rect class="ok" x="{x}" y="{y}" width="2" height="{h}"></rect>',
                x=x, y=height - h_ok, h=h_ok,
            ))  # fmt: skip
        if h_bad:
            bars.append(render(
                '<rect class="bad" x="{x}" y="{y}" width="2" height="{h}"></rect>',
                x=x, y=height - h_ok - h_bad, h=h_bad,
            ))  # fmt: skip
    done = sum(a for a, _ in row.per_minute)
    failed = sum(b for _, b in row.per_minute)
    label = f"last hour: {done} succeeded, {failed} failed"
    if row.wait_p95_ms is not None:
        label += f"; wait p95 {ms_text(row.wait_p95_ms)}"
    if row.run_p95_ms is not None:
        label += f", run p95 {ms_text(row.run_p95_ms)}"
    return render(
        '<a class="to-charts" href="/charts?range=1h">'
        '<svg class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        'aria-label="{label}"><title>{label}</title>{bars}</svg></a>'
        '<span class="rate">{per_min}/min</span>',
        w=HOUR_MINUTES * width,
        h=height,
        label=label,
        bars=join(bars),
        per_min=f"{(done + failed) / HOUR_MINUTES:.1f}",
    )


def overview_page(overview: Overview, viewer: Viewer) -> Markup:
    totals = join(
        render(
            '<a class="total st-{s}" href="/tasks?status={s}"><b>{n}</b> {s}</a>',
            s=s,
            n=overview.totals.get(s, 0),
        )
        for s in STATUSES
    )
    # Tasks waiting on their dependencies are queued: shown apart, when there are any.
    waiting = sum(q.waiting for q in overview.queues)
    if waiting:
        totals = render(
            '{totals}<span class="total st-waiting" title="{t}"><b>{n}</b> waiting</span>',
            totals=totals,
            n=waiting,
            t="queued tasks waiting for their dependencies to succeed (counted in queued)",
        )
    rows = []
    for q in overview.queues:
        counts = join(
            render(
                '<td class="num"><a href="{href}">{n}</a></td>{waiting}',
                href=with_params("/tasks", {"queue": q.queue, "status": s}),
                n=q.counts[s],
                waiting=render('<td class="num waiting-n">{w}</td>', w=q.waiting)
                if waiting and s == "queued"
                else "",
            )
            for s in STATUSES
        )
        if q.pause is not None:
            paused = render(
                '<span class="paused">paused</span> <small>by {by} at {at}{why}</small>',
                by=q.pause.paused_by,
                at=when(q.pause.paused_at_ms),
                why=f": {q.pause.reason}" if q.pause.reason else "",
            )
            control = action_form(viewer, "queue-resume", "Resume", {"queue": q.queue}, "/")
        else:
            paused = Markup('<span class="running">running</span>')
            control = action_form(
                viewer,
                "queue-pause",
                "Pause",
                {"queue": q.queue},
                "/",
                extra=Markup(
                    '<input name="reason" placeholder="reason (optional)" maxlength="1000">'
                ),
            )
        throttled = overview.throttled.get(q.queue)
        if throttled:
            # A limit covering the queue has a full budget with due tasks of it waiting.
            paused = render(
                '{paused} <span class="throttled">throttled by {names}</span>',
                paused=paused,
                names=", ".join(throttled),
            )
        rows.append(render(
            '<tr><th scope="row"><a href="{href}">{queue}</a></th>{counts}'
            '<td class="num">{oldest}</td><td class="spark">{chart}</td>'
            "<td>{paused}{control}</td></tr>",
            href=with_params("/tasks", {"queue": q.queue}),
            queue=q.queue, counts=counts, oldest=age(q.oldest_queued_s), chart=chart(q),
            paused=paused, control=control,
        ))  # fmt: skip
    heads = join(
        render(
            '<th scope="col" class="num">{s}</th>{waiting}',
            s=s,
            waiting=Markup(
                '<th scope="col" class="num" title="of queued, waiting for their '
                'dependencies">waiting</th>'
            )
            if waiting and s == "queued"
            else "",
        )
        for s in STATUSES
    )
    queues = (
        render(
            '<table class="grid"><thead><tr><th scope="col">queue</th>{heads}'
            '<th scope="col" class="num">oldest queued</th>'
            '<th scope="col">finished, last hour</th><th scope="col">state</th></tr></thead>'
            "<tbody>{rows}</tbody></table>",
            heads=heads,
            rows=join(rows),
        )
        if rows
        else Markup('<p class="empty">No queues yet: no task was submitted.</p>')
    )
    return render(
        '{problem}<div class="totals">{totals}</div><h2>Queues</h2>{queues}'
        "{limits}<h2>Groups</h2>{groups}{note}",
        problem=problem_note(overview),
        totals=totals,
        queues=queues,
        limits=limits_section(overview),
        groups=groups_table(overview),
        note=snapshot_note(overview),
    )


# -- limits ----------------------------------------------------------------------------------


def _window(ms: int) -> str:
    return format_duration(timedelta(milliseconds=ms))


def _covers(limit: Limit) -> str:
    """What a limit covers, as the config says it."""
    said = []
    if limit.queues:
        said.append("queues " + ", ".join(limit.queues))
    if limit.names:
        said.append("names " + ", ".join(limit.names))
    if limit.partition_field is not None:
        said.append(f"a budget per {limit.partition_field}")
    return "; ".join(said)


def _budgets_text(limit: Limit) -> str:
    said = []
    if limit.concurrency is not None:
        said.append(f"concurrency {limit.concurrency}")
    if limit.rate is not None:
        said.append(f"rate {limit.rate.count}/{_window(limit.rate.window_ms)}")
    return ", ".join(said)


def _room_state(waits: Sequence[RoomWait]) -> Markup:
    if not waits:
        return Markup('<span class="running">room</span>')
    return render(
        '<span class="throttled">full</span> <small>{kinds}</small>',
        kinds=", ".join(w.kind for w in waits),
    )


def _budget_cells(limit: Limit, part: PartitionUsage) -> Markup:
    """Running, starts, waiting and when the window opens, for one budget's partition."""
    rate = limit.rate
    full_rate = rate is not None and part.starts >= rate.count
    return render(
        '<td class="num">{running}</td><td class="num">{starts}</td>'
        '<td class="num">{waiting}</td><td class="num">{opens}</td><td>{state}</td>',
        running="-" if limit.concurrency is None else f"{part.in_use}/{limit.concurrency}",
        starts="-" if rate is None else f"{part.starts}/{rate.count} per {_window(rate.window_ms)}",
        waiting=part.waiting,
        opens=span_text(part.window_frees_in_ms or 0) if full_rate else "-",
        state=_room_state(full_budgets(limit, part)),
    )


def _limit_rows(row: LimitRow) -> list[Markup]:
    lim = row.limit
    name = render("{name}", name=lim.name)
    if row.override is not None:
        o = row.override
        name = render(
            '{name}<br><small class="warn">overridden by {by} at {at}{why}; the config '
            "says {config}</small>",
            name=name,
            by=o.set_by,
            at=when(o.set_at_ms),
            why=f": {o.reason}" if o.reason else "",
            config=_budgets_text(row.configured),
        )
    head = render(
        '<tr><th scope="row">{name}</th><td>{covers}</td>', name=name, covers=_covers(lim)
    )
    if lim.partition_by is None:
        part = row.top[0] if row.top else PartitionUsage(NO_PARTITION)
        return [render("{head}{cells}</tr>", head=head, cells=_budget_cells(lim, part))]
    rate = lim.rate
    rows = [
        render(
            '{head}<td class="num">{running}</td><td class="num">{starts}</td>'
            '<td class="num">{waiting}</td><td class="num">-</td><td>{state}</td></tr>',
            head=head,
            running="-"
            if lim.concurrency is None
            else f"{row.in_use} ({lim.concurrency} per partition)",
            starts="-"
            if rate is None
            else f"{row.starts} ({rate.count} per {_window(rate.window_ms)} per partition)",
            waiting=row.waiting,
            state=render(
                '<span class="throttled">{n} of {of} partitions full</span>',
                n=row.full,
                of=row.partitions,
            )
            if row.full
            else Markup('<span class="running">room</span>'),
        )
    ]
    for part in row.top:
        rows.append(
            render(
                '<tr class="part"><th scope="row"><small>partition</small> {part}</th>'
                "<td></td>{cells}</tr>",
                part=part.part,
                cells=_budget_cells(lim, part),
            )
        )
    hidden = row.partitions - len(row.top)
    if hidden > 0:
        rows.append(
            render(
                '<tr class="part"><td colspan="7" class="note">and {n} more partitions '
                "({waiting} tasks waiting)</td></tr>",
                n=hidden,
                waiting=row.waiting - sum(p.waiting for p in row.top),
            )
        )
    return rows


def limits_section(overview: Overview) -> Markup:
    """Each flow-control limit of the config and what it holds now (docs/limits.md);
    nothing when the config has none."""
    if not overview.limits:
        return Markup("")
    bypasses = join(
        render(
            '<li>limit {limit}: task <a class="mono" href="/task/{id}">{id}</a> ({name}) '
            "{when}, claimed by worker {worker}, which does not keep this limit "
            "(a public SDK worker, or a cairnqd worker configured without it)</li>",
            limit=b.limit,
            id=b.task_id,
            name=b.name,
            when=b.when(),
            worker=b.worker_id,
        )
        for b in overview.bypasses
    )
    warning = (
        render(
            '<div class="warn" role="alert"><p>Tasks running outside a limit, now or in '
            "the last hour: they do not count in its budget.</p><ul>{items}</ul></div>",
            items=bypasses,
        )
        if overview.bypasses
        else Markup("")
    )
    rows = [r for row in overview.limits for r in _limit_rows(row)]
    return render(
        '<section class="limits"><h2>Limits</h2>{warning}<table class="grid"><thead><tr>'
        '<th scope="col">limit</th><th scope="col">covers</th>'
        '<th scope="col" class="num">running</th><th scope="col" class="num">starts</th>'
        '<th scope="col" class="num">waiting</th>'
        '<th scope="col" class="num">window opens in</th><th scope="col">room</th>'
        "</tr></thead><tbody>{rows}</tbody></table></section>",
        warning=warning,
        rows=join(rows),
    )


def _host_label(h: HostView) -> Markup:
    """Which daemon, by its instance name: this host's (live) or another's, with the
    age of its report, or when it stopped."""
    pid = h.view.get("pid")
    name = h.instance
    where = "" if name.startswith(h.host) else f"on {h.host}, "
    if h.age_s is None:
        return render(
            '<span class="instance">{name}</span> <small>{where}pid {pid}, this host, live</small>',
            name=name, where=where, pid=pid,
        )  # fmt: skip
    state = "stopped" if h.stopped else "silent for" if h.silent else "reported"
    return render(
        '<span class="instance">{name}</span> <small class="{cls}">{where}pid {pid}, '
        "{state} {age} ago</small>",
        name=name, where=where, pid=pid, state=state, age=age(h.age_s),
        cls="fatal" if h.silent else "note" if h.stopped else "",
    )  # fmt: skip


def groups_table(overview: Overview) -> Markup:
    if not overview.hosts:
        return render('<p class="empty">No daemon status: {why}.</p>', why=overview.daemon_note)
    rows = []
    for h in overview.hosts:
        for g in h.view.get("groups", []):
            fatal = g.get("fatal_error")
            rows.append(render(
                '<tr><th scope="row">{name}</th><td>{host}</td>'
                '<td><span class="state state-{state}">{state}</span></td><td>{queues}</td>'
                '<td class="num">{ready}/{processes}</td><td class="num">{concurrency}</td>'
                '<td class="num">{restarts}</td><td>{fatal}</td></tr>',
                name=g.get("name"), host=_host_label(h), state=str(g.get("state", "")).lower(),
                queues=", ".join(g.get("queues", [])), ready=g.get("ready"),
                processes=g.get("processes"), concurrency=g.get("concurrency"),
                restarts=g.get("restarts"),
                fatal=render('<span class="fatal">{f}</span>', f=fatal) if fatal else "",
            ))  # fmt: skip
    note = _no_daemon_note(overview)
    return render(
        '{note}<table class="grid"><thead><tr><th scope="col">group</th>'
        '<th scope="col">daemon</th><th scope="col">state</th><th scope="col">queues</th>'
        '<th scope="col" class="num">ready</th><th scope="col" class="num">concurrency</th>'
        '<th scope="col" class="num">restarts</th><th scope="col">FATAL reason</th></tr>'
        "</thead><tbody>{rows}</tbody></table>",
        note=note,
        rows=join(rows),
    )


def _message_text(value: object) -> str:
    """A message (a task's, or a failed group's) as text: None is empty; another type
    (a number in an envelope's message) as it is."""
    if value is None:
        return ""
    return value if isinstance(value, str) else raw_text(value)


# -- tasks -----------------------------------------------------------------------------------


def cancel_grace_of(config: Config, queue: str) -> timedelta | None:
    """The `cancel_grace` of the groups that claim from `queue` on this host; None when
    none does or they differ."""
    graces = {g.cancel_grace for g in config.groups.values() if queue in g.queues}
    return graces.pop() if len(graces) == 1 else None


def cancel_text(task: Task, grace: timedelta | None) -> str:
    """What a cancel of `task` does, and when, for the Cancel button's confirmation."""
    if task.status == "queued":
        return f"Cancel task {task.id}? It is queued: it ends canceled at once and never runs."
    wait = format_duration(grace) if grace is not None else "its group's cancel_grace"
    return (
        f"Cancel task {task.id}? It is running: its handler learns of the cancel within "
        f"about a second (ctx.canceled()). If it has not returned {wait} later, an async "
        f"handler is cancelled; one still running {wait} after that (a sync handler) has "
        "its worker process replaced. The task ends canceled and is not retried."
    )


def task_page(
    task: Task,
    key: str | None,
    viewer: Viewer,
    waits: Sequence[RoomWait] = (),
    attempts: Sequence[AttemptRecord] = (),
    *,
    cancel_grace: timedelta | None = None,
    parents: Sequence[Task] = (),
    dependents: Sequence[Task] = (),
    dependents_total: int | None = None,
) -> Markup:
    """One task in full; `waits` are the budgets of limits it waits for room in,
    `attempts` its recorded attempts, oldest first; `cancel_grace` is its group's
    (`cancel_grace_of`), for the Cancel confirmation; `parents` and `dependents` its
    dependencies both ways, `dependents` perhaps the first of `dependents_total`
    (graphs.py)."""
    state = state_shown(task.status, task.run_at_ms)
    back = f"/task/{task.id}"
    controls = []
    if task.status in ("failed", "canceled"):
        controls.append(action_form(viewer, "task-retry", "Retry", {"id": task.id}, back))
    if task.status in ("queued", "running") and task.cancel_requested_at_ms is None:
        confirm = cancel_text(task, cancel_grace)
        controls.append(
            action_form(
                viewer,
                "task-cancel",
                "Cancel",
                {"id": task.id},
                back,
                confirm=confirm,
                danger=True,
            )
        )
    facts: list[tuple[str, Any]] = [
        ("id", task.id),
        ("name", task.name),
        ("queue", task.queue),
        ("status", status_badge(state)),
        ("key", key if key is not None else "-"),
        ("attempt", attempts_text(task.attempt, task.max_attempts)),
        ("priority", number_text(task.priority)),
        ("lease holder", task.worker_id or "-"),
        ("lease until", when(task.lease_until_ms)),
        ("created", when(task.created_at_ms)),
        ("due", "once its parents have succeeded" if state == "waiting" else when(task.run_at_ms)),
        ("updated", when(task.updated_at_ms)),
        ("finished", when(task.completed_at_ms)),
        ("cancel requested", when(task.cancel_requested_at_ms)),
        ("parent", task.parent_id or "-"),
        ("root", task.root_id or "-"),
        ("correlation", task.correlation_id or "-"),
    ]
    dl = join(render("<dt>{k}</dt><dd>{v}</dd>", k=k, v=v) for k, v in facts)
    progress = Markup("")
    value = fraction(task.progress)
    if task.progress is not None and value is None:
        # Not a fraction (text another client stored, NaN): no bar, the value as it is.
        progress = render(
            '<h2>Progress</h2><p>{raw} <span class="message">{m}</span></p>',
            raw=unreadable(task.progress),
            m=_message_text(task.message),
        )
    elif task.progress is not None or task.message is not None:
        value = value if value is not None else 0.0
        progress = render(
            '<h2>Progress</h2><p><progress max="1" value="{v}">{pct}</progress> {pct} '
            '<span class="message">{m}</span></p>',
            v=f"{min(max(value, 0.0), 1.0):.4f}",
            pct=f"{value * 100:.0f}%" if task.progress is not None else "",
            m=_message_text(task.message),
        )
    error = Markup("")
    if task.error is not None:
        envelope = task.error if isinstance(task.error, dict) else {"message": task.error}
        details = envelope.get("details") if isinstance(envelope.get("details"), dict) else {}
        trace = details.get("traceback") if isinstance(details, dict) else None
        rest = {k: v for k, v in (details or {}).items() if k != "traceback"}
        label = error_label(task.status, error_attempt(task.error, attempts))
        error = render(
            '<h2>Error</h2>{label}<dl class="facts"><dt>type</dt><dd>{type}</dd><dt>code</dt>'
            "<dd>{code}</dd><dt>message</dt><dd>{message}</dd><dt>retryable</dt>"
            "<dd>{retryable}</dd></dl>{trace}{rest}",
            label=render('<p class="note earlier">The error {l}.</p>', l=label) if label else "",
            type=field_text(envelope.get("type", "-")),
            code=field_text(envelope.get("code", "-")),
            message=field_text(envelope.get("message", "-")),
            retryable=field_text(envelope.get("retryable", "-")),
            trace=render('<h3>Traceback</h3><pre class="trace">{t}</pre>', t=trace)
            if isinstance(trace, str) else "",
            rest=render("<h3>Details</h3><pre>{d}</pre>", d=pretty(rest)) if rest else "",
        )  # fmt: skip
    result = (
        render("<h2>Result</h2><pre>{r}</pre>", r=pretty(task.result))
        if task.status == "succeeded" or task.result is not None
        else Markup("")
    )
    waiting = (
        render(
            '<div class="waiting" role="status"><h2>Waiting for room</h2><ul>{items}</ul></div>',
            items=join(render('<li class="throttled">{w}</li>', w=w.describe()) for w in waits),
        )
        if waits
        else Markup("")
    )
    return render(
        '<div class="controls">{controls}</div>{waiting}<dl class="facts">{dl}</dl>{deps}'
        "{progress}<h2>Payload</h2><pre>{payload}</pre>{result}{error}{attempts}"
        "<h2>Metadata</h2><pre>{metadata}</pre>",
        controls=join(controls),
        waiting=waiting,
        dl=dl,
        deps=dependency_sections(task, parents, dependents, dependents_total),
        progress=progress,
        payload=pretty(task.payload),
        result=result,
        error=error,
        attempts=attempt_timeline(attempts, wall_clock_ms(), when),
        metadata=pretty(task.metadata),
    )


# -- failed ----------------------------------------------------------------------------------


def failed_page(overview: Overview, viewer: Viewer) -> Markup:
    rows = []
    for g in overview.failed_groups:
        fields = {"name": g.name, "error_type": g.error_type}
        rows.append(render(
            '<tr><td><a href="{href}">{name}</a></td><td>{etype}</td><td class="num">{n}</td>'
            "<td>{last}</td><td class=\"msg\">{message}</td><td>{retry}{discard}</td></tr>",
            href=with_params("/tasks", {"status": "failed", "name": g.name}),
            name=g.name, etype=g.error_type or "-", n=g.n, last=when(g.last_ms),
            message=_message_text(g.message)[:300],
            retry=action_form(viewer, "failed-retry", f"Retry all {g.n}", fields, "/failed",
                              confirm=f"Retry every failed {g.name} ({g.error_type})?"),
            discard=action_form(viewer, "failed-discard", "Discard", fields, "/failed",
                                confirm=f"Delete every failed {g.name} ({g.error_type})?",
                                danger=True),
        ))  # fmt: skip
    table = (
        render(
            '<table class="grid"><thead><tr><th scope="col">task name</th>'
            '<th scope="col">error type</th><th scope="col" class="num">tasks</th>'
            '<th scope="col">last failure</th><th scope="col">a message</th>'
            '<th scope="col"></th></tr></thead><tbody>{rows}</tbody></table>',
            rows=join(rows),
        )
        if rows
        else Markup('<p class="empty">No failed tasks.</p>')
    )
    return render(
        "{problem}{table}{note}",
        problem=problem_note(overview),
        table=table,
        note=snapshot_note(overview),
    )


# -- workers ---------------------------------------------------------------------------------


def _fleet_section(overview: Overview) -> Markup:
    """Every daemon live on the database, from the fleet registry, and a warning line
    when their versions differ."""
    if not overview.fleet:
        return Markup('<p class="empty">No daemon is live on this database.</p>')
    names = {h.daemon: h.instance for h in overview.hosts}
    rows = [
        render(
            '<tr><td><span class="instance">{name}</span> <small class="mono">{daemon}</small>'
            '</td><td>{version}</td><td class="num">{pipe}</td>'
            '<td>{groups}</td><td>{features}</td><td class="num">{seen}</td></tr>',
            name=names.get(m.daemon, m.host),
            daemon=m.daemon,
            version=m.version,
            pipe=m.pipe_protocol,
            groups=", ".join(m.groups) or "-",
            features=", ".join(m.features) or "-",
            seen=age(m.age_ms / 1000),
        )
        for m in overview.fleet
    ]
    by_version = versions(overview.fleet)
    mixed = (
        render(
            '<p class="warn">Mixed versions: {mix}. An upgrade is under way, or a host was '
            "missed.</p>",
            mix=", ".join(f"{v} ({n})" for v, n in by_version.items()),
        )
        if len(by_version) > 1
        else Markup("")
    )
    return render(
        '<section class="fleet"><h2>Fleet</h2>{mixed}<table class="grid"><thead><tr>'
        '<th scope="col">daemon</th><th scope="col">version</th>'
        '<th scope="col" class="num">pipe</th><th scope="col">groups</th>'
        '<th scope="col">features</th><th scope="col" class="num">seen</th></tr></thead>'
        "<tbody>{rows}</tbody></table></section>",
        mixed=mixed,
        rows=join(rows),
    )


def _running_tasks(group: Mapping[str, Any]) -> Markup:
    """The tasks a group's children run, longest first: what a roll or a stop would
    cut short once they outlast the group's shutdown_timeout."""
    found = sorted(
        (
            (float(t.get("age_s", 0.0)), t, c)
            for c in group.get("children", [])
            for t in c.get("running", [])
        ),
        key=lambda item: -item[0],
    )
    if not found:
        return Markup("")
    rows = [
        render(
            '<tr><td class="mono"><a href="/task/{id}">{id}</a></td><td>{name}</td>'
            '<td>{group}</td><td class="num">{running}</td><td class="num">{pid}</td></tr>',
            id=t.get("id"),
            name=t.get("name"),
            group=group.get("name"),
            running=age(running_s),
            pid=c.get("pid"),
        )
        for running_s, t, c in found
    ]
    timeout = group.get("shutdown_timeout_s")
    within = f" ({format_duration(timedelta(seconds=float(timeout)))})" if timeout else ""
    return render(
        '<p class="note">Running now. A roll or a stop lets these finish for up to the '
        "group's shutdown_timeout{within}, then cuts them short and hands them back "
        "with their attempt given back.</p>"
        '<table class="grid running"><thead><tr><th scope="col">task</th>'
        '<th scope="col">name</th><th scope="col">group</th>'
        '<th scope="col" class="num">running for</th><th scope="col" class="num">pid</th>'
        "</tr></thead><tbody>{rows}</tbody></table>",
        within=within,
        rows=join(rows),
    )


def workers_page(overview: Overview) -> Markup:
    fleet = _fleet_section(overview)
    if not overview.hosts:
        return render(
            '{fleet}<p class="empty">No worker status: {why}. Daemons that serve the '
            "dashboard, or set dashboard.report, report their children here.</p>",
            fleet=fleet,
            why=overview.daemon_note,
        )
    sections = []
    for h in overview.hosts:
        view = h.view
        tables = []
        for g in [*view.get("groups", []), *view.get("removed_groups", [])]:
            rows = []
            for c in g.get("children", []):
                longest = c.get("longest")
                rows.append(render(
                    "<tr><td class=\"num\">{pid}</td><td class=\"num\">{slot}</td>"
                    '<td>{role}</td><td class="num">{gen}</td><td>{state}</td>'
                    '<td class="num">{rss}</td><td class="num">{executing}</td>'
                    '<td class="num">{held}</td><td class="num">{uptime}</td>'
                    '<td class="num">{lag}</td><td>{longest}</td><td class="mono">{worker}</td>'
                    "</tr>",
                    pid=c.get("pid"), slot=c.get("slot"), role=c.get("role"),
                    gen=c.get("generation"), state=c.get("state"), rss=size(c.get("rss")),
                    executing=c.get("executing"), held=c.get("held"),
                    uptime=age(c.get("uptime_s")),
                    lag="-" if c.get("lag_s") is None else f"{c['lag_s']:.2f}s",
                    longest=render('<a href="/task/{id}">{name}</a> {age}', id=longest["id"],
                                   name=longest["name"], age=age(longest["age_s"]))
                    if isinstance(longest, dict) else "-",
                    worker=c.get("worker_id") or "-",
                ))  # fmt: skip
            tables.append(render(
                "<h3>{name} <small>{state}, {ready}/{processes} ready</small></h3>"
                '<table class="grid"><thead><tr><th scope="col" class="num">pid</th>'
                '<th scope="col" class="num">slot</th><th scope="col">role</th>'
                '<th scope="col" class="num">generation</th><th scope="col">state</th>'
                '<th scope="col" class="num">RSS</th><th scope="col" class="num">executing</th>'
                '<th scope="col" class="num">held</th><th scope="col" class="num">uptime</th>'
                '<th scope="col" class="num">loop lag</th><th scope="col">longest task</th>'
                '<th scope="col">worker id</th></tr></thead><tbody>{rows}</tbody></table>',
                name=g.get("name"), state=str(g.get("state", "")).lower(), ready=g.get("ready"),
                processes=g.get("processes"), rows=join(rows),
            ))  # fmt: skip
            tables.append(_running_tasks(g))
        if h.stopped:
            sections.append(render(
                '<section class="host stopped"><h2>{label}</h2><p class="note">stopped '
                "cleanly after {up} up (generation {gen}): no children.</p></section>",
                label=_host_label(h), gen=view.get("generation"), up=age(view.get("uptime_s")),
            ))  # fmt: skip
            continue
        sections.append(render(
            '<section class="host"><h2>{label}</h2><p class="note">generation {gen}, '
            "up {up}{state}</p>{tables}</section>",
            label=_host_label(h), gen=view.get("generation"), up=age(view.get("uptime_s")),
            state=", stopping" if view.get("stopping") else "", tables=join(tables),
        ))  # fmt: skip
    note = _no_daemon_note(overview)
    return render(
        '{fleet}{note}<p class="note">This host\'s daemon is shown live; every other daemon '
        "that serves the dashboard or sets dashboard.report as it last reported (every few "
        "seconds).</p>{sections}",
        fleet=fleet,
        note=note,
        sections=join(sections),
    )


# -- schedules -------------------------------------------------------------------------------


def _next_fires(schedule: ScheduleConfig, row: ScheduleRow | None, now: datetime) -> list[str]:
    if not schedule.enabled:
        return []
    start = now if row is None else max(now, from_ms(row.last_slot_ms))
    fires = schedule.slots().next_n(start, 3)
    return [t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") for t in fires]


def schedules_page(config: Config, overview: Overview, viewer: Viewer) -> Markup:
    if not config.schedules:
        return Markup('<p class="empty">No schedules in the config.</p>')
    now = datetime.now(UTC)
    rows = []
    for name, s in config.schedules.items():
        row = overview.schedules.get(name)
        last = Markup("never")
        if row is not None and row.last_fired_at_ms is not None:
            last = render(
                '{at} <small>{slot}, by {by}</small><br>{task}',
                at=when(row.last_fired_at_ms),
                slot="slot " + when(row.last_fired_slot_ms)
                if row.last_fired_slot_ms is not None else "manual",
                by=row.fired_by or "-",
                task=render('<a class="mono" href="/task/{id}">{id}</a> {st}',
                            id=row.last_task_id, st=status_badge(row.last_status or "purged"))
                if row.last_task_id else "",
            )  # fmt: skip
        error = (
            render('<span class="fatal">{at}: {m}</span>', at=when(row.last_error_at_ms),
                   m=row.last_error)
            if row is not None and row.last_error else "-"
        )  # fmt: skip
        rows.append(render(
            '<tr><th scope="row">{name}</th><td>{task}</td><td>{queue}</td><td>{rule}</td>'
            "<td>{enabled}</td><td>{next}</td><td>{last}</td><td class=\"num\">{misfires}</td>"
            "<td>{error}</td><td>{trigger}</td></tr>",
            name=name, task=s.name, queue=s.queue, rule=s.rule,
            enabled="yes" if s.enabled else "disabled",
            next=join(_next_fires(s, row, now), "<br>") or "-",
            last=last, misfires=row.misfires if row is not None else 0, error=error,
            trigger=action_form(viewer, "schedule-trigger", "Run now", {"schedule": name},
                                "/schedules"),
        ))  # fmt: skip
    return render(
        "{problem}"
        '<table class="grid"><thead><tr><th scope="col">schedule</th><th scope="col">task</th>'
        '<th scope="col">queue</th><th scope="col">rule</th><th scope="col">enabled</th>'
        '<th scope="col">next fires (UTC)</th><th scope="col">last fire</th>'
        '<th scope="col" class="num">misfires</th><th scope="col">last error</th>'
        '<th scope="col"></th></tr></thead><tbody>{rows}</tbody></table>{note}',
        problem=problem_note(overview),
        rows=join(rows),
        note=snapshot_note(overview),
    )


# -- login, results, errors ------------------------------------------------------------------


def login_page(back: str, message: str | None = None) -> Markup:
    return render(
        "{message}"
        '<form method="post" action="/login" class="login">'
        '<input type="hidden" name="next" value="{back}">'
        '<label>your name (for the audit log) <input name="who" maxlength="64" '
        'autocomplete="username"></label>'
        '<label>token <input name="token" type="password" autocomplete="current-password" '
        "required></label>"
        '<button type="submit">Log in</button></form>',
        back=back,
        message=render('<p class="problem" role="alert">{m}</p>', m=message) if message else "",
    )


def message_page(message: str, back: str | None = None) -> Markup:
    return render(
        '<p class="message">{m}</p>{back}',
        m=message,
        back=render('<p><a href="{b}">back</a></p>', b=back) if back else "",
    )


def plain_layout(title: str, body: Markup) -> Markup:
    """A page outside the dashboard proper (errors before login, the login itself)."""
    return render(
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>{title} · cairnqd</title>"
        '<link rel="stylesheet" href="/static/dashboard.css"></head>'
        '<body><header><a class="brand" href="/">cairnqd</a></header>'
        '<main id="page"><h1>{title}</h1>{body}</main></body></html>\n',
        title=title,
        body=body,
    )


def lines(items: Iterable[str]) -> Markup:
    return join(items, "<br>")


__all__ = [
    "SHOWN_MAX",
    "Viewer",
    "failed_page",
    "layout",
    "limits_section",
    "login_page",
    "message_page",
    "overview_page",
    "plain_layout",
    "schedules_page",
    "status_badge",
    "task_page",
    "workers_page",
]
