"""Bulk cancel and retry by filter, `list`'s new columns and "N more" line, and
`inspect --follow`: real `cairnqd` processes on both dialects."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cairnqd.errors import ErrorEnvelope
from cairnqd.store.base import TaskStore
from tests.support.cli import REPO_ENV, Terminal, cli, shell_cli
from tests.support.daemon import write_config
from tests.support.databases import make_store
from tests.support.harness import control_config
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow
T = TypeVar("T")


@pytest.fixture
def config_path(tmp_path: Path, dialect: str, db_target: str) -> Path:
    path = write_config(
        tmp_path, control_config(tmp_path, dialect, db_target, {"g": {"queues": ["a", "b"]}})
    )
    migrated = cli(path, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    return path


def on_store(dialect: str, target: str, action: Callable[[TaskStore], Awaitable[T]]) -> T:
    async def go() -> T:
        async with make_store(dialect, target) as store:
            return await action(store)

    return asyncio.run(go())


def _seed(store: TaskStore) -> Awaitable[Any]:
    many = [{"name": "x", "queue": "a"} for _ in range(1203)]
    many += [{"name": "y", "queue": "b"} for _ in range(5)]
    return store.submit_many(many)


def test_bulk_cancel_and_retry(config_path: Path, dialect: str, db_target: str) -> None:
    on_store(dialect, db_target, _seed)

    def stats() -> dict[str, dict[str, int]]:
        return json.loads(cli(config_path, "stats", "--json").stdout)  # type: ignore[no-any-return]

    dry = cli(config_path, "cancel", "--queue", "a", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.strip() == "would cancel 1203 task(s): status queued/running, queue a"
    refused = cli(config_path, "cancel", "--queue", "a")  # no terminal, no --yes
    assert refused.returncode == 64
    assert "would cancel 1203 task(s)" in refused.stderr and "--yes" in refused.stderr
    assert stats()["a"]["queued"] == 1203

    done = cli(config_path, "cancel", "--queue", "a", "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("canceled 1203 task(s)")  # three pages of 500 at most
    after = stats()
    assert after["a"]["canceled"] == 1203 and after["b"]["queued"] == 5

    none = cli(config_path, "retry", "--queue", "a", "--older-than", "1h", "--dry-run")
    assert "would retry 0 task(s)" in none.stdout
    retried = cli(config_path, "retry", "--queue", "a", "--name", "x", "--since", "1h", "--yes")
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.startswith("requeued 1203 task(s): status failed/canceled, queue a")
    assert stats()["a"]["queued"] == 1203

    both = cli(config_path, "cancel", "task_x", "--queue", "a")
    assert both.returncode == 64 and "not both" in both.stderr
    bare = cli(config_path, "cancel", "--yes")  # everything at once must be asked for
    assert bare.returncode == 64 and "need at least one filter" in bare.stderr
    wrong = cli(config_path, "retry", "--status", "queued", "--yes")
    assert wrong.returncode == 64 and "--status" in wrong.stderr
    # The single-task forms are unchanged.
    one = cli(config_path, "list", "--queue", "b", "--limit", "1", "--json")
    task_id = json.loads(one.stdout)[0]["id"]
    single = cli(config_path, "cancel", task_id)
    assert (single.returncode, single.stdout) == (0, f"{task_id} canceled\n")


async def _failed_and_progressed(store: TaskStore) -> tuple[str, str]:
    failing = await store.submit(name="boom", queue="a", max_attempts=1)
    (claimed,) = await store.claim(queues=["a"], worker_id="w1")
    assert claimed.id == failing.id
    envelope = ErrorEnvelope(
        type="ValueError", code="bad_input", message="no such user 42", retryable=False
    )
    await store.fail(task_id=failing.id, worker_id="w1", error=envelope, retryable=False)
    for _ in range(4):
        await store.submit(name="later", queue="b")
    return failing.id, ""


def test_list_shows_error_run_at_duration_and_more(
    config_path: Path, dialect: str, db_target: str
) -> None:
    failed_id, _ = on_store(dialect, db_target, _failed_and_progressed)
    shown = cli(config_path, "list", "--limit", "3")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == [
        "ID", "QUEUE", "NAME", "STATUS", "ATTEMPT", "PRIORITY", "CREATED", "RUN_AT", "DURATION",
        "ERROR",
    ]  # fmt: skip
    assert lines[-1] == "2 more (next page: --offset 3)"
    page2 = cli(config_path, "list", "--limit", "3", "--offset", "3").stdout.splitlines()
    (failed_line,) = [line for line in page2 if line.startswith(failed_id)]
    assert "failed" in failed_line and "bad_input: no such user 42" in failed_line
    assert "more" not in page2[-1]
    cells = failed_line.split()
    assert cells[7].endswith("Z") and cells[8].endswith("s")  # RUN_AT, DURATION


def test_inspect_follow_prints_progress_until_the_end(
    config_path: Path, dialect: str, db_target: str
) -> None:
    task = on_store(dialect, db_target, lambda s: s.submit(name="slow", queue="a"))
    follower = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cairnqd.cli",
            "-c",
            str(config_path),
            "inspect",
            task.id,
            "--follow",
        ],
        env=REPO_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert follower.stdout is not None
    reader = threading.Thread(target=lambda: [lines.put(x) for x in follower.stdout], daemon=True)  # type: ignore[union-attr]
    reader.start()

    def next_line(containing: str) -> str:
        def seen() -> str | None:
            with contextlib.suppress(queue.Empty):
                while True:
                    line = lines.get_nowait()
                    if containing in line:
                        return line
            return None

        return wait_for(f"a line with {containing!r}", seen, 30)

    try:
        first = next_line("queued")
        assert "attempt 0/3" in first

        async def work(store: TaskStore) -> None:
            (claimed,) = await store.claim(queues=["a"], worker_id="w1")
            await store.progress(task_id=claimed.id, worker_id="w1", progress=0.5, message="half")

        on_store(dialect, db_target, work)
        line = next_line("progress")
        assert "running" in line and "progress 50%" in line and "half" in line
        on_store(
            dialect,
            db_target,
            lambda s: s.succeed(task_id=task.id, worker_id="w1", result={"ok": True}),
        )
        assert "attempt 1/3" in next_line("succeeded")
        assert follower.wait(timeout=30) == 0
    finally:
        if follower.poll() is None:
            follower.kill()
        follower.wait()
        reader.join(timeout=10)
        follower.stdout.close()
        assert follower.stderr is not None
        follower.stderr.close()


def test_bulk_cancel_of_running_tasks_under_a_daemon(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    groups = {"g": {"queues": ["a"], "processes": 1, "concurrency": 4, "prefetch": 0}}
    daemon = daemon_factory(control_config(tmp_path, dialect, db_target, groups)).start()
    release = tmp_path / "release"
    payload = {"until": str(release)}
    on_store(
        dialect,
        db_target,
        lambda s: s.submit_many([{"name": "t.block", "queue": "a", "payload": payload}] * 3),
    )

    def counts() -> dict[str, int]:
        stats = json.loads(daemon.cli("stats", "--json").stdout)
        return stats.get("a", {})  # type: ignore[no-any-return]

    wait_for("three running", lambda: counts().get("running") == 3, 60)
    done = daemon.cli("cancel", "--status", "running", "--queue", "a", "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("canceled 3 task(s): status running, queue a (3 running:")
    release.touch()
    wait_for("the handlers to settle them canceled", lambda: counts().get("canceled") == 3, 60)
    assert daemon.stop() == 0


@pytest.mark.parametrize("answer", ["y", "n"])
def test_bulk_asks_on_a_terminal(
    config_path: Path, dialect: str, db_target: str, terminal: Terminal, answer: str
) -> None:
    on_store(dialect, db_target, lambda s: s.submit_many([{"name": "x", "queue": "a"}] * 3))
    rc = config_path.parent / "bulk.rc"
    terminal.start(shell_cli(config_path, "cancel", "--queue", "a", rc=rc))
    terminal.wait_screen(
        "the question", lambda s: "cancel 3 task(s) (status queued/running, queue a)? [y/N]" in s
    )
    terminal.keys(answer, "Enter")
    wait_for("the command to end", lambda: rc.exists() and rc.read_text().strip() != "")
    stats = json.loads(cli(config_path, "stats", "--json").stdout)
    if answer == "y":
        assert rc.read_text().strip() == "0"
        assert stats["a"]["canceled"] == 3
    else:
        assert rc.read_text().strip() == "1"
        assert stats["a"]["queued"] == 3
