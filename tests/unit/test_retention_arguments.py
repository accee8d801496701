"""Retention settings are checked where they are made, naming the argument: each value
here was accepted before, and then failed every sweep (or, for a non-sequence, failed
with a TypeError that named nothing)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cairnqd import Retention, RetentionRule


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: Retention(float("nan")), "older_than_ms"),
        (lambda: Retention(1000, interval_ms=float("nan")), "interval_ms"),
        (lambda: Retention(1000, interval_ms=2**70), "interval_ms"),
        (lambda: Retention(1000, limit=2**70), "limit"),
        (lambda: Retention(1000, limit=1.5), "limit"),
        (lambda: Retention([RetentionRule(1000, queue="")]), "queue"),
        (lambda: Retention([RetentionRule(1000, name="")]), "name"),
        (lambda: Retention(2**70), "older_than_ms"),
    ],
)
def test_a_bad_retention_setting_is_refused_by_name(make: Callable[[], Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make()


def test_the_largest_settings_are_taken() -> None:
    retention = Retention(36_500 * 86_400_000, interval_ms=86_400_000, limit=2**63 - 1)
    assert retention.limit == 2**63 - 1
