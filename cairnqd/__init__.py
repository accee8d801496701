"""cairnqd: a durable task runtime for Python (cairnq protocol v1) and its daemon.

A drop-in for the public `cairnq` Python SDK: `import cairnqd as cairnq`.

`PostgresStore` and `__version__` are resolved on first use (PEP 562): psycopg and
importlib.metadata together cost a quarter of a second to import, which every `cairnqd`
command on a SQLite deployment would otherwise pay.
"""

from typing import TYPE_CHECKING, Any

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.errors import (
    AlreadyExists,
    CairnQError,
    DatabaseUnavailable,
    ListenUnavailable,
    LostLease,
    NotACairnqDatabase,
    ProtocolVersionMismatch,
    QueueFull,
    SchemaMismatch,
    SerializationError,
    StoreClosed,
    TaskCanceled,
    TaskError,
    TaskFailed,
    TaskTimeout,
    UnsupportedBackend,
)
from cairnqd.models import (
    STATUSES,
    Conflict,
    Task,
    TaskDef,
    TaskRef,
    TaskStatus,
    is_terminal_status,
)
from cairnqd.retention import Retention, RetentionRule
from cairnqd.store import SQLiteStore, TaskStore
from cairnqd.worker import Worker

if TYPE_CHECKING:
    from cairnqd.store.postgres import PostgresStore

    __version__: str


def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cairnqd")
    except PackageNotFoundError:  # a source tree without an install
        return "0.0.0.dev0"


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":
        from cairnqd.store.postgres import PostgresStore

        return PostgresStore
    if name == "__version__":
        value = _installed_version()
        globals()["__version__"] = value  # once is enough
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "STATUSES",
    "AlreadyExists",
    "CairnQ",
    "CairnQError",
    "Conflict",
    "DatabaseUnavailable",
    "ListenUnavailable",
    "LostLease",
    "NotACairnqDatabase",
    "PostgresStore",
    "ProtocolVersionMismatch",
    "QueueFull",
    "Retention",
    "RetentionRule",
    "SQLiteStore",
    "SchemaMismatch",
    "SerializationError",
    "StoreClosed",
    "Task",
    "TaskCanceled",
    "TaskContext",
    "TaskDef",
    "TaskError",
    "TaskFailed",
    "TaskRef",
    "TaskStatus",
    "TaskStore",
    "TaskTimeout",
    "UnsupportedBackend",
    "Worker",
    "__version__",
    "is_terminal_status",
]
