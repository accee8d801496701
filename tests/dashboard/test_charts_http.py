"""The Charts page and the overview's hour chart, served by a real daemon: the counts
its worker writes show up per queue, each range reads its own width, and a range the
page does not know is a 400 that names the ones it does."""

from __future__ import annotations

import re
import time

import pytest

from cairnqd import CairnQ
from cairnqd.queue_counts import WAIT, CountRow, bucket_of
from tests.dashboard.conftest import Dash
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(120)


def test_the_workers_counts_reach_the_charts(dash: Dash) -> None:
    """The seed ran one task to success and one to failure on queue `work`: once the
    child has added its counts (every 10 s), the charts and the overview show them."""
    http = dash.http()

    def counted() -> str | None:
        page = http.get("/charts?range=1h")
        assert page.status == 200, page.text[:300]
        return page.text if re.search(r'href="/tasks\?queue=work">work</a>', page.text) else None

    page = wait_for("the work queue's counts on the charts page", counted, 60)
    # succeeded, failed, retried, canceled, lease lost: one of the first two each.
    row = page.split('href="/tasks?queue=work">work</a></th>', 1)[1].split("</tr>", 1)[0]
    cells = re.findall(r'<td class="num">([^<]*)</td>', row)
    assert cells[:5] == ["1", "1", "0", "0", "0"], cells
    assert all(c.endswith(("ms", "s")) for c in cells[5:]), cells  # wait and run percentiles
    assert 'class="chart bars"' in page and 'class="line run p95"' in page
    assert 'aria-current="page">1h</a>' in page

    for span in ("24h", "7d"):
        # Read when the dashboard started, before the counts: served at once as held,
        # then renewed in the background; a later view shows the counts.
        def shown(span: str = span) -> bool:
            other = http.get(f"/charts?range={span}")
            assert other.status == 200 and f'aria-current="page">{span}</a>' in other.text
            return 'href="/tasks?queue=work">work</a>' in other.text

        wait_for(f"the {span} charts renewed", shown, 30)

    def hour_chart() -> bool:
        overview = http.get("/")
        return "last hour: 1 succeeded, 1 failed; wait p95" in overview.text

    wait_for("the overview's hour chart from the counts", hour_chart, 30)


def test_charts_from_counts_any_worker_added(sqlite_dash: Dash) -> None:
    """Counts as several workers wrote them: the day's chart sums them per quarter hour
    and reads percentiles from the bins; the hour's chart never shows a day-old row."""
    now = int(time.time() * 1000)
    quarter = now - now % 900_000

    async def add(q: CairnQ) -> None:
        rows = [
            CountRow(900, quarter, "mail", "succeeded", bucket_of(200), 90),
            CountRow(900, quarter, "mail", "succeeded", bucket_of(4000), 10),
            CountRow(900, quarter - 900_000, "mail", "failed", bucket_of(30), 3),
            CountRow(900, quarter, "mail", WAIT, bucket_of(2), 100),
            CountRow(60, now - 86_400_000, "old", "succeeded", 0, 5),
        ]
        await q.store.queue_counts.add(rows)

    sqlite_dash.run(add)
    http = sqlite_dash.http()

    def day_chart() -> str | None:
        page = http.get("/charts?range=24h").text
        return page if 'href="/tasks?queue=mail">mail</a>' in page else None

    day = wait_for("the day's charts renewed with the added counts", day_chart, 30)
    row = day.split('href="/tasks?queue=mail">mail</a></th>', 1)[1].split("</tr>", 1)[0]
    cells = re.findall(r'<td class="num">([^<]*)</td>', row)
    # 100 succeeded, 3 failed; wait p50 in 2 ms's bin; run p50 in 200 ms's, p99 in 4 s's.
    assert cells[:2] == ["100", "3"], cells
    assert cells[5] == "2.0 ms"
    assert cells[8] in ("200 ms", "208 ms"), cells
    assert cells[10] == "3.8s", cells  # 4 s falls in the bin 3,584-4,095 ms
    assert "old" not in re.findall(r'href="/tasks\?queue=([^"]+)"', http.get("/charts").text)


def test_an_unknown_range_is_a_400_naming_the_known_ones(sqlite_dash: Dash) -> None:
    reply = sqlite_dash.http().get("/charts?range=30d")
    assert reply.status == 400
    assert "range: &#x27;30d&#x27; is not one of 1h, 24h, 7d" in reply.text
    assert sqlite_dash.http().get("/charts?span=1h").status == 400
