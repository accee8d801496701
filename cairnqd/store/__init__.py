"""Storage: one class per dialect, one method per protocol operation.

`PostgresStore` is imported on first use (PEP 562), so `import cairnqd` on a SQLite-only
deployment never loads psycopg; see `store.factory`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cairnqd.models import Conflict
from cairnqd.store.base import TaskStore
from cairnqd.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    from cairnqd.store.postgres import PostgresStore


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":
        from cairnqd.store.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Conflict", "PostgresStore", "SQLiteStore", "TaskStore"]
