"""The SQLite dialect: `SQLiteStore` on one database file, through the stdlib `sqlite3`.

store.py runs the statements (group commit, busy retries, close that drains),
statements.py prepares and steps them, files.py opens and identifies the file,
bulk.py streams a long `submit_many`.
"""

from cairnqd.store.errors import register
from cairnqd.store.sqlite.errors import SQLiteErrors
from cairnqd.store.sqlite.store import SQLiteStore

register(SQLiteErrors())

__all__ = ["SQLiteStore"]
