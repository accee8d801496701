"""`DaemonReports`: each daemon's last report of its groups and children
(`cairnqd_daemon_reports`), which the dashboard shows for every host."""

from __future__ import annotations

from cairnqd.store.arguments import require_duration, require_str
from cairnqd.store.browse import REPORT_MAX_CHARS, DaemonReport
from cairnqd.store.executor import Executor


class DaemonReports:
    def __init__(self, executor: Executor) -> None:
        self._db = executor

    async def put(self, daemon: str, host: str, snapshot: str) -> None:
        """Store `daemon`'s report (JSON text), replacing its last; stamped with the
        database's clock."""
        require_str(daemon, "daemon")
        require_str(host, "host")
        require_str(snapshot, "snapshot")
        if len(snapshot) > REPORT_MAX_CHARS:
            raise ValueError(f"snapshot is longer than {REPORT_MAX_CHARS} characters")
        params = {"daemon": daemon[:255], "host": host, "snapshot": snapshot}
        await self._db.fetch("extensions/dashboard_report", params)

    async def all(self) -> list[DaemonReport]:
        """Every daemon's last report, by host."""
        rows = await self._db.fetch("extensions/dashboard_reports", {})
        return [DaemonReport.from_row(r) for r in rows]

    async def prune(self, older_than_ms: int) -> int:
        """Forget daemons silent for `older_than_ms`; how many were forgotten."""
        require_duration(older_than_ms, "older_than_ms")
        rows = await self._db.fetch(
            "extensions/dashboard_reports_prune", {"older_than_ms": older_than_ms}
        )
        return len(rows)


__all__ = ["DaemonReports"]
