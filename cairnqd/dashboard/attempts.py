"""The task page's attempt timeline: each attempt in the order it ran, with its outcome,
worker, host, duration and error, the traceback folded in a `<details>` (no script:
the page keeps its strict CSP)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cairnqd.attempts import OUTCOME_MEANINGS, AttemptRecord, duration_shown, error_traceback
from cairnqd.dashboard.markup import Markup, join, render
from cairnqd.dashboard.values import field_text, is_int, number_text

#: How an outcome is coloured: as the task status that means the same. Its own class
#: (oc-, not st-) keeps `.st-<status>` naming only the task's own status on the page.
_BADGE = {
    None: "running",
    "succeeded": "succeeded",
    "failed": "failed",
    "canceled": "canceled",
    "lease_lost": "failed",
    "aborted": "failed",
    "handed_back": "queued",
}


def attempt_timeline(
    records: Sequence[AttemptRecord], now_ms: int, when: Callable[[object], str]
) -> Markup:
    """The Attempts section of the task page."""
    if not records:
        return Markup(
            '<h2>Attempts</h2><p class="empty">No attempt recorded: the task has not run '
            "yet, or it ran before this database kept attempt history.</p>"
        )
    items = join(_item(r, n, now_ms, when) for n, r in enumerate(records, 1))
    return render('<h2>Attempts</h2><ol class="attempts">{items}</ol>', items=items)


def _item(
    record: AttemptRecord, position: int, now_ms: int, when: Callable[[object], str]
) -> Markup:
    took = _took(record, now_ms)
    return render(
        '<li class="attempt"><div class="attempt-head"><span class="num">#{n}</span> '
        '<span class="status outcome oc-{badge}" title="{meaning}">{outcome}</span> '
        '<span class="mono">{worker}</span> on {host} · started {started} · {took}'
        "{ended}</div>{error}</li>",
        n=number_text(record.attempt),
        badge=_BADGE.get(record.outcome, "queued"),
        meaning=OUTCOME_MEANINGS.get(record.outcome, ""),
        outcome=record.outcome_shown,
        worker=record.worker_id or "-",
        host=record.host or "unknown host",
        started=when(record.started_at_ms),
        took=took if record.finished_at_ms is not None else f"{took} so far",
        ended="" if record.finished_at_ms is None else f" · ended {when(record.finished_at_ms)}",
        error=_error(record, position),
    )


def _took(record: AttemptRecord, now_ms: int) -> str:
    """How long the attempt ran; `-` when a time of its record is not a number (the
    triggers copy them from the task's row, where another client may have written text,
    which the record's times show as it is)."""
    end = record.finished_at_ms if record.finished_at_ms is not None else now_ms
    if not (is_int(record.started_at_ms) and is_int(end)):
        return "-"
    return duration_shown(record.duration_ms(now_ms))


def _error(record: AttemptRecord, position: int) -> Markup:
    error = record.error
    if not error:
        return Markup("")
    kind = error.get("type") or error.get("code") or "error"
    message = render(
        '<p class="attempt-error"><span class="mono">{kind}</span>: {message}</p>',
        kind=field_text(kind),
        message=field_text(error.get("message", "")),
    )
    trace = error_traceback(error)
    if trace is None:
        return message
    # The id lets the live page keep a traceback the operator opened open (dashboard.js);
    # the position, not the attempt number, since a reset runs attempt 1 again.
    return render(
        '{message}<details class="trace" id="attempt-{position}-trace">'
        '<summary>Traceback</summary><pre class="attempt-trace">{trace}</pre></details>',
        message=message,
        position=position,
        trace=trace,
    )


__all__ = ["attempt_timeline"]
