"""Shared helpers for the store and interop suites.

Direct database access (a plain `sqlite3` or `psycopg` connection beside the store under
test), the upstream migration names, and a way to start several Python processes that
all begin their real work at the same moment.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

from tests.support.waiting import wait_for, wait_for_async

# docs/protocol.md §2.7: the ledger names every SDK records, `.sql` included. SQLite has no 0003.
UPSTREAM_SQLITE_MIGRATIONS = (
    "0001_init.sql",
    "0002_purge_index.sql",
    "0004_lease_index.sql",
    "0005_clear_terminal_lease.sql",
    "0006_claim_name_index.sql",
    "0007_purge_status_index.sql",
    "0008_claim_due_index.sql",
    "0009_purge_queue_index.sql",
    "0010_drop_status_index.sql",
)
UPSTREAM_PG_MIGRATIONS = tuple(sorted((*UPSTREAM_SQLITE_MIGRATIONS, "0003_notify.sql")))

REPO = Path(__file__).resolve().parents[2]


def upstream_migrations(dialect: str) -> tuple[str, ...]:
    return UPSTREAM_SQLITE_MIGRATIONS if dialect == "sqlite" else UPSTREAM_PG_MIGRATIONS


def extension_migrations(dialect: str) -> tuple[str, ...]:
    """cairnqd's own migration names, as shipped in protocol/extensions/."""
    folder = REPO / "protocol" / "extensions" / "migrations" / dialect
    return tuple(sorted(p.name for p in folder.glob("*.sql")))


def pg_url(dsn: str) -> str:
    """The same Postgres target as a `postgresql://` URL.

    The fixtures build libpq keyword strings, which asyncpg (the public SDK's driver)
    does not parse.
    """
    if dsn.startswith(("postgresql://", "postgres://")):
        return dsn
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    user = quote(str(parts.pop("user", "")), safe="")
    password = parts.pop("password", None)
    auth = f"{user}:{quote(str(password), safe='')}@" if password else (f"{user}@" if user else "")
    host = str(parts.pop("host", "localhost"))
    port = parts.pop("port", None)
    database = quote(str(parts.pop("dbname", "")), safe="")
    extra = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in parts.items())
    return f"postgresql://{auth}{host}{':' + str(port) if port else ''}/{database}" + (
        f"?{extra}" if extra else ""
    )


# -- direct database access -------------------------------------------------------------


def query(dialect: str, target: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run one statement on a fresh connection and return its rows.

    `sql` uses `?` placeholders in both dialects (rewritten to `%s` for Postgres), so a
    literal `?` or `%` must not appear in it.
    """
    if dialect == "sqlite":
        with closing(sqlite3.connect(target)) as conn:
            cursor = conn.execute(sql, tuple(params))
            rows = cursor.fetchall()
            conn.commit()
            return rows
    with psycopg.connect(target, autocommit=True) as conn:
        cursor = conn.execute(sql.replace("?", "%s"), tuple(params))  # type: ignore[arg-type]
        return cursor.fetchall() if cursor.description is not None else []


def scalar(dialect: str, target: str, sql: str, params: Sequence[Any] = ()) -> Any:
    rows = query(dialect, target, sql, params)
    assert len(rows) == 1, rows
    return rows[0][0]


def count_rows(dialect: str, target: str) -> tuple[int, int]:
    """(tasks, key rows): what every "writes nothing" assertion compares."""
    return (
        int(scalar(dialect, target, "select count(*) from cairnq_tasks")),
        int(scalar(dialect, target, "select count(*) from cairnq_task_keys")),
    )


def ledger(dialect: str, target: str, table: str = "cairnq_migrations") -> dict[str, int]:
    """name -> applied_at_ms; a missing ledger table reads as empty."""
    if dialect == "sqlite":
        exists = query(
            dialect,
            target,
            "select 1 from sqlite_master where type = 'table' and name = ?",
            [table],
        )
    else:
        exists = [r for r in query(dialect, target, "select to_regclass(?)", [table]) if r[0]]
    if not exists:
        return {}
    rows = query(dialect, target, f"select name, applied_at_ms from {table} order by name")
    return {name: int(at) for name, at in rows}


def meta(dialect: str, target: str) -> dict[str, str]:
    return dict(query(dialect, target, "select key, value from cairnq_meta"))


# -- time ----------------------------------------------------------------------------


class ShiftedClock:
    """A store clock (epoch ms): the wall clock plus an offset a test moves, so rows
    can be aged without sleeping."""

    def __init__(self, offset_ms: int = 0) -> None:
        self.offset_ms = offset_ms

    def __call__(self) -> int:
        return int(time.time() * 1000) + self.offset_ms


async def settle_upstream_listener(store: Any, timeout_s: float = 10.0) -> None:
    """Wait for a public-SDK Postgres store's LISTEN connection to finish connecting.

    cairnq 0.15.1 opens that connection in the background after connect(), and its
    close() cancels the attempt if it is still in flight, which leaks the half-made
    asyncpg connection (a ResourceWarning, an error under `-W error`). That is an
    upstream bug; waiting here keeps it out of our results. SQLite stores and stores
    without a listener return at once.
    """
    if not hasattr(store, "_listener_connecting"):
        return
    await wait_for_async(
        "the public SDK's LISTEN connection to come up",
        lambda: store._listener is not None or store._listener_unavailable,
        timeout_s,
    )


async def connect_upstream(store: Any) -> Any:
    """connect() a public-SDK store (or CairnQ handle) and let its listener settle."""
    await store.connect()
    await settle_upstream_listener(getattr(store, "store", store))
    return store


@asynccontextmanager
async def upstream_client(dialect: str, target: str, *, max_size: int = 4) -> AsyncIterator[Any]:
    """The public SDK's client on the test database, connected (on a fresh database it
    runs the protocol's migrations) and closed after."""
    import cairnq

    if dialect == "sqlite":
        client = cairnq.CairnQ.sqlite(target)
    else:
        client = cairnq.CairnQ.postgres(pg_url(target), max_size=max_size)
    await connect_upstream(client)
    try:
        yield client
    finally:
        await client.close()


# -- processes that start together -------------------------------------------------------

# Prepended to every child script: `barrier()` marks this child ready, then waits for
# the parent's go signal, so the children's real work (connect, submit, claim) starts
# together instead of staggered by interpreter start-up.
_PRELUDE = """
import json, os, sys, time
ARGS = json.loads(sys.argv[1])
def barrier():
    d = ARGS["barrier_dir"]
    open(os.path.join(d, "ready-%d" % ARGS["index"]), "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(d, "go")):
        if time.monotonic() > deadline:
            sys.exit("barrier: no go signal within 60s")
        time.sleep(0.001)
def emit(value):
    print("RESULT " + json.dumps(value), flush=True)
"""


class ProcessResult:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr

    @property
    def result(self) -> Any:
        for line in self.stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT ") :])
        raise AssertionError(f"no RESULT line; stdout={self.stdout!r} stderr={self.stderr!r}")


def child_env(pythonpath: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CAIRNQ_PROTOCOL_DIR", None)
    env["PYTHONWARNINGS"] = "ignore"
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    else:
        env.pop("PYTHONPATH", None)
    return env


def run_together(
    scripts: Sequence[str],
    args: Sequence[dict[str, Any]],
    barrier_dir: Path,
    *,
    pythonpath: Sequence[str | None] | None = None,
    timeout_s: float = 120.0,
) -> list[ProcessResult]:
    """Start one process per script, release them at once, and collect their output.

    Each script runs after `_PRELUDE`, reads its arguments from `ARGS`, must call
    `barrier()` before its real work, and reports with `emit(value)`.
    """
    barrier_dir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[str]] = []
    try:
        for index, (script, arg) in enumerate(zip(scripts, args, strict=True)):
            payload = {**arg, "barrier_dir": str(barrier_dir), "index": index}
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _PRELUDE + script, json.dumps(payload)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=child_env(pythonpath[index] if pythonpath else None),
                    cwd=str(barrier_dir),
                )
            )

        def all_ready() -> bool:
            dead = [p for p in procs if p.poll() is not None]
            if dead:
                out, err = dead[0].communicate()
                raise AssertionError(f"a child exited before the barrier: {out!r} {err!r}")
            return all((barrier_dir / f"ready-{i}").exists() for i in range(len(procs)))

        wait_for("every child to reach the barrier", all_ready, 60)
        (barrier_dir / "go").touch()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=timeout_s)
            results.append(ProcessResult(proc.returncode, out, err))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def run_script(
    script: str, arg: dict[str, Any], *, pythonpath: str | None = None, timeout_s: float = 120.0
) -> ProcessResult:
    """Run one child script (no barrier needed) and require it to succeed."""
    payload = {**arg, "barrier_dir": "", "index": 0}
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + script, json.dumps(payload)],
        capture_output=True,
        text=True,
        env=child_env(pythonpath),
        timeout=timeout_s,
        check=False,
    )
    result = ProcessResult(proc.returncode, proc.stdout, proc.stderr)
    assert proc.returncode == 0, f"child failed ({proc.returncode}): {proc.stderr}"
    return result
