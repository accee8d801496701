"""`cairnqd inspect` with attempt history, on both dialects: the traceback as text, the
attempts as a table, the leftover error labelled, and `--json`'s `attempts`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.support.attempts import (
    FIRST_WORKER,
    LAST_WORKER,
    LOST_WORKER,
    TRACEBACK,
    failed_lost_succeeded,
)
from tests.support.cli import Run
from tests.support.databases import make_store


async def _history(dialect: str, db_target: str) -> str:
    async with make_store(dialect, db_target) as store:
        return await failed_lost_succeeded(store)


@pytest.mark.timing
def test_inspect_shows_the_attempts(
    db_config: Path, run: Run, dialect: str, db_target: str
) -> None:
    task_id = asyncio.run(_history(dialect, db_target))

    text = run("inspect", task_id)
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert "attempt: 3/5" in out
    assert "error: left by attempt 1; the task succeeded afterwards" in out
    # The traceback is text with real line breaks, not a JSON string of \n.
    assert "\\n" not in out
    assert "      ValueError: bad pixel" in out
    assert out.count("      ValueError: bad pixel\n") == 1, "the traceback is shown once"
    assert "traceback: under its attempt below" in out
    lines = out.splitlines()
    table = lines[lines.index("attempts:") + 1 :]
    assert table[0].split() == ["#", "outcome", "worker", "host", "started", "took", "error"]
    first, lost, last = (line.split() for line in table[1:4])
    assert first[:4] == ["1", "failed", FIRST_WORKER, "hostA"]
    assert lost[:4] == ["2", "lease_lost", LOST_WORKER, "unknown"]
    assert last[:4] == ["3", "succeeded", LAST_WORKER, "hostC"]
    assert "attempt 1 error:" in out and "attempt 2 error:" not in out

    shown = json.loads(run("inspect", task_id, "--json").stdout)
    assert shown["error_attempt"] == 1
    assert [(a["attempt"], a["outcome"], a["host"]) for a in shown["attempts"]] == [
        (1, "failed", "hostA"),
        (2, "lease_lost", None),
        (3, "succeeded", "hostC"),
    ]
    first_json = shown["attempts"][0]
    assert first_json["error"]["details"]["traceback"] == TRACEBACK
    assert first_json["finished_at_ms"] >= first_json["started_at_ms"]
    assert set(first_json) == {
        "attempt", "worker_id", "host", "started_at_ms", "finished_at_ms", "outcome",
        "detail", "error",
    }  # fmt: skip


async def _retried(dialect: str, db_target: str) -> str:
    """A task of one allowed attempt that failed, was retried by hand and runs again."""
    async with make_store(dialect, db_target) as store:
        task = await store.submit(name="n", queue="retried", max_attempts=1)
        for worker in ("w1", "w2"):
            claimed = await store.claim(queues=["retried"], worker_id=worker)
            assert [t.id for t in claimed] == [task.id]
            if worker == "w1":
                await store.fail(task_id=task.id, worker_id=worker, error={"message": "x"})
                assert await store.retry(task.id) is not None
        return task.id


def test_inspect_without_history_and_after_a_retry(
    db_config: Path, run: Run, dialect: str, db_target: str
) -> None:
    submitted = run("submit", "demo.echo", "--max-attempts", "1")
    assert submitted.returncode == 0, submitted.stderr
    task_id = submitted.stdout.strip()
    out = run("inspect", task_id).stdout
    assert "attempts: none recorded" in out and "attempt: 0/1" in out
    assert json.loads(run("inspect", task_id, "--json").stdout)["attempts"] == []

    retried = asyncio.run(_retried(dialect, db_target))
    out = run("inspect", retried).stdout
    assert "attempt: 2 (1 allowed + 1 retried)" in out
    # A retry clears the row's error; the history keeps attempt 1's.
    assert "\nerror:" not in out and "attempt 1 error:\n  message: x" in out
    listed = run("list", "--status", "running").stdout
    assert "2 (1 allowed + 1 retried)" in listed and "2/1" not in listed
