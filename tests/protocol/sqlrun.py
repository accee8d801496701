"""Protocol statements bound the way the store binds them, for the semantics tests.

`Lite` and `Pg` run one statement file with named parameters on a migrated database and
return plain dict rows, so a test reads as a sequence of protocol operations.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.protocol.sqldb import sqlite_ours
from tests.protocol.sqlfiles import statement_text, to_psycopg

LEASE_EXPIRED = json.dumps(
    {
        "type": "LeaseExpired",
        "code": "lease_expired",
        "message": "task lease expired and max attempts reached",
        "retryable": False,
        "details": {},
    }
)
HANDLER_ERROR = json.dumps(
    {
        "type": "ValueError",
        "code": "handler_error",
        "message": "boom",
        "retryable": True,
        "details": {},
    }
)


def now_ms() -> int:
    return int(time.time() * 1000)


class Lite:
    """Run protocol statements on a migrated SQLite database, binding like the store."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite_ours(path)

    def run(self, op: str, *, extension: bool = False, **params: Any) -> list[dict[str, Any]]:
        now = params.pop("now", None) or now_ms()
        bound = {
            "now_ms": now,
            "lease_until_ms": now + params.pop("lease_ms", 30_000),
            "run_at_ms": now + params.pop("delay_ms", 0),
            "before_ms": now - params.pop("older_than_ms", 0),
            # An owned write's optional attempt filter: unnamed, as the public SDK calls.
            "attempt": None,
            **params,
        }
        for name in ("queues", "names", "ids"):
            if isinstance(bound.get(name), list):
                bound[name] = json.dumps(bound[name])
        cur = self.conn.execute(statement_text("sqlite", op, extension=extension), bound)
        return [dict(r) for r in cur.fetchall()] if cur.description else []

    def submit(self, tid: str, *, now: int, queue: str = "q", name: str = "n", **kw: Any) -> None:
        self.run(
            "insert_task",
            now=now,
            id=tid,
            name=name,
            queue=queue,
            payload="{}",
            metadata="{}",
            max_attempts=kw.pop("max_attempts", 3),
            priority=kw.pop("priority", 0),
            parent_id=None,
            root_id=tid,
            correlation_id=None,
            **kw,
        )

    def row(self, tid: str) -> dict[str, Any]:
        return self.run("get", id=tid)[0]

    def claim_all(self, tid_worker: str = "w1", **kw: Any) -> list[str]:
        kw.setdefault("queues", ["q"])
        kw.setdefault("names", None)
        return sorted(r["id"] for r in self.run("claim", worker_id=tid_worker, limit=100, **kw))


class Pg:
    """Run protocol statements on a migrated Postgres database, in autocommit."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def run(self, op: str, *, extension: bool = False, **params: Any) -> list[dict[str, Any]]:
        params.setdefault("running", "running")
        params.setdefault("attempt", None)
        text = to_psycopg(statement_text("postgres", op, extension=extension))
        cur = self.conn.execute(text, params)
        return list(cur.fetchall()) if cur.description else []

    def submit(
        self, tid: str, *, run_at: int, priority: int = 0, name: str = "n", max_attempts: int = 3
    ) -> None:
        self.run(
            "insert_task",
            id=tid,
            name=name,
            queue="q",
            payload="{}",
            metadata="{}",
            max_attempts=max_attempts,
            priority=priority,
            parent_id=None,
            root_id=tid,
            correlation_id=None,
            delay_ms=0,
        )
        self.conn.execute("update cairnq_tasks set run_at_ms = %s where id = %s", (run_at, tid))

    def claim(self, tid: str) -> None:
        got = self.run(
            "claim_one_queue_one_name",
            queue="q",
            name=tid,
            worker_id="w1",
            limit=1,
            lease_ms=60_000,
        )
        assert [r["id"] for r in got] == [tid]

    def row(self, tid: str) -> dict[str, Any]:
        return self.run("get", id=tid)[0]
