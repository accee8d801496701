"""The files under monitoring/ and how to read metric names out of them.

Two suites check those files: tests/unit/test_monitoring.py without a daemon, and
tests/daemon/test_metrics.py against a live scrape. Both read them the same way here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from cairnqd.daemon.parent.metrics import METRIC_NAMES

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "monitoring" / "alerts.yaml"
DASHBOARD = REPO / "monitoring" / "grafana" / "cairnqd.json"

# Every family the daemon exports, as exposed (counters with _total).
KNOWN_METRIC_NAMES: tuple[str, ...] = METRIC_NAMES
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def metric_names(promql: str) -> set[str]:
    """cairnq_* series names in an expression, histogram series folded into their family."""
    names = set()
    for name in re.findall(r"\bcairnq_[A-Za-z0-9_:]*", promql):
        for suffix in HISTOGRAM_SUFFIXES:
            if name.endswith(suffix) and name.removesuffix(suffix) in KNOWN_METRIC_NAMES:
                name = name.removesuffix(suffix)
        names.add(name)
    return names


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def load_dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def dashboard_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    # Rows may be collapsed, holding their panels inside; flatten both layouts.
    flat = []
    for panel in dashboard["panels"]:
        flat.append(panel)
        flat.extend(panel.get("panels", []))
    return flat


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL text on the dashboard: panel targets and variable definitions."""
    exprs = [t["expr"] for p in dashboard_panels(dashboard) for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"]]
    return exprs
