"""Storage: one class per dialect, one method per protocol operation."""

from ..models import Conflict
from .base import TaskStore
from .postgres import PostgresStore
from .sqlite import SQLiteStore

__all__ = ["Conflict", "PostgresStore", "SQLiteStore", "TaskStore"]
