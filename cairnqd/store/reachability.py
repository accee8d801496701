"""Whether a process's database still answers, and how long a call may wait for it:
what the daemon needs of store/postgres/connect.py's partition detection (see its docstring
for why these bounds), without the driver, so a SQLite daemon never loads psycopg."""

from __future__ import annotations

import time
from collections.abc import Callable

from cairnqd.store.errors import classify, loaded_driver

#: How long the daemon's children and background threads let one store call take.
DAEMON_CALL_TIMEOUT_S = 15.0
#: What psycopg may add to a timed-out call: a server-side cancel (5 s to connect),
#: then up to 5 s for the query to end, before it drops the connection itself.
CANCEL_GRACE_S = 10.0
#: What a Postgres claim sent in one flight adds when its call times out: it waits this
#: long for the flight's answer, to hand back what it took (store/postgres/flight.py).
FLIGHT_HAND_BACK_S = 2.0
#: The stated bound: a silent connection fails a call within this.
DETECTION_BOUND_S = 30.0
assert DAEMON_CALL_TIMEOUT_S + FLIGHT_HAND_BACK_S + CANCEL_GRACE_S <= DETECTION_BOUND_S


def is_unreachable(exc: BaseException) -> bool:
    """Whether `exc` means the database did not answer (rather than answered no)."""
    psycopg = loaded_driver("psycopg")
    if psycopg is not None and isinstance(exc, psycopg.errors.QueryCanceled):
        return False  # the server answered: its own statement_timeout
    return classify(exc) in ("timeout", "connect")


class Reachability:
    """Whether the database answers this process, from the outcome of its calls.

    A call that failed for want of the database (a timeout, a refused or dropped
    connection) starts an outage; the next call that succeeds ends it. Busy errors and
    bad statements say nothing about the network and are ignored. Written from one
    event loop, read from any thread (plain attribute swaps).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        #: When the current outage began (monotonic), or None while the database answers.
        self.down_since: float | None = None
        #: The error that began the current outage, or the last one before recovery.
        self.error = ""

    def succeeded(self) -> None:
        self.down_since = None

    def failed(self, exc: BaseException, *, since: float | None = None) -> None:
        """Count `exc` against the database if it is a connectivity failure; `since`:
        when the failed call began (the outage is dated from it), else now."""
        if not is_unreachable(exc):
            return
        if self.down_since is None:
            self.error = f"{type(exc).__name__}: {exc}".rstrip(": ")
            self.down_since = self._clock() if since is None else since

    def down_for(self) -> float:
        """Seconds the database has failed to answer; 0 while it does."""
        since = self.down_since
        return 0.0 if since is None else max(0.0, self._clock() - since)


__all__ = [
    "CANCEL_GRACE_S",
    "DAEMON_CALL_TIMEOUT_S",
    "DETECTION_BOUND_S",
    "Reachability",
    "is_unreachable",
]
