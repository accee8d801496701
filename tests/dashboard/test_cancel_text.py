"""The Cancel button says what a cancel does and when: at once for a queued task; for
a running one, the group's cancel_grace before its handler is cancelled and again
before its worker process is replaced."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from cairnqd.config import load_config
from cairnqd.dashboard.auth import Session
from cairnqd.dashboard.pages import Viewer, cancel_grace_of, task_page
from cairnqd.models import Task

ACTING = Viewer(
    session=Session(who="ops", nonce="n", csrf="c"),
    login_required=True,
    actions=True,
    refresh_ms=1000,
)

CONFIG = """\
version: 1
database: {path: ./t.db}
handlers: [cairnqd.demo:registry]
groups:
  mail: {queues: [mail, shared], cancel_grace: 30s}
  bulk: {queues: [bulk, shared]}
  more: {queues: [bulk]}
"""


def test_the_grace_of_the_groups_that_claim_a_queue(tmp_path: Path) -> None:
    path = tmp_path / "cairnq.yaml"
    path.write_text(CONFIG)
    config = load_config(path, env={})
    assert cancel_grace_of(config, "mail") == timedelta(seconds=30)
    assert cancel_grace_of(config, "bulk") == timedelta(seconds=10)  # two groups, one value
    assert cancel_grace_of(config, "shared") is None  # they differ
    assert cancel_grace_of(config, "nobody") is None


def test_the_cancel_confirmation_of_a_running_task() -> None:
    task = Task(id="task_1", name="send", queue="mail", status="running")
    page = str(task_page(task, None, ACTING, cancel_grace=timedelta(seconds=30)))
    assert 'action="/actions/task-cancel"' in page
    assert "If it has not returned 30s later, an async handler is cancelled" in page
    assert "one still running 30s after that (a sync handler) has its worker process" in page
    assert "ends canceled and is not retried" in page
    unknown = str(task_page(task, None, ACTING))
    assert "returned its group&#x27;s cancel_grace later" in unknown


def test_the_cancel_confirmation_of_a_queued_task() -> None:
    task = Task(id="task_2", name="send", queue="mail", status="queued")
    page = str(task_page(task, None, ACTING, cancel_grace=timedelta(seconds=30)))
    assert "It is queued: it ends canceled at once and never runs." in page
    assert "30s" not in page
