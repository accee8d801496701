"""monitoring/: the alert rules and the Grafana dashboard name only metrics cairnqd exports.

tests/daemon/test_metrics.py checks the same names against a live scrape; this module runs
without a daemon. With promtool on PATH (or $PROMTOOL) it also parses every PromQL
expression and fires each alert on synthetic series.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.monitoring_files import (
    ALERTS,
    KNOWN_METRIC_NAMES,
    alert_rules,
    dashboard_panels,
    dashboard_queries,
    load_dashboard,
    metric_names,
)

# The alert expressions as designed, whitespace aside: a changed alert is a deliberate edit here.
DESIGNED_ALERT_EXPRS = (
    "max by (queue) (cairnq_queue_oldest_queued_age_seconds) > 300",
    "max by (queue) (cairnq_leases_expired) > 0",
    "sum by (queue) (rate(cairnq_tasks_failed_total[10m])) "
    "/ sum by (queue) (rate(cairnq_tasks_started_total[10m])) > 0.2",
    'cairnq_group_state{state=~"crashloop|fatal"} == 1',
    'sum by (instance, group) (cairnq_children{state="ready"}) '
    "< on (instance, group) cairnq_children_desired",
    "time() - max(cairnq_purge_last_success_timestamp_seconds) > 3 * 600",
    "cairnq_config_last_reload_successful == 0",
    "count(max by (version) (cairnq_fleet_daemons)) > 1",
    "cairnq_db_up == 0",
    'sum by (instance) (increase(cairnq_db_errors_total{kind="full"}[5m])) > 0',
    "time() - max by (schedule) (cairnq_schedule_last_fire_timestamp_seconds) "
    "> 2 * max by (schedule) (cairnq_schedule_period_seconds)",
)

DASHBOARD_ROWS = [
    "Queues",
    "Throughput",
    "Latency",
    "Supervisor",
    "Maintenance",
    "Config and DB",
    "Schedules",
    "Limits",
]
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range"}


def _normalize(expr: str) -> str:
    return " ".join(expr.split())


@pytest.fixture(scope="module")
def rules() -> list[dict[str, Any]]:
    return alert_rules()


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


# -- alerts -------------------------------------------------------------------------------------


def test_every_rule_is_complete(rules: list[dict[str, Any]]) -> None:
    assert rules
    for rule in rules:
        name = rule.get("alert")
        assert isinstance(name, str) and re.fullmatch(r"Cairnq[A-Za-z]+", name), rule
        assert isinstance(rule.get("expr"), str) and rule["expr"].strip(), name
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for"))), name
        assert rule.get("labels", {}).get("severity") in {"warning", "critical"}, name
        assert rule.get("annotations", {}).get("summary"), name
        assert rule["annotations"].get("description"), name
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))


def test_alerts_are_the_designed_ones(rules: list[dict[str, Any]]) -> None:
    assert sorted(_normalize(r["expr"]) for r in rules) == sorted(
        _normalize(e) for e in DESIGNED_ALERT_EXPRS
    )


def test_alert_metrics_are_known(rules: list[dict[str, Any]]) -> None:
    for rule in rules:
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= set(KNOWN_METRIC_NAMES), (rule["alert"], names - set(KNOWN_METRIC_NAMES))


# -- dashboard ----------------------------------------------------------------------------------


def test_dashboard_metrics_are_known(dashboard: dict[str, Any]) -> None:
    used = set().union(*(metric_names(q) for q in dashboard_queries(dashboard)))
    assert used <= set(KNOWN_METRIC_NAMES), used - set(KNOWN_METRIC_NAMES)


def test_dashboard_shows_every_metric(dashboard: dict[str, Any]) -> None:
    # A family nobody can see on the dashboard is either dead or missing a panel.
    used = set().union(*(metric_names(q) for q in dashboard_queries(dashboard)))
    assert set(KNOWN_METRIC_NAMES) - used == set()


def test_dashboard_datasource_is_an_import_input(dashboard: dict[str, Any]) -> None:
    (ds_input,) = dashboard["__inputs"]
    assert ds_input["name"] == "DS_PROMETHEUS"
    assert ds_input["type"] == "datasource"
    assert ds_input["pluginId"] == "prometheus"
    expected = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    for panel in dashboard_panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == expected, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == expected, panel["title"]
    for variable in dashboard["templating"]["list"]:
        assert variable["datasource"] == expected, variable["name"]


def test_dashboard_variables(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert list(variables) == ["instance", "group", "queue"]
    for name, variable in variables.items():
        assert variable["type"] == "query"
        assert re.fullmatch(
            rf"label_values\(cairnq_\w+(\{{.*\}})?, {name}\)", variable["definition"]
        )
        assert variable["query"]["query"] == variable["definition"]


def test_dashboard_references_only_defined_variables(dashboard: dict[str, Any]) -> None:
    defined = {v["name"] for v in dashboard["templating"]["list"]} | GRAFANA_BUILTINS
    for query in dashboard_queries(dashboard):
        referenced = set(re.findall(r"\$\{?(\w+)", query))
        assert referenced <= defined, (query, referenced - defined)


def test_dashboard_rows_and_layout(dashboard: dict[str, Any]) -> None:
    panels = dashboard_panels(dashboard)
    assert [p["title"] for p in panels if p["type"] == "row"] == DASHBOARD_ROWS
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] == "cairnqd"
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            refs = [t["refId"] for t in panel["targets"]]
            assert len(refs) == len(set(refs)), panel["title"]


def test_latency_row_uses_histogram_quantiles(dashboard: dict[str, Any]) -> None:
    exprs = " ".join(dashboard_queries(dashboard))
    for family in ("cairnq_task_duration_seconds", "cairnq_task_queue_wait_seconds"):
        for quantile in ("0.5", "0.95", "0.99"):
            assert f"histogram_quantile({quantile}, sum by (le, queue) (rate({family}_bucket" in (
                exprs
            )


# -- promtool (optional) ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def promtool() -> str:
    path = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if not path:
        pytest.skip("promtool not installed (Debian: prometheus package)")
    return path


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=cwd)


def test_promtool_checks_alert_rules(promtool: str) -> None:
    proc = _run([promtool, "check", "rules", str(ALERTS)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_parsesdashboard_queries(
    promtool: str, dashboard: dict[str, Any], tmp_path: Path
) -> None:
    # Grafana variables are not PromQL; substitute plausible values, then let promtool parse
    # each panel query as a recording rule.
    substitutions = {"$__rate_interval": "5m", "$instance": ".*", "$group": ".*", "$queue": ".*"}
    records = []
    for index, query in enumerate(
        t["expr"] for p in dashboard_panels(dashboard) for t in p.get("targets", [])
    ):
        for variable, value in substitutions.items():
            query = query.replace(variable, value)
        records.append({"record": f"cairnq_dashboard:panel{index}", "expr": query})
    rule_file = tmp_path / "dashboard_rules.yaml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    proc = _run([promtool, "check", "rules", str(rule_file)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _case(
    series: dict[str, str], alert: str, at: str, expected: list[dict[str, str]]
) -> dict[str, Any]:
    return {
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series.items()],
        "alert_rule_test": [
            {
                "eval_time": at,
                "alertname": alert,
                "exp_alerts": [{"exp_labels": labels} for labels in expected],
            }
        ],
    }


# Each alert fires on the series that should trip it and not on its neighbours.
ALERT_CASES = [
    _case(
        {
            'cairnq_queue_oldest_queued_age_seconds{instance="a",queue="email"}': "400x30",
            'cairnq_queue_oldest_queued_age_seconds{instance="b",queue="email"}': "100x30",
            'cairnq_queue_oldest_queued_age_seconds{instance="a",queue="fast"}': "10x30",
        },
        "CairnqQueueBacklog",
        "6m",
        [{"severity": "warning", "queue": "email"}],
    ),
    _case(
        {
            'cairnq_queue_oldest_queued_age_seconds{instance="a",queue="email"}': "400x30",
        },
        "CairnqQueueBacklog",
        "4m",
        [],
    ),
    _case(
        {
            'cairnq_leases_expired{instance="a",queue="email"}': "2x30",
            'cairnq_leases_expired{instance="a",queue="default"}': "0x30",
        },
        "CairnqLeasesNotRecovered",
        "11m",
        [{"severity": "warning", "queue": "email"}],
    ),
    _case(
        {
            'cairnq_tasks_failed_total{instance="a",queue="email",reason="error"}': "0+3x40",
            'cairnq_tasks_started_total{instance="a",queue="email"}': "0+10x40",
            'cairnq_tasks_failed_total{instance="a",queue="default",reason="error"}': "0+1x40",
            'cairnq_tasks_started_total{instance="a",queue="default"}': "0+10x40",
        },
        "CairnqHighFailureRate",
        "25m",
        [{"severity": "warning", "queue": "email"}],
    ),
    _case(
        {
            'cairnq_group_state{instance="a",group="mail",state="fatal"}': "1x10",
            'cairnq_group_state{instance="a",group="mail",state="running"}': "0x10",
            'cairnq_group_state{instance="a",group="default",state="running"}': "1x10",
            'cairnq_group_state{instance="a",group="default",state="crashloop"}': "0x10",
        },
        "CairnqGroupUnhealthy",
        "2m",
        [{"severity": "critical", "instance": "a", "group": "mail", "state": "fatal"}],
    ),
    _case(
        {
            'cairnq_children{instance="a",group="mail",state="ready"}': "1x20",
            'cairnq_children{instance="a",group="mail",state="backoff"}': "1x20",
            'cairnq_children_desired{instance="a",group="mail"}': "2x20",
            'cairnq_children{instance="a",group="default",state="ready"}': "4x20",
            'cairnq_children_desired{instance="a",group="default"}': "4x20",
        },
        "CairnqPoolBelowSize",
        "11m",
        [{"severity": "warning", "instance": "a", "group": "mail"}],
    ),
    # promtool's clock starts at the epoch, so time() equals the eval time.
    _case(
        {'cairnq_purge_last_success_timestamp_seconds{instance="a"}': "0x60"},
        "CairnqPurgeStale",
        "50m",
        [{"severity": "warning"}],
    ),
    _case(
        {
            'cairnq_purge_last_success_timestamp_seconds{instance="a"}': "0x60",
            # The other host purges every minute: max() hears it, so nothing fires.
            'cairnq_purge_last_success_timestamp_seconds{instance="b"}': "0+60x60",
        },
        "CairnqPurgeStale",
        "50m",
        [],
    ),
    _case(
        {
            'cairnq_config_last_reload_successful{instance="a"}': "1 1 0 0 0",
            'cairnq_config_last_reload_successful{instance="b"}': "1x5",
        },
        "CairnqConfigReloadFailed",
        "3m",
        [{"severity": "warning", "instance": "a"}],
    ),
    _case(
        {'cairnq_db_up{instance="a"}': "0x10", 'cairnq_db_up{instance="b"}': "1x10"},
        "CairnqDatabaseDown",
        "3m",
        [{"severity": "critical", "instance": "a"}],
    ),
    _case({'cairnq_db_up{instance="a"}': "0x10"}, "CairnqDatabaseDown", "1m", []),
    # Host a's children count full-disk errors; b's count other kinds only.
    _case(
        {
            'cairnq_db_errors_total{instance="a",component="child",kind="full"}': "0+7x10",
            'cairnq_db_errors_total{instance="b",component="child",kind="busy"}': "0+7x10",
            'cairnq_db_errors_total{instance="b",component="child",kind="full"}': "0x10",
        },
        "CairnqDatabaseFull",
        "4m",
        [{"severity": "critical", "instance": "a"}],
    ),
    # A 10-minute schedule stuck since the epoch trips past 20 minutes (+5m for); a
    # per-minute one that fires every minute does not.
    _case(
        {
            'cairnq_schedule_last_fire_timestamp_seconds{instance="a",schedule="nightly"}': "0x60",
            'cairnq_schedule_period_seconds{instance="a",schedule="nightly"}': "600x60",
            'cairnq_schedule_last_fire_timestamp_seconds{instance="a",schedule="tick"}': "0+60x60",
            'cairnq_schedule_period_seconds{instance="a",schedule="tick"}': "60x60",
        },
        "CairnqScheduleSilent",
        "30m",
        [{"severity": "warning", "schedule": "nightly"}],
    ),
    _case(
        {
            'cairnq_schedule_last_fire_timestamp_seconds{instance="a",schedule="nightly"}': "0x60",
            # Another host (the leader) saw it fire: max() hears it.
            'cairnq_schedule_last_fire_timestamp_seconds{instance="b",schedule="nightly"}': (
                "0+60x60"
            ),
            'cairnq_schedule_period_seconds{instance="a",schedule="nightly"}': "600x60",
        },
        "CairnqScheduleSilent",
        "30m",
        [],
    ),
]


def test_alerts_fire_on_synthetic_series(promtool: str, tmp_path: Path) -> None:
    # Annotations are templated prose; drop them so the cases pin only expr, for and labels.
    document = yaml.safe_load(ALERTS.read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(document))
    tests = {"rule_files": ["alerts.yaml"], "evaluation_interval": "1m", "tests": ALERT_CASES}
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(tests))
    proc = _run([promtool, "test", "rules", "alerts_test.yaml"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
