"""cairnqd: a durable task runtime for Python (cairnq protocol v1) and its daemon.

A drop-in for the public `cairnq` Python SDK: `import cairnqd as cairnq`.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

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
from cairnqd.store import PostgresStore, SQLiteStore, TaskStore
from cairnqd.worker import Worker

try:
    __version__ = _version("cairnqd")
except PackageNotFoundError:  # a source tree without an install
    __version__ = "0.0.0.dev0"

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
