"""The Workers page's fleet table: every live daemon, its version, and a warning when
versions differ; rendered from the registry's rows alone, with what they hold escaped."""

from __future__ import annotations

from cairnqd.dashboard.data import Overview
from cairnqd.dashboard.pages import workers_page
from cairnqd.store.tables.fleet import FleetMember
from tests.support.fleet import fleet_member


def _overview(*members: FleetMember) -> Overview:
    return Overview(
        taken_at_ms=0,
        queues=[],
        failed_groups=[],
        schedules={},
        daemon=None,
        daemon_note="no daemon answers",
        fleet=list(members),
    )


def test_the_fleet_shows_without_any_report_and_flags_mixed_versions() -> None:
    page = str(
        workers_page(_overview(fleet_member("a/1", "0.2.0"), fleet_member("<b>/2", "0.1.0")))
    )
    assert "<h2>Fleet</h2>" in page and "No worker status" in page
    # Without a report naming it, a daemon goes by its host.
    host = fleet_member("a/1", "0.2.0").host
    assert f'{host}</span> <small class="mono">a/1</small></td><td>0.2.0</td>' in page
    assert "&lt;b&gt;/2" in page and "<b>/2" not in page
    assert "Mixed versions: 0.1.0 (1), 0.2.0 (1)" in page


def test_one_version_no_warning_and_an_empty_fleet_says_so() -> None:
    assert "Mixed versions" not in str(workers_page(_overview(fleet_member("a/1", "0.2.0"))))
    assert "No daemon is live on this database." in str(workers_page(_overview()))
