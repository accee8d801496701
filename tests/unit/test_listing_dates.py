"""Why a time column's stored value cannot be shown as a date: the smallest bigint is
before year 1, not past year 9999 (rows another client wrote)."""

from __future__ import annotations

from cairnqd.cli import listing


def test_a_time_no_date_holds_says_on_which_side() -> None:
    assert listing._why("run_at_ms", -(2**63)) == "not a date (before year 1)"
    assert listing._why("run_at_ms", 2**63 - 1) == "not a date (past year 9999)"
    assert listing._why("run_at_ms", 0) is None
