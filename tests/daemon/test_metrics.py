"""cairnqd.daemon.parent.metrics over real HTTP: scrapes of a live registry against real databases.

Every test serves on 127.0.0.1 port 0 and reads `/metrics` with urllib, as Prometheus
would; the database collector runs its own thread and store, so the test's store only
sets up rows.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cairnqd.config import Config
from cairnqd.daemon.child.tally import TaskTally
from cairnqd.daemon.parent.metrics import METRIC_NAMES, OTHER_QUEUE, Metrics
from cairnqd.daemon.wire.messages import PROTOCOL_VERSION, MessageError, decode_child, encode
from cairnqd.models import STATUSES
from cairnqd.store.base import TaskStore
from cairnqd.store.sqlite import SQLiteStore
from tests.faults.proxy import proxy_to_postgres
from tests.support.databases import make_store
from tests.support.harness import daemon_config
from tests.support.monitoring_files import (
    alert_rules,
    dashboard_queries,
    load_dashboard,
    metric_names,
)
from tests.support.waiting import wait_for_async

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# -- helpers ------------------------------------------------------------------------------------


def scrape(port: int, path: str = "/metrics") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: Samples, metric: str, /, **labels: str) -> float | None:
    return found.get((metric, tuple(sorted(labels.items()))))


def family_names(text: str) -> set[str]:
    """Families as named in alerts and dashboards: counters with `_total`."""
    return {
        f"{f.name}_total" if f.type == "counter" else f.name
        for f in text_string_to_metric_families(text)
    }


@pytest.fixture
def served() -> Iterator[list[Metrics]]:
    """Closes every Metrics a test serves, even when it fails."""
    opened: list[Metrics] = []
    yield opened
    for metrics in opened:
        metrics.close()


def serve(opened: list[Metrics], metrics: Metrics, **kwargs: Any) -> int:
    opened.append(metrics)
    return metrics.serve("127.0.0.1", 0, **kwargs)


async def claim_one(store: TaskStore, queue: str, worker_id: str, lease_ms: int = 60_000) -> str:
    (task,) = await store.claim(queues=[queue], worker_id=worker_id, lease_ms=lease_ms)
    return task.id


# -- the database gauges --------------------------------------------------------------------------


async def test_tasks_gauge_equals_store_stats(
    dialect: str, db_target: str, tmp_path: Path, served: list[Metrics]
) -> None:
    store = make_store(dialect, db_target)
    await store.connect()
    try:
        for queue, n in (("default", 3), ("email", 2), ("reports", 1)):
            for _ in range(n):
                await store.submit(name="demo.echo", queue=queue)
        await claim_one(store, "default", "w-test")
        done = await claim_one(store, "email", "w-test")
        await store.complete(task_id=done, worker_id="w-test", result=None)
        await claim_one(store, "reports", "w-test", lease_ms=1)  # expires at once
        await asyncio.sleep(0.05)
        expected = await store.stats()
    finally:
        await store.close()

    config = daemon_config(tmp_path, dialect, db_target)
    port = serve(served, Metrics(config))
    status, text = await asyncio.to_thread(scrape, port)
    assert status == 200
    found = samples(text)
    for queue, counts in expected.items():
        for status_name, n in counts.items():
            assert value(found, "cairnq_tasks", queue=queue, status=status_name) == n
    tasks = {k for k in found if k[0] == "cairnq_tasks"}
    assert {dict(labels)["queue"] for _, labels in tasks} == {"default", "email", "reports"}
    assert len(tasks) == 3 * len(STATUSES)
    assert value(found, "cairnq_leases_expired", queue="reports") == 1
    assert value(found, "cairnq_leases_expired", queue="default") == 0
    default_age = value(found, "cairnq_queue_oldest_queued_age_seconds", queue="default")
    assert default_age is not None and default_age > 0
    # Its only task is running: nothing waits.
    assert value(found, "cairnq_queue_oldest_queued_age_seconds", queue="reports") == 0
    assert value(found, "cairnq_db_up") == 1
    assert value(found, "cairnq_db_scrape_errors_total") == 0


async def test_tasks_waiting_for_dependencies_are_counted_apart_from_the_backlog(
    dialect: str, db_target: str, tmp_path: Path, served: list[Metrics]
) -> None:
    store = make_store(dialect, db_target)
    await store.connect()
    try:
        parent = await store.submit(name="demo.echo", queue="default")
        for _ in range(3):
            await store.submit(name="demo.echo", queue="email", after=[parent])
        await store.submit(name="demo.echo", queue="email")
    finally:
        await store.close()

    port = serve(served, Metrics(daemon_config(tmp_path, dialect, db_target)))
    found = samples((await asyncio.to_thread(scrape, port))[1])
    # stats counts 4 queued in email; 3 of them wait on a parent that has not run.
    assert value(found, "cairnq_tasks", queue="email", status="queued") == 1
    assert value(found, "cairnq_tasks_waiting", queue="email") == 3
    assert value(found, "cairnq_tasks", queue="default", status="queued") == 1
    assert value(found, "cairnq_tasks_waiting", queue="default") == 0


async def test_configured_queue_without_rows_shows_zeros(
    sqlite_path: str, tmp_path: Path, served: list[Metrics]
) -> None:
    port = serve(served, Metrics(daemon_config(tmp_path, "sqlite", sqlite_path)))
    found = samples((await asyncio.to_thread(scrape, port))[1])
    for status in STATUSES:
        assert value(found, "cairnq_tasks", queue="email", status=status) == 0
    assert value(found, "cairnq_queue_oldest_queued_age_seconds", queue="email") == 0


class CountingStore(SQLiteStore):
    """A real SQLite store that counts statistics queries and can be slowed down."""

    calls = 0
    delay_s = 0.0

    async def stats(self, queue: str | None = None) -> dict[str, dict[str, int]]:
        type(self).calls += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return await super().stats(queue)


def counting_store_class(delay_s: float = 0.0) -> type[CountingStore]:
    """A fresh subclass per test, so call counts never leak between tests."""
    return type("Counting", (CountingStore,), {"calls": 0, "delay_s": delay_s})


async def test_ttl_reuses_one_query(
    sqlite_path: str, tmp_path: Path, served: list[Metrics]
) -> None:
    store_class = counting_store_class()
    config = daemon_config(
        tmp_path, "sqlite", sqlite_path, metrics={"listen": "127.0.0.1:0", "stats_ttl": "1h"}
    )
    metrics = Metrics(config, store_factory=lambda: store_class(sqlite_path))
    port = serve(served, metrics)
    first = samples((await asyncio.to_thread(scrape, port))[1])
    store = SQLiteStore(sqlite_path)
    async with store:
        await store.submit(name="demo.echo", queue="default")
    second = samples((await asyncio.to_thread(scrape, port))[1])
    assert store_class.calls == 1
    assert metrics.database.queries == 1
    # Within the ttl the cached numbers stand, the new row notwithstanding.
    assert value(second, "cairnq_tasks", queue="default", status="queued") == 0
    assert first == second


async def test_concurrent_scrapes_share_the_query_in_flight(
    sqlite_path: str, tmp_path: Path, served: list[Metrics]
) -> None:
    store_class = counting_store_class(delay_s=0.5)
    config = daemon_config(tmp_path, "sqlite", sqlite_path)  # stats_ttl 0: every scrape asks
    metrics = Metrics(config, store_factory=lambda: store_class(sqlite_path))
    port = serve(served, metrics)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: scrape(port), range(8)))
    assert all(status == 200 for status, _ in results)
    assert all(value(samples(text), "cairnq_db_up") == 1 for _, text in results)
    assert store_class.calls == metrics.database.queries
    assert store_class.calls <= 2  # one query, or two if a scrape arrived just after it


def _bad_target(dialect: str, tmp_path: Path) -> str:
    if dialect == "sqlite":
        path = tmp_path / "not-a-db.db"
        path.write_bytes(b"this is not a SQLite database, just bytes" * 100)
        return str(path)
    return "postgresql://postgres@127.0.0.1:1/postgres?connect_timeout=1"


@pytest.mark.timing
@pytest.mark.parametrize("dialect_name", ["sqlite", "postgres"])
def test_db_down_omits_db_families(
    dialect_name: str, tmp_path: Path, served: list[Metrics]
) -> None:
    target = _bad_target(dialect_name, tmp_path)
    # The config loads (the file exists; a DSN is not dialled); the collector then fails.
    database = {"path": target} if dialect_name == "sqlite" else {"dsn": target}
    config = daemon_config(
        tmp_path, dialect_name, target, database={**database, "connect_timeout": "1s"}
    )
    port = serve(served, Metrics(config))
    started = time.monotonic()
    status, text = scrape(port)
    assert time.monotonic() - started < 3
    assert status == 200
    names = family_names(text)
    assert "cairnq_tasks" not in names
    assert "cairnq_queue_oldest_queued_age_seconds" not in names
    assert "cairnq_leases_expired" not in names
    found = samples(text)
    assert value(found, "cairnq_db_up") == 0
    errors = value(found, "cairnq_db_scrape_errors_total")
    assert errors is not None and errors >= 1
    # The process families are still there.
    assert "cairnq_tasks_started_total" in names


@pytest.mark.timing
def test_slow_database_times_out_within_budget(
    sqlite_path: str, tmp_path: Path, served: list[Metrics]
) -> None:
    store_class = counting_store_class(delay_s=5.0)
    # A long ttl, so the second scrape reuses the failed (or still running) query
    # whichever way the race between the two 2 s timers goes.
    config = daemon_config(
        tmp_path, "sqlite", sqlite_path, metrics={"listen": "127.0.0.1:0", "stats_ttl": "1h"}
    )
    metrics = Metrics(config, store_factory=lambda: store_class(sqlite_path))
    port = serve(served, metrics)
    started = time.monotonic()
    first = samples(scrape(port)[1])
    assert time.monotonic() - started < 3
    assert value(first, "cairnq_db_up") == 0
    assert value(first, "cairnq_tasks", queue="default", status="queued") is None
    second = samples(scrape(port)[1])
    # The stuck query is shared, not repeated, and counted as one error.
    assert metrics.database.queries == 1
    assert value(second, "cairnq_db_scrape_errors_total") == 1


# -- counters from the children's pipe events ---------------------------------------------------


HEARTBEAT: dict[str, Any] = {
    "t": "hb", "rss": 1, "state": "run", "executing": 0, "held": 0, "lag_s": 0.0,
    "overdue": [], "longest": None,
}  # fmt: skip


def feed(metrics: Metrics, group: str, slot: int, event: dict[str, Any], child: str = "") -> bool:
    """Hand `event` to the metrics as the supervisor does: decoded from its JSON line.
    False when the decoder refuses it (the supervisor counts and logs those)."""
    try:
        message = decode_child(json.dumps(event).encode())
    except MessageError:
        return False
    metrics.record_event(group, slot, message, child=child)
    return True


def tally_event(tally: TaskTally) -> dict[str, Any]:
    """The `tally` message a child would send now, as its JSON object."""
    event: dict[str, Any] = json.loads(encode(tally.snapshot()))
    return event


def _task_events(metrics: Metrics, config: Config) -> None:
    # Counted by the child's own tally (as a child does), sent twice: tallies are
    # cumulative, so the second carries the first's counts again.
    tally = TaskTally(config.metrics.duration_buckets, config.metrics.wait_buckets)
    for queue, name, wait_s in [
        ("default", "a", 0.2), ("default", "a", 40), ("email", "b", 0), ("email", "b", 0),
        ("email", "b", 0),
    ]:  # fmt: skip
        tally.started(queue, name, wait_s)
    tally.ended("default", "a", "succeeded", "", 0.01)
    tally.ended("default", "a", "retried", "handler_code_42", 2)
    assert feed(metrics, "default", 1, tally_event(tally), child="w1")
    tally.ended("email", "b", "failed", "max_run_exceeded", 700)
    tally.ended("email", "b", "lease_lost", "", 1)
    tally.ended("email", "b", "canceled", "", 1)
    tally.started("default", "a", 0.1)
    tally.ended("default", "a", "succeeded", "", 0.02)
    events: list[dict[str, Any]] = [
        tally_event(tally),
        {"t": "dberr", "kind": "busy"},
        {"t": "dberr", "kind": "something-new"},
        {
            **HEARTBEAT,
            "rss": 123456789,
            "executing": 3,
            "held": 7,
            "lag_s": 0.5,
            "listen_deaf": True,
        },
        {"t": "bye", "reason": "drain"},
    ]
    for event in events:
        assert feed(metrics, "default", 1, event, child="w1"), event
    # What the supervisor's decoder refuses never reaches the counters.
    assert not feed(metrics, "default", 1, {"t": "tally", "counts": [{"queue": "x"}]})


def test_task_counters_from_events(sqlite_path: str, tmp_path: Path, served: list[Metrics]) -> None:
    config = daemon_config(tmp_path, "sqlite", sqlite_path)
    metrics = Metrics(config)
    _task_events(metrics, config)
    found = samples(scrape(serve(served, metrics))[1])
    assert value(found, "cairnq_tasks_started_total", queue="default") == 3
    assert value(found, "cairnq_tasks_started_total", queue="email") == 3
    assert value(found, "cairnq_tasks_succeeded_total", queue="default") == 2
    assert value(found, "cairnq_tasks_retried_total", queue="default") == 1
    # A handler's own code is no label value: it counts as "error".
    assert value(found, "cairnq_tasks_failed_total", queue="default", reason="error") == 1
    assert value(found, "cairnq_tasks_failed_total", queue="email", reason="max_run") == 1
    assert value(found, "cairnq_tasks_failed_total", queue="email", reason="lease_lost") == 1
    assert value(found, "cairnq_tasks_failed_total", queue="email", reason="worker_lost") == 0
    assert value(found, "cairnq_tasks_canceled_total", queue="email") == 1
    assert value(found, "cairnq_task_duration_seconds_count", queue="email") == 3
    # Buckets are cumulative: the 700 s attempt lands above 600.
    assert value(found, "cairnq_task_duration_seconds_bucket", queue="email", le="600.0") == 2
    assert value(found, "cairnq_task_duration_seconds_bucket", queue="email", le="1800.0") == 3
    assert value(found, "cairnq_task_queue_wait_seconds_bucket", queue="default", le="30.0") == 2
    assert value(found, "cairnq_task_queue_wait_seconds_count", queue="default") == 3
    assert value(found, "cairnq_db_errors_total", component="child", kind="busy") == 1
    assert value(found, "cairnq_db_errors_total", component="child", kind="other") == 1
    assert value(found, "cairnq_db_errors_total", component="maintenance", kind="busy") == 0
    assert value(found, "cairnq_child_resident_memory_bytes", group="default", slot="1") == (
        123456789
    )
    child = {"group": "default", "slot": "1"}
    assert value(found, "cairnq_child_tasks", **child, state="executing") == 3
    assert value(found, "cairnq_child_tasks", **child, state="held") == 7
    assert value(found, "cairnq_child_loop_lag_seconds", **child) == 0.5
    assert value(found, "cairnq_child_listen_deaf", **child) == 1
    metrics.remove_child("default", 1)
    after = samples(scrape(metrics.port or 0)[1])
    assert value(after, "cairnq_child_resident_memory_bytes", group="default", slot="1") is None
    assert value(after, "cairnq_child_tasks", **child, state="held") is None


def test_task_name_label(sqlite_path: str, tmp_path: Path, served: list[Metrics]) -> None:
    config = daemon_config(
        tmp_path,
        "sqlite",
        sqlite_path,
        metrics={"listen": "127.0.0.1:0", "task_name_label": True},
    )
    metrics = Metrics(config)
    _task_events(metrics, config)
    found = samples(scrape(serve(served, metrics))[1])
    assert value(found, "cairnq_tasks_started_total", queue="email", name="b") == 3
    assert value(found, "cairnq_tasks_failed_total", queue="email", reason="max_run", name="b") == 1
    # Histograms stay per queue.
    assert value(found, "cairnq_task_duration_seconds_count", queue="email") == 3


def test_supervisor_gauges(sqlite_path: str, tmp_path: Path, served: list[Metrics]) -> None:
    metrics = Metrics(daemon_config(tmp_path, "sqlite", sqlite_path), generation=3)
    port = serve(served, metrics)
    found = samples(scrape(port)[1])
    assert value(found, "cairnq_children_desired", group="default") == 2
    assert value(found, "cairnq_children", group="default", state="ready") == 0
    assert value(found, "cairnq_child_restarts_total", group="default", reason="crash") == 0
    assert value(found, "cairnq_config_generation") == 3
    assert value(found, "cairnq_config_last_reload_successful") == 1

    metrics.set_children("default", {"ready": 1, "backoff": 1, "exited": 5})
    metrics.set_group_state("default", "crashloop")
    metrics.child_restart("default", "signal")
    metrics.reload_result(False, 4)
    found = samples(scrape(port)[1])
    assert value(found, "cairnq_children", group="default", state="ready") == 1
    assert value(found, "cairnq_children", group="default", state="backoff") == 1
    assert value(found, "cairnq_children", group="default", state="exited") is None
    assert value(found, "cairnq_group_state", group="default", state="crashloop") == 1
    assert value(found, "cairnq_group_state", group="default", state="running") == 0
    assert value(found, "cairnq_child_restarts_total", group="default", reason="signal") == 1
    assert value(found, "cairnq_config_last_reload_successful") == 0
    assert value(found, "cairnq_config_generation") == 3
    with pytest.raises(ValueError):
        metrics.set_group_state("default", "sleepy")
    metrics.child_restart("default", "protocol")  # not an enum value: counted as a crash
    found = samples(scrape(port)[1])
    assert value(found, "cairnq_child_restarts_total", group="default", reason="crash") == 1
    assert value(found, "cairnq_child_restarts_total", group="default", reason="protocol") is None


def test_reload_drops_removed_groups_and_queues(
    sqlite_path: str, tmp_path: Path, served: list[Metrics]
) -> None:
    metrics = Metrics(daemon_config(tmp_path, "sqlite", sqlite_path))
    port = serve(served, metrics)
    feed(metrics, "default", 0, HEARTBEAT)
    new = daemon_config(
        tmp_path,
        "sqlite",
        sqlite_path,
        groups={"mail": {"queues": ["email", "bulk"]}},
    )
    metrics.apply_config(new)
    found = samples(scrape(port)[1])
    assert value(found, "cairnq_children_desired", group="default") is None
    assert value(found, "cairnq_child_resident_memory_bytes", group="default", slot="0") is None
    assert value(found, "cairnq_children_desired", group="mail") == 1
    assert value(found, "cairnq_tasks_started_total", queue="default") is None
    assert value(found, "cairnq_tasks_started_total", queue="bulk") == 0
    assert value(found, "cairnq_tasks_started_total", queue="email") == 0


# -- cardinality ----------------------------------------------------------------------------------


async def test_unknown_queues_beyond_twenty_are_other(
    sqlite_path: str, tmp_path: Path, served: list[Metrics]
) -> None:
    store = SQLiteStore(sqlite_path)
    async with store:
        await store.submit_many(
            [{"name": "demo.echo", "queue": f"tenant-{i:03d}"} for i in range(100)]
        )
    metrics = Metrics(daemon_config(tmp_path, "sqlite", sqlite_path))
    found = samples((await asyncio.to_thread(scrape, serve(served, metrics)))[1])
    queues = {dict(labels)["queue"] for name, labels in found if name == "cairnq_tasks"}
    unknown = {q for q in queues if q.startswith("tenant-")}
    assert unknown == {f"tenant-{i:03d}" for i in range(20)}
    assert queues == unknown | {"default", "email", OTHER_QUEUE}
    assert value(found, "cairnq_tasks", queue=OTHER_QUEUE, status="queued") == 80
    assert value(found, "cairnq_tasks", queue="tenant-000", status="queued") == 1
    # Pipe events share the same bound: a queue past the twenty is `_other` there too.
    tally = TaskTally((1.0,), (1.0,))
    for queue in ("tenant-099", "tenant-005"):
        tally.started(queue, "x", 0)
    assert feed(metrics, "default", 0, tally_event(tally))
    found = samples((await asyncio.to_thread(scrape, metrics.port or 0))[1])
    assert value(found, "cairnq_tasks_started_total", queue=OTHER_QUEUE) == 1
    assert value(found, "cairnq_tasks_started_total", queue="tenant-005") == 1


# -- the endpoint ---------------------------------------------------------------------------------


def test_healthz_follows_health(sqlite_path: str, tmp_path: Path, served: list[Metrics]) -> None:
    report: list[Any] = [lambda: (True, {"status": "ok"})]

    def broken() -> Any:
        raise RuntimeError("boom")

    metrics = Metrics(daemon_config(tmp_path, "sqlite", sqlite_path))
    port = serve(served, metrics, health=lambda: report[0]())
    assert scrape(port, "/healthz") == (200, '{\n  "status": "ok"\n}\n')
    report[0] = lambda: (False, {"status": "unhealthy", "problems": ["group g is FATAL: x"]})
    status, body = scrape(port, "/healthz")
    assert status == 503 and json.loads(body)["problems"] == ["group g is FATAL: x"]
    report[0] = broken  # a bug in the check is a failed check, not a dead endpoint
    status, body = scrape(port, "/healthz")
    assert status == 503 and json.loads(body)["problems"] == ["health check failed: boom"]
    assert scrape(port, "/nope")[0] == 404


def test_close_frees_the_port(sqlite_path: str, tmp_path: Path) -> None:
    metrics = Metrics(daemon_config(tmp_path, "sqlite", sqlite_path))
    port = metrics.serve("127.0.0.1", 0)
    assert port > 0 and metrics.port == port
    assert scrape(port)[0] == 200
    metrics.close()
    metrics.close()  # idempotent
    with pytest.raises(urllib.error.URLError):
        scrape(port)


def test_scrape_has_every_family_and_no_created(
    sqlite_path: str, tmp_path: Path, served: list[Metrics]
) -> None:
    metrics = Metrics(daemon_config(tmp_path, "sqlite", sqlite_path))
    assert feed(metrics, "default", 0, HEARTBEAT)
    status, text = scrape(serve(served, metrics))
    assert status == 200
    assert family_names(text) == set(METRIC_NAMES)
    assert "_created" not in text
    types = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert types["cairnq_task_duration_seconds"] == "histogram"
    assert types["cairnq_tasks"] == "gauge"
    assert types["cairnq_db_scrape_errors"] == "counter"
    info = samples(text)
    (build,) = [labels for name, labels in info if name == "cairnq_build_info"]
    assert dict(build)["protocol"] == "1" and dict(build)["backend"] == "sqlite"
    assert dict(build)["pipe_protocol"] == str(PROTOCOL_VERSION)


def test_dashboard_and_alert_names_exist_in_a_live_scrape(
    sqlite_path: str, tmp_path: Path, served: list[Metrics]
) -> None:
    metrics = Metrics(daemon_config(tmp_path, "sqlite", sqlite_path))
    assert feed(metrics, "default", 0, HEARTBEAT)
    exposed = family_names(scrape(serve(served, metrics))[1])
    used: set[str] = set()
    for rule in alert_rules():
        used |= metric_names(rule["expr"])
    for query in dashboard_queries(load_dashboard()):
        used |= metric_names(query)
    assert used and used <= exposed, used - exposed


# -- metrics.queue_stats: leader --------------------------------------------------------------

_DB_FAMILIES = (
    "cairnq_tasks",
    "cairnq_queue_oldest_queued_age_seconds",
    "cairnq_leases_expired",
)


def _leader_config(tmp_path: Path, dialect: str, target: str, queue_stats: str) -> Config:
    metrics = {"listen": "127.0.0.1:0", "stats_ttl": "0s", "queue_stats": queue_stats}
    return daemon_config(tmp_path, dialect, target, metrics=metrics)


def _exports_queue_stats(port: int) -> bool:
    """Whether one scrape has the per-queue DB families; asserts the rest is there."""
    status, text = scrape(port)
    assert status == 200
    names, found = family_names(text), samples(text)
    assert value(found, "cairnq_db_up") == 1
    assert "cairnq_db_scrape_duration_seconds" in names
    assert value(found, "cairnq_db_scrape_errors_total") == 0
    present = [name in names for name in _DB_FAMILIES]
    assert all(present) or not any(present), names  # all three, or none
    if present[0]:
        assert value(found, "cairnq_tasks", queue="default", status="queued") == 1
    return present[0]


async def _seed_one_task(pg_dsn: str) -> None:
    # Migrates the fresh database too (the daemon's Postgres default is auto_migrate off).
    store = make_store("postgres", pg_dsn)
    await store.connect()
    try:
        await store.submit(name="demo.echo", queue="default")
    finally:
        await store.close()


def _stats_lock_sessions(pg_dsn: str, namespace: int) -> list[int]:
    """Backend pids holding the stats lock, from pg_locks (two-int4 form: objsubid 2)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "select pid from pg_locks where locktype = 'advisory' and granted "
            "and database = (select oid from pg_database where datname = current_database()) "
            "and classid = %s::bigint::oid and objid = 2 and objsubid = 2",
            (namespace,),
        ).fetchall()
    return [int(row[0]) for row in rows]


async def test_queue_stats_leader_one_host_exports_and_the_other_takes_over(
    pg_dsn: str, tmp_path: Path, served: list[Metrics]
) -> None:
    await _seed_one_task(pg_dsn)
    config = _leader_config(tmp_path, "postgres", pg_dsn, "leader")
    first, second = Metrics(config), Metrics(config)
    port_first, port_second = serve(served, first), serve(served, second)

    # Whoever refreshes first takes the lock; the other only reports that it is up.
    assert await asyncio.to_thread(_exports_queue_stats, port_first)
    assert not await asyncio.to_thread(_exports_queue_stats, port_second)
    # Leadership is sticky across refreshes: no flapping, one lock held once.
    for _ in range(3):
        assert await asyncio.to_thread(_exports_queue_stats, port_first)
        assert not await asyncio.to_thread(_exports_queue_stats, port_second)
    assert (first.database.leading, second.database.leading) == (True, False)
    namespace = config.database.lock_namespace
    assert len(await asyncio.to_thread(_stats_lock_sessions, pg_dsn, namespace)) == 1

    first.close()  # the leader stops: its session ends and the lock with it
    assert await asyncio.to_thread(_exports_queue_stats, port_second)  # the next refresh
    assert second.database.leading is True


@pytest.mark.timing
async def test_a_close_cuts_a_refresh_stuck_on_a_silent_database_short(
    pg_dsn: str, tmp_path: Path, served: list[Metrics]
) -> None:
    """The daemon's stop closes the collector while a refresh waits on a partitioned
    database (its query timed out and psycopg's cancel of it crosses the partition too):
    after half its time the close severs the store and the leader lock's session, and
    the collector's thread ends within the bound instead of being left behind."""
    await _seed_one_task(pg_dsn)
    with proxy_to_postgres() as proxy:
        config = _leader_config(tmp_path, "postgres", proxy.dsn(pg_dsn), "leader")
        metrics = Metrics(config)
        port = serve(served, metrics)
        assert await asyncio.to_thread(_exports_queue_stats, port)  # the lock's session is up
        proxy.blackhole()
        status, _ = await asyncio.to_thread(scrape, port)  # gives up after 2 s; the query stays
        assert status == 200
        began = time.monotonic()
        await asyncio.to_thread(metrics.database.close, 4.0)
        # Half the time, the cut's grace (1 s), the thread's end: about 3 s. Before, the
        # close waited its whole time and the thread was left running.
        assert time.monotonic() - began < 4.0
        assert not metrics.database._thread.running()
        proxy.forward()


@pytest.mark.timing
async def test_a_refresh_on_a_silent_database_ends_at_its_deadline_and_the_next_one_works(
    pg_dsn: str, tmp_path: Path, served: list[Metrics]
) -> None:
    """A statistics query that gets no answer fails at its deadline (2.5 s) by shutting
    its connection, instead of waiting on psycopg's cancel of it, which crosses the
    same partition (the refresh, which scrapes share, ended 12 s after the cut); once
    the database answers again, scrapes have fresh figures."""
    await _seed_one_task(pg_dsn)
    with proxy_to_postgres() as proxy:
        config = _leader_config(tmp_path, "postgres", proxy.dsn(pg_dsn), "all")
        metrics = Metrics(config)
        port = serve(served, metrics)
        assert await asyncio.to_thread(_exports_queue_stats, port)
        proxy.blackhole()
        cut = time.monotonic()
        status, text = await asyncio.to_thread(scrape, port)  # gives up after 2 s
        assert status == 200 and value(samples(text), "cairnq_db_up") == 0
        refresh = metrics.database._inflight
        assert refresh is not None and refresh.future is not None
        # The query's deadline (2.5 s) passes while the partition lasts.
        await wait_for_async("the stuck refresh to end", refresh.future.done, timeout=30)
        ended = time.monotonic() - cut
        proxy.forward()

        def answering() -> bool:
            status, text = scrape(port)
            return status == 200 and value(samples(text), "cairnq_db_up") == 1

        await wait_for_async("fresh figures", lambda: asyncio.to_thread(answering), timeout=60)
    assert ended < 5.0, ended


async def test_queue_stats_leader_lost_with_its_connection(
    pg_dsn: str, tmp_path: Path, served: list[Metrics]
) -> None:
    await _seed_one_task(pg_dsn)
    config = _leader_config(tmp_path, "postgres", pg_dsn, "leader")
    first, second = Metrics(config), Metrics(config)
    port_first, port_second = serve(served, first), serve(served, second)
    assert await asyncio.to_thread(_exports_queue_stats, port_first)
    assert not await asyncio.to_thread(_exports_queue_stats, port_second)

    namespace = config.database.lock_namespace
    (holder,) = await asyncio.to_thread(_stats_lock_sessions, pg_dsn, namespace)
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as admin:
        await admin.execute("select pg_terminate_backend(%s)", (holder,))
    # The backend exits a moment after the signal; only then is the lock free.
    await wait_for_async(
        "the lock's session to end",
        lambda: asyncio.to_thread(_stats_lock_sessions, pg_dsn, namespace),
        accept=lambda sessions: not sessions,
    )
    # The other host asks first and wins; the old leader finds its session dead,
    # reconnects, and the lock is taken.
    assert await asyncio.to_thread(_exports_queue_stats, port_second)
    assert not await asyncio.to_thread(_exports_queue_stats, port_first)
    assert (first.database.leading, second.database.leading) == (False, True)


async def test_queue_stats_reload_to_all_gives_the_lock_up(
    pg_dsn: str, tmp_path: Path, served: list[Metrics]
) -> None:
    await _seed_one_task(pg_dsn)
    leader = _leader_config(tmp_path, "postgres", pg_dsn, "leader")
    first, second = Metrics(leader), Metrics(leader)
    port_first, port_second = serve(served, first), serve(served, second)
    assert await asyncio.to_thread(_exports_queue_stats, port_first)
    assert not await asyncio.to_thread(_exports_queue_stats, port_second)

    first.apply_config(_leader_config(tmp_path, "postgres", pg_dsn, "all"))
    assert await asyncio.to_thread(_exports_queue_stats, port_first)  # `all`: exports anyway
    assert await asyncio.to_thread(_exports_queue_stats, port_second)  # and let go of the lock


def test_queue_stats_leader_on_sqlite_is_all(
    sqlite_path: str, tmp_path: Path, served: list[Metrics]
) -> None:
    # One SQLite file means one host: it always leads, and no lock is involved.
    config = _leader_config(tmp_path, "sqlite", sqlite_path, "leader")
    first, second = Metrics(config), Metrics(config)
    port_first, port_second = serve(served, first), serve(served, second)
    for port in (port_first, port_second):
        found = samples(scrape(port)[1])
        assert value(found, "cairnq_tasks", queue="default", status="queued") == 0
        assert value(found, "cairnq_db_up") == 1
