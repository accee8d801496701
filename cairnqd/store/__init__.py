"""Storage: one class per dialect, one method per protocol operation."""

from cairnqd.models import Conflict
from cairnqd.store.base import TaskStore
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite import SQLiteStore

__all__ = ["Conflict", "PostgresStore", "SQLiteStore", "TaskStore"]
