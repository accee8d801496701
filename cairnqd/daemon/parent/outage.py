"""Whether the parent's database answers: one probe round trip every
`PROBE_INTERVAL_S`, outages logged once at each end, a lost SQLite file found.

Every call of the maintenance thread reports here (`answered`, `failed`), so
`database_problem()` (/healthz) says what is wrong until a call succeeds again."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from cairnqd.daemon.parent.parent_store import db_error_kind
from cairnqd.store.base import TaskStore
from cairnqd.store.reachability import Reachability, is_unreachable
from cairnqd.store.sqlite.files import DatabaseFile, file_id, is_plain_file

if TYPE_CHECKING:
    from cairnqd.daemon.parent.metrics import Metrics

log = logging.getLogger("cairnqd.maintenance")

#: How often the parent checks that the database answers, between duties.
PROBE_INTERVAL_S = 2.0


class OutageWatch:
    def __init__(
        self, path: str | None, metrics: Metrics, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._metrics = metrics
        self._clock = clock
        self._reach = Reachability(clock)
        self._file = DatabaseFile(path) if path is not None and is_plain_file(path) else None
        # The last duty's failure, until one succeeds.
        self._problem: str | None = None
        # When the outage now logged began; None while none is.
        self._outage_logged: float | None = None

    def remember_file(self) -> None:
        """Watch the SQLite file as it is now (the one the supervisor just made sure of)."""
        if self._file is not None and file_id(self._file.path) is not None:
            self._file.remember()

    async def probe(self, store: TaskStore) -> None:
        """One round trip: does the database answer?"""
        if self._file is not None:
            self._file.remember()  # the file this store opened (once)
        await store.protocol_version()

    def file_lost(self) -> bool:
        """Whether the SQLite file was deleted or replaced (logged once, when found)."""
        if self._file is None:
            return False
        known = self._file.lost
        lost = self._file.check()
        if lost is not None and known is None:
            log.critical(
                "%s; the daemon no longer runs maintenance on it and its workers stop "
                "claiming; restore the file and restart cairnqd",
                lost,
            )
        return lost is not None

    def answered(self) -> None:
        """A call succeeded: any outage is over."""
        self._problem = None
        self._reach.succeeded()
        if self._outage_logged is not None:
            log.info(
                "database reachable again after %.0fs",
                self._clock() - self._outage_logged,
            )
            self._outage_logged = None

    def failed(self, exc: BaseException, what: str, began: float | None = None) -> None:
        """A call failed: counted, and logged once per outage when nothing answered."""
        kind = db_error_kind(exc)
        self._metrics.db_error("maintenance", kind)
        self._problem = f"maintenance: {what} failed ({kind}): {exc or type(exc).__name__}"
        if not is_unreachable(exc):
            log.warning("%s failed (%s): %s", what, kind, exc or type(exc).__name__)
            return
        self._reach.failed(exc, since=began)
        if self._outage_logged is None and self._reach.down_since is not None:
            self._outage_logged = self._reach.down_since
            log.warning(
                "database unreachable (%s failed: %s); retrying quietly, work resumes "
                "by itself once it answers",
                what, self._reach.error,
            )  # fmt: skip
        else:
            log.debug("%s failed (%s): %s", what, kind, exc or type(exc).__name__)

    def database_problem(self) -> str | None:
        """A lost database file, else the outage under way, else the last failure."""
        if self._file is not None and self._file.lost is not None:
            return f"{self._file.lost}; workers stopped claiming: restore it and restart cairnqd"
        if self._reach.down_since is not None:
            return f"database unreachable for {self._reach.down_for():.0f}s: {self._reach.error}"
        return self._problem

    def down_s(self) -> float:
        """Seconds the database has not answered the parent; 0 while it does."""
        return self._reach.down_for()


__all__ = ["PROBE_INTERVAL_S", "OutageWatch"]
