"""The Charts page: per queue, over the last hour, day or week, the tasks that
finished and failed and the percentiles of their wait and run times, drawn as SVG on
the server from the per-queue counters (cairnqd/queue_counts.py), never from the task
table. No script: the range is a link, and each bar's numbers are its SVG title."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from cairnqd.config.units import elapsed_text
from cairnqd.dashboard.data import RANGES, Charts
from cairnqd.dashboard.markup import Markup, esc, join, render
from cairnqd.dashboard.params import with_params
from cairnqd.queue_counts import OUTCOMES, Period, merged, percentiles

#: Pixels per bar, and the two charts' heights.
_BAR_PX = 4
_BARS_H = 48
_LINES_H = 64
_QUANTILES = (0.5, 0.95, 0.99)


def ms_text(ms: float | None) -> str:
    """A duration from the histograms: 0.7 ms, 12 ms, 1.4 s, then as ages are shown."""
    if ms is None:
        return "-"
    if ms < 10:
        return f"{ms:.1f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    return elapsed_text(ms / 1000)


#: How a bar's width reads in the page's note.
_WIDTH_TEXT = {60: "a minute", 900: "a quarter hour", 3600: "an hour"}


def _period_text(start_ms: int, width_s: int) -> str:
    start = datetime.fromtimestamp(start_ms / 1000, UTC)
    return start.strftime("%Y-%m-%d %H:%M" if width_s < 86_400 else "%Y-%m-%d")


@dataclass(frozen=True)
class BarTimes:
    """One bar's p50 and p95 of wait and run time (ms, None without any), read once."""

    wait: list[float | None]
    run: list[float | None]

    @classmethod
    def of(cls, bar: Period) -> BarTimes:
        return cls(percentiles(bar.wait, (0.5, 0.95)), percentiles(bar.run, (0.5, 0.95)))


def _bar_title(bar: Period, times: BarTimes, width_s: int) -> str:
    parts = [f"{_period_text(bar.start_ms, width_s)} UTC"]
    parts += [f"{n} {o.replace('_', ' ')}" for o in OUTCOMES if (n := bar.outcomes.get(o, 0))]
    wait, run = times.wait[1], times.run[1]
    if wait is not None:
        parts.append(f"wait p95 {ms_text(wait)}")
    if run is not None:
        parts.append(f"run p95 {ms_text(run)}")
    return ", ".join(parts)


def _bars(bars: Sequence[Period], times: Sequence[BarTimes], width_s: int) -> Markup:
    """Finished (below) and failed (on top) per period, each bar titled with its numbers.
    The shapes are written directly: only the titles hold text, each escaped (a week
    of bars is a thousand shapes per queue, too many for `render`'s formatter)."""
    top = max([b.finished + b.failed for b in bars] + [1])
    w, h = _BAR_PX, _BARS_H
    shapes = []
    for i, bar in enumerate(bars):
        x = i * w
        h_ok = round(bar.finished / top * h)
        h_bad = round(bar.failed / top * h)
        shape = f"<g><title>{esc(_bar_title(bar, times[i], width_s))}</title>"
        shape += f'<rect class="hit" x="{x}" y="0" width="{w}" height="{h}"></rect>'
        if h_ok:
            shape += (
                f'<rect class="ok" x="{x}" y="{h - h_ok}" width="{w - 1}" height="{h_ok}"></rect>'
            )
        if h_bad:
            shape += (
                f'<rect class="bad" x="{x}" y="{h - h_ok - h_bad}" width="{w - 1}" '
                f'height="{h_bad}"></rect>'
            )
        shapes.append(shape + "</g>")
    label = f"finished and failed per {_WIDTH_TEXT.get(width_s, f'{width_s}s')}, peak {top}"
    return render(
        '<svg class="chart bars" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        'preserveAspectRatio="none" aria-label="{label}">{shapes}</svg>',
        w=len(bars) * w, h=h, label=label, shapes=Markup("".join(shapes)),
    )  # fmt: skip


def _y(ms: float, top_log: float) -> float:
    """A duration's height on the log scale of the lines chart (1 ms at the bottom)."""
    return round(_LINES_H - math.log10(max(ms, 1.0)) / top_log * (_LINES_H - 2), 1)


def _lines(times: Sequence[BarTimes]) -> Markup:
    """p50 and p95 of wait and run time per period, on a log scale; a period without
    tasks breaks its lines."""
    series = {
        ("wait", "p50"): [t.wait[0] for t in times],
        ("wait", "p95"): [t.wait[1] for t in times],
        ("run", "p50"): [t.run[0] for t in times],
        ("run", "p95"): [t.run[1] for t in times],
    }
    highest = max([v for values in series.values() for v in values if v is not None] + [10.0])
    top_log = math.log10(highest) or 1.0
    paths = []
    for (what, q), values in series.items():
        runs: list[list[str]] = [[]]
        for i, v in enumerate(values):
            if v is None:
                runs.append([])
                continue
            x = i * _BAR_PX + _BAR_PX / 2
            runs[-1].append(f"{x:g},{_y(v, top_log):g}")
        for points in runs:
            if len(points) == 1:  # one period alone: a dot-long line still shows
                at, height = points[0].split(",")
                points.append(f"{float(at) + 1:g},{height}")
            if points:
                paths.append(render(
                    '<polyline class="line {what} {q}" points="{p}"></polyline>',
                    what=what, q=q, p=" ".join(points),
                ))  # fmt: skip
    return render(
        '<svg class="chart lines" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        'preserveAspectRatio="none" '
        'aria-label="{label}"><title>{label}</title>{paths}</svg>',
        w=len(times) * _BAR_PX, h=_LINES_H, paths=join(paths),
        label=f"wait and run time, p50 and p95, log scale up to {ms_text(highest)}",
    )  # fmt: skip


def _summary(bars: Sequence[Period]) -> Markup:
    totals = {o: sum(b.outcomes.get(o, 0) for b in bars) for o in OUTCOMES}
    wait = merged(b.wait for b in bars)
    run = merged(b.run for b in bars)
    counts = join(render('<td class="num">{n}</td>', n=f"{totals[o]:,}") for o in OUTCOMES)
    times = join(
        render('<td class="num">{v}</td>', v=ms_text(v))
        for hist in (wait, run)
        for v in percentiles(hist, _QUANTILES)
    )
    return render("{counts}{times}", counts=counts, times=times)


def charts_page(charts: Charts) -> Markup:
    ranges = join(
        render('<a href="/charts?range={r}"{current}>{r}</a>', r=name,
               current=Markup(' aria-current="page"') if name == charts.range else Markup(""))
        for name in RANGES
    )  # fmt: skip
    heads = join(
        render('<th scope="col" class="num">{h}</th>', h=h)
        for h in (
            *(o.replace("_", " ") for o in OUTCOMES),
            *(f"wait p{round(q * 100)}" for q in _QUANTILES),
            *(f"run p{round(q * 100)}" for q in _QUANTILES),
        )
    )
    rows = [
        render(
            '<tr><th scope="row"><a href="{href}">{q}</a></th>{summary}</tr>'
            '<tr class="charts-of"><td colspan="{span}">{bars}{lines}</td></tr>',
            href=with_params("/tasks", {"queue": queue}),
            q=queue,
            summary=_summary(bars),
            span=1 + len(OUTCOMES) + 2 * len(_QUANTILES),
            bars=_bars(bars, times, charts.width_s),
            lines=_lines(times),
        )
        for queue, bars in sorted(charts.queues.items())
        for times in ([BarTimes.of(b) for b in bars],)
    ]
    table = (
        render(
            '<table class="grid charts"><thead><tr><th scope="col">queue</th>{heads}</tr>'
            "</thead><tbody>{rows}</tbody></table>",
            heads=heads,
            rows=join(rows),
        )
        if rows
        else Markup(
            '<p class="empty">No task finished in this range. The charts count what '
            "cairnqd workers run: each adds its counts every 10 seconds.</p>"
        )
    )
    return render(
        '<nav class="ranges" aria-label="range">{ranges}</nav>{table}'
        '<p class="note">Each bar is {width} from {start} UTC. Bars: succeeded (below) '
        "and failed (above); hover a bar for its numbers. Lines, on a log scale: "
        '<span class="key run">run time</span> and <span class="key wait">wait</span> '
        "(from due to start), p95 solid and p50 dashed. Counted by the cairnqd "
        "workers that ran the tasks (public SDK workers keep no counts); percentiles "
        "are within about 12% (cairnqd/queue_counts.py). Read at {taken} UTC.</p>",
        ranges=ranges,
        table=table,
        width=_WIDTH_TEXT.get(charts.width_s, f"{charts.width_s}s"),
        start=_period_text(charts.first_ms, 60),
        taken=_period_text(charts.taken_at_ms, 60),
    )


__all__ = ["charts_page", "ms_text"]
