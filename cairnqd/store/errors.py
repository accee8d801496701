"""What a database error means for the caller: `classify(exc)` (busy, timeout, connect,
full, other: the `kind` label of `cairnq_db_errors_total`) and `is_transient(exc)`.
Each dialect registers how to read its driver's errors when its package is imported,
so nothing here imports a driver (docs/architecture.md, "Driver errors").
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Literal, Protocol

from cairnqd.errors import DatabaseUnavailable

ErrorKind = Literal["busy", "timeout", "connect", "full", "other"]


class DriverErrors(Protocol):
    """How one dialect reads its driver's errors."""

    def classify(self, exc: BaseException) -> ErrorKind | None:
        """The kind of `exc`, or None when it is not this driver's error."""
        ...

    def is_operational(self, exc: BaseException) -> bool:
        """Whether `exc` is this driver saying the database could not be opened,
        reached, locked or written."""
        ...

    def refused_login(self, exc: BaseException) -> str | None:
        """The server's reason when it refused the connection for a cause no retry can
        fix (authentication, a database or role that does not exist), else None."""
        ...


_readers: list[DriverErrors] = []


def register(reader: DriverErrors) -> None:
    """Teach `classify` a driver's errors (each dialect package, once, at import)."""
    if reader not in _readers:
        _readers.append(reader)


def loaded_driver(name: str) -> ModuleType | None:
    """The driver module `name` if this process has imported it, else None: an error
    of a driver never imported cannot be in hand, and importing it to ask would load
    psycopg into every SQLite process."""
    return sys.modules.get(name)


def classify(exc: BaseException) -> ErrorKind:
    """The kind of a database error; see the module docstring."""
    for reader in _readers:
        kind = reader.classify(exc)
        if kind is not None:
            return kind
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, DatabaseUnavailable | OSError):
        return "connect"
    return "other"


def refused_login(exc: BaseException) -> str | None:
    """Why the server refused to let us in, for good (see `DriverErrors`), looking
    through the causes of `exc` (a DatabaseUnavailable wraps the driver's error)."""
    seen: BaseException | None = exc
    while seen is not None:
        for reader in _readers:
            reason = reader.refused_login(seen)
            if reason is not None:
                return reason
        seen = seen.__cause__
    return None


def is_transient(exc: BaseException) -> bool:
    """Whether the same call may succeed if simply tried again: the database was busy,
    unreachable or slow, and the request itself was fine."""
    return classify(exc) != "other"


def is_operational(exc: BaseException) -> bool:
    """An error about the database's operation rather than the statement: it could
    not be opened, reached, locked or written (what an operator must look at)."""
    return any(reader.is_operational(exc) for reader in _readers)


__all__ = [
    "DriverErrors",
    "ErrorKind",
    "classify",
    "is_operational",
    "is_transient",
    "refused_login",
    "register",
]
