"""Flow-control limits in the dashboard over real HTTP (`cairnqd dashboard -c FILE`
reading the limits of its config file), on SQLite and Postgres: the overview's Limits
section, a queue marked "throttled by" while a full budget holds its due tasks back, the
warning for a task running outside a limit, and a waiting task's page saying which
budget it waits for; once room comes back, the mark and the reason are gone."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cairnqd.limits import parse_limits
from cairnqd.models import Task
from tests.dashboard.conftest import Http, dashboard_config, dashboard_port
from tests.dashboard.standalone import Standalone
from tests.support.cli import cli
from tests.support.daemon import Daemon, base_config, write_config
from tests.support.databases import make_store
from tests.support.harness import database_section
from tests.support.waiting import wait_for

LIMITS = {
    "smtp": {"queues": ["email"], "concurrency": 2},
    "tenant": {"queues": ["jobs"], "concurrency": 1, "partition_by": "payload.t"},
}


@pytest.fixture
def standalone() -> Iterator[list[Standalone]]:
    started: list[Standalone] = []
    yield started
    for process in started:
        process.stop()


def _store_call(dialect: str, target: str, work: Any) -> Any:
    async def act() -> Any:
        store = make_store(dialect, target)
        await store.connect()
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(act())


def _queue_row(page: str, queue: str) -> str:
    start = page.index(f">{queue}</a></th>")
    return page[start : page.index("</tr>", start)]


def test_limits_on_the_overview_and_the_task_page(
    tmp_path: Path, dialect: str, db_target: str, standalone: list[Standalone]
) -> None:
    config = base_config(tmp_path, database_section(dialect, db_target), {"g": {"queues": ["x"]}})
    config["limits"] = LIMITS
    config["dashboard"] = {"listen": "127.0.0.1:0", "refresh": "250ms"}
    path = write_config(tmp_path, config)
    assert cli(path, "migrate").returncode == 0

    async def hold(store: Any) -> dict[str, Any]:
        """What a cairnqd worker with these limits would claim, kept running; one more
        task claimed by a worker that knows no limit; the rest waits."""
        mail = [await store.submit(name="send", queue="email") for _ in range(4)]
        jobs = [await store.submit(name="run", queue="jobs", payload={"t": t})
                for t in ("acme", "acme", "<globex>")]  # fmt: skip
        (outside,) = await store.claim(queues=["email"], worker_id="sdk", limit=1, lease_ms=600_000)
        store.use_limits(parse_limits(LIMITS))
        kept = await store.claim(
            queues=["email", "jobs"], worker_id="w", limit=10, lease_ms=600_000
        )
        running = {t.id for t in [outside, *kept]}
        return {
            "outside": outside,
            "kept": kept,
            "mail_waiting": next(t for t in mail if t.id not in running),
            "acme_waiting": next(t for t in jobs if t.id not in running),
        }

    held = _store_call(dialect, db_target, hold)
    # Two of email (one on SQLite, which counts the task the SDK runs against the
    # limit), acme and <globex>: smtp is full either way.
    assert len(held["kept"]) == (3 if dialect == "sqlite" else 4)
    process = Standalone(path)
    standalone.append(process)
    http = Http(process.port())

    page = http.get("/").text
    assert "<h2>Limits</h2>" in page
    assert "throttled by smtp" in _queue_row(page, "email")
    assert "throttled by tenant" in _queue_row(page, "jobs")
    assert '<td class="num">2/2</td>' in page  # smtp: both its slots taken
    assert "&lt;globex&gt;" in page and "<globex>" not in page
    assert "Tasks running outside a limit" in page
    assert f'href="/task/{held["outside"].id}"' in page and "claimed by worker sdk" in page

    mail_page = http.get(f"/task/{held['mail_waiting'].id}").text
    assert "waiting for room in limit smtp: 2/2 running" in mail_page
    acme_page = http.get(f"/task/{held['acme_waiting'].id}").text
    assert "waiting for room in limit tenant (partition acme): 1/1 running" in acme_page
    running_page = http.get(f"/task/{held['kept'][0].id}").text
    assert "Waiting for room" not in running_page

    async def settle(store: Any) -> None:
        tasks: list[Task] = [held["outside"], *held["kept"]]
        for task in tasks:
            await store.complete(task_id=task.id, worker_id=task.worker_id, result=None)

    _store_call(dialect, db_target, settle)

    def overview_clear() -> bool:
        text = http.get("/").text
        return "throttled by" not in text and "Tasks running outside a limit" not in text

    wait_for("the overview to show room again", overview_clear, timeout=30)
    page = http.get("/").text
    assert "<h2>Limits</h2>" in page  # still configured: the section stays
    for task in ("mail_waiting", "acme_waiting"):
        assert "Waiting for room" not in http.get(f"/task/{held[task].id}").text


def test_the_daemons_own_dashboard_shows_its_limits(tmp_path: Path) -> None:
    """The dashboard a daemon serves takes the limits of the daemon's config."""
    target = str(tmp_path / "tasks.db")
    config = dashboard_config(tmp_path, "sqlite", target)
    config["limits"] = {"smtp": LIMITS["smtp"]}  # on a queue no group serves
    daemon = Daemon(tmp_path, config)
    try:
        daemon.start()
        http = Http(dashboard_port(daemon))
        http.login()

        async def hold(store: Any) -> None:
            for _ in range(3):
                await store.submit(name="send", queue="email")
            store.use_limits(parse_limits(config["limits"]))
            await store.claim(queues=["email"], worker_id="w", limit=10, lease_ms=600_000)

        _store_call("sqlite", target, hold)

        def marked() -> bool:
            page = http.get("/").text
            return ">email</a></th>" in page and "throttled by smtp" in _queue_row(page, "email")

        wait_for("the email queue marked throttled", marked, timeout=30)
        assert "<h2>Limits</h2>" in http.get("/").text
    finally:
        daemon.stop()


def test_no_limits_no_section(tmp_path: Path, standalone: list[Standalone]) -> None:
    target = str(tmp_path / "t.db")
    config = base_config(tmp_path, database_section("sqlite", target), {"g": {"queues": ["x"]}})
    config["dashboard"] = {"listen": "127.0.0.1:0"}
    path = write_config(tmp_path, config)
    assert cli(path, "migrate").returncode == 0
    process = Standalone(path)
    standalone.append(process)
    page = Http(process.port()).get("/")
    assert page.status == 200 and "<h2>Queues</h2>" in page.text
    assert "<h2>Limits</h2>" not in page.text
