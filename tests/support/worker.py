"""Helpers for the worker suite: waiting for task states, running a worker for a block,
collecting `on_error` reports, and starting worker subprocesses.

Nothing here sleeps to synchronize: every wait is a tests/support/waiting.py condition
wait with a generous deadline (the test machine has two shared cores).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cairnqd.models import Task
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.waiting import WaitTimeout, wait_for_async

REPO = Path(__file__).resolve().parents[2]

# Default deadline for "this should happen soon" conditions.
DEADLINE_S = 20.0

# For behaviour that lives entirely in the worker (above the store seam): one dialect
# is enough, and every Postgres test pays ~1 s for its fresh database.
SQLITE_ONLY = pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
POSTGRES_ONLY = pytest.mark.parametrize("dialect", ["postgres"], indirect=True)


async def eventually(
    check: Callable[[], Any],
    *,
    within: float = DEADLINE_S,
    what: str = "",
) -> Any:
    """`tests.support.waiting.wait_for_async` with the failure named after `check`
    unless `what` says otherwise (the worker suite, tests/store/test_pg_listen.py and
    tests/daemon/test_maintenance.py wait this way)."""
    described = what or f"{getattr(check, '__qualname__', check)!s} to hold"
    return await wait_for_async(described, check, within)


async def wait_status(
    store: TaskStore, task_id: str, *statuses: str, within: float = DEADLINE_S
) -> Task:
    """Wait until the task is in one of `statuses` (default: any terminal status)."""
    wanted = set(statuses) or {"succeeded", "failed", "canceled"}
    task = await wait_for_async(
        f"{task_id} to be one of {sorted(wanted)}",
        lambda: store.get(task_id),
        within,
        accept=lambda found: found is not None and found.status in wanted,
    )
    assert task is not None
    return task


async def wait_all(
    store: TaskStore, task_ids: list[str], *statuses: str, within: float = DEADLINE_S
) -> list[Task]:
    return [await wait_status(store, i, *statuses, within=within) for i in task_ids]


@contextlib.asynccontextmanager
async def running(
    worker: Worker, *, concurrency: int | None = None, stop_timeout: float = DEADLINE_S
) -> AsyncIterator[asyncio.Task[None]]:
    """Run `worker.run()` as a task for the block; stop it and await it afterwards.

    Independent of `Worker.background()`, so a bug there cannot mask other tests.
    """
    runner = asyncio.create_task(worker.run(concurrency=concurrency))
    # Let run() reach its first suspension point before the body can call stop().
    await asyncio.sleep(0)
    try:
        yield runner
    finally:
        worker.stop()
        done, _ = await asyncio.wait({runner}, timeout=stop_timeout)
        if not done:
            runner.cancel()
            with contextlib.suppress(BaseException):
                await runner
            raise AssertionError(f"worker.run() did not return within {stop_timeout}s of stop()")
        runner.result()  # re-raise a run() failure


class ErrorLog:
    """An `on_error` hook that records every report."""

    def __init__(self) -> None:
        self.calls: list[tuple[BaseException, dict[str, Any]]] = []

    def __call__(self, exc: BaseException, info: dict[str, Any]) -> None:
        self.calls.append((exc, dict(info)))

    def __repr__(self) -> str:
        return f"ErrorLog({[(type(e).__name__, str(e), i) for e, i in self.calls]})"


def wrap_method(obj: Any, name: str, wrapper: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """Shadow `obj.name` on the instance with `wrapper(original, *args, **kwargs)`.

    Used only to *observe* a real store (or to pick the moment an outside event
    happens); the original method always runs.
    """
    original = getattr(obj, name)

    async def shadow(*args: Any, **kwargs: Any) -> Any:
        return await wrapper(original, *args, **kwargs)

    setattr(obj, name, shadow)
    return original


class IdleProbe:
    """Observes the worker's idle waits on its (real) store."""

    def __init__(self, store: TaskStore) -> None:
        self.idle_entries = 0
        self.idle = asyncio.Event()
        wrap_method(store, "claim_wake", self._claim_wake)

    async def _claim_wake(self, original: Any, *args: Any, **kwargs: Any) -> Any:
        self.idle_entries += 1
        self.idle.set()
        try:
            return await original(*args, **kwargs)
        finally:
            self.idle.clear()


# -- subprocesses ---------------------------------------------------------------------

WORKER_SCRIPT_PRELUDE = """
import asyncio, faulthandler, json, os, signal, sys
ARGS = json.loads(sys.argv[1])
# A terminal's Ctrl-C, whatever the runner's own parent did: a background job of a
# non-interactive shell starts with SIGINT ignored, which Python then keeps, and
# asyncio.run installs its handler only over Python's default one.
signal.signal(signal.SIGINT, signal.default_int_handler)
# Where a process that will not exit is stuck: every thread's stack, on stderr
# (`wait_exit` asks for it before it gives up).
faulthandler.register(signal.SIGUSR1, all_threads=True)
FLAGS = ARGS["flags"]
from cairnqd.worker import Worker
from tests.support.waiting import wait_for_async

def make_worker(**kw):
    if ARGS["dialect"] == "sqlite":
        return Worker.sqlite(ARGS["target"], **kw)
    return Worker.postgres(ARGS["target"], max_size=4, **kw)

def mark(name):
    path = os.path.join(FLAGS, name)
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)

async def wait_flag(name):
    path = os.path.join(FLAGS, name)
    while not os.path.exists(path):
        await asyncio.sleep(0.01)
"""


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONWARNINGS"] = "ignore"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_worker_process(
    script: str, *, dialect: str, target: str, flags: Path, tmp: Path
) -> subprocess.Popen[str]:
    """Start `python -c PRELUDE+script` with ARGS = {dialect, target, flags}."""
    flags.mkdir(parents=True, exist_ok=True)
    path = tmp / f"worker_{len(list(tmp.glob('worker_*.py')))}.py"
    path.write_text(WORKER_SCRIPT_PRELUDE + textwrap.dedent(script))
    args = json.dumps({"dialect": dialect, "target": target, "flags": str(flags)})
    return subprocess.Popen(
        [sys.executable, str(path), args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        cwd=str(REPO),
    )


def reap(proc: subprocess.Popen[str], timeout: float = 10.0) -> tuple[int, str, str]:
    """Wait for a child (killing it if it will not exit) and collect its output."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out, err


async def wait_exit(proc: subprocess.Popen[str], within: float = DEADLINE_S) -> int:
    """The exit code of a worker script's process. One still running at the deadline is
    asked for its threads' stacks (the prelude's SIGUSR1), killed, and the failure
    shows its stderr: where it was stuck."""
    try:
        code = await wait_for_async(f"pid {proc.pid} to exit", proc.poll, within, accept=_exited)
    except WaitTimeout as exc:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGUSR1)
        _, _, err = reap(proc, timeout=2.0)
        raise WaitTimeout(f"{exc}\n--- its stderr, stacks last ---\n{err[-12000:]}") from None
    assert code is not None
    return code


def _exited(code: int | None) -> bool:
    return code is not None


def caught_signals(pid: int) -> int:
    """The process's caught-signal mask (`SigCgt` in /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no SigCgt line for pid {pid}")


def pg_listen_queries(dsn: str) -> list[str]:
    """The LISTEN statements other sessions on this database last ran, sorted."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "select query from pg_stat_activity where datname = current_database() "
            "and pid <> pg_backend_pid() and query ilike 'listen %' order by query"
        ).fetchall()
    return [r[0] for r in rows]


def pg_listening(dsn: str) -> bool:
    """True when some session on this database is LISTENing (its last statement)."""
    return bool(pg_listen_queries(dsn))
