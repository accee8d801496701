"""Opening a SQLite file the protocol's way (WAL, foreign keys, migrations, planner
statistics, the protocol guard) on a thread, and `DatabaseFile`: whether the path still
names the file a long-running process opened (docs/architecture.md, "The SQLite file
under running processes").
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from cairnqd._protocol import statement
from cairnqd.errors import MigrationsPending, NotACairnqDatabase
from cairnqd.store.migrate import check_protocol_version
from cairnqd.store.sqlite.errors import is_sqlite_busy
from cairnqd.store.sqlite.migrate import apply_sqlite, pending_sqlite

_WAL_RETRY_S = 0.05


def is_memory(path: str) -> bool:
    return path == ":memory:" or "mode=memory" in path


def open_database(
    path: str, *, busy_timeout_ms: int, synchronous: str, migrate: bool
) -> sqlite3.Connection:
    """A connection ready for the store: migrated (or refused when `migrate` is off
    and migrations are pending), speaking protocol 1, busy_timeout back at 0."""
    memory = is_memory(path)
    if not memory and not path.startswith("file:"):
        Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(
        path,
        isolation_level=None,
        check_same_thread=False,
        uri=path.startswith("file:"),
        cached_statements=256,
    )
    try:
        conn.execute(f"pragma busy_timeout = {int(busy_timeout_ms)}")
        if not memory:
            _enable_wal(conn, path, busy_timeout_ms)
        conn.execute("pragma foreign_keys = on")
        conn.execute(f"pragma synchronous = {synchronous}")
        # Read first: applying takes the write lock once per migration, and another
        # client holding it (a long write) would fail an open that has nothing to do.
        if pending := pending_sqlite(conn):
            if not migrate:
                raise MigrationsPending(path, pending)
            apply_sqlite(conn)
        # From here on the store retries SQLITE_BUSY itself, awaiting between tries.
        conn.execute("pragma busy_timeout = 0")
        # Best effort, so it does not wait for another client's write lock either.
        refresh_statistics(conn)
        _check_protocol(conn, path)
    except sqlite3.DatabaseError as exc:
        conn.close()
        if not _looks_foreign(exc):
            raise
        raise NotACairnqDatabase(f"{path} is not a SQLite database cairnqd can use: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


def _enable_wal(conn: sqlite3.Connection, path: str, busy_timeout_ms: int) -> None:
    # Switching to WAL answers SQLITE_BUSY at once instead of honouring busy_timeout
    # while another process holds the file, so retry it.
    deadline = time.monotonic() + max(busy_timeout_ms, 1) / 1000
    while True:
        try:
            mode = conn.execute("pragma journal_mode = wal").fetchone()
            if mode and str(mode[0]).lower() == "wal":
                return
            raise NotACairnqDatabase(f"{path}: cannot switch to WAL (got {mode})")
        except sqlite3.OperationalError as exc:
            if not is_sqlite_busy(exc) or time.monotonic() > deadline:
                raise
            time.sleep(_WAL_RETRY_S)


def refresh_statistics(conn: sqlite3.Connection) -> None:
    """Without statistics the planner guesses half the table is `running` and skips
    the partial lease index; before 3.46 `pragma optimize` never creates the first
    statistics, so bootstrap them with an explicit ANALYZE."""
    try:
        has_stats = (
            conn.execute("select 1 from sqlite_master where name = 'sqlite_stat1'").fetchone()
            and conn.execute(
                "select 1 from sqlite_stat1 where tbl = 'cairnq_tasks' limit 1"
            ).fetchone()
        )
        conn.execute("pragma optimize" if has_stats else "analyze cairnq_tasks")
    except sqlite3.OperationalError:
        pass  # best effort: busy or read-only; plans are still correct, just slower


def _check_protocol(conn: sqlite3.Connection, path: str) -> None:
    row = conn.execute(statement("sqlite", "protocol_version").text).fetchone()
    check_protocol_version(int(row[0]) if row else 0, path)


def _looks_foreign(exc: sqlite3.DatabaseError) -> bool:
    text = str(exc).lower()
    return "not a database" in text or "file is encrypted" in text


def is_plain_file(path: str) -> bool:
    """A file path (not `:memory:`, not a `file:` URI the operator wrote themselves)."""
    return not is_memory(path) and not path.startswith("file:")


def ensure_file(path: str) -> bool:
    """Create `path` (an empty database, 0600 under the umask) and its directory if
    missing; True if it was created."""
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    return True


#: Database files this process knows exist (see `known_file_uri`).
_known_files: set[str] = set()


def remember_file(path: str) -> None:
    """Note that `path` names an existing database this process works on: from now on
    `known_file_uri(path)` never lets it be created again."""
    if is_plain_file(path):
        _known_files.add(os.path.abspath(os.path.expanduser(path)))


def known_file_uri(path: str) -> str:
    """`existing_file_uri(path)` once `remember_file(path)` was called, else `path`
    (which creates the file if missing)."""
    if is_plain_file(path) and os.path.abspath(os.path.expanduser(path)) in _known_files:
        return existing_file_uri(path)
    return path


def existing_file_uri(path: str) -> str:
    """A URI that opens `path` read-write and never creates it (SQLite's `mode=rw`);
    `path` itself when it is not a plain file path."""
    if not is_plain_file(path):
        return path
    absolute = os.path.abspath(os.path.expanduser(path))
    return f"file:{urllib.parse.quote(absolute)}?mode=rw"


@dataclass(frozen=True)
class FileId:
    device: int
    inode: int

    def __str__(self) -> str:
        return f"device {self.device}, inode {self.inode}"


def file_id(path: str) -> FileId | None:
    """Which file `path` names now; None if it names none."""
    try:
        st = os.stat(Path(path).expanduser())
    except FileNotFoundError:
        return None
    return FileId(st.st_dev, st.st_ino)


class DatabaseFile:
    """Whether `path` still names the database file a process opened.

    `remember()` right after opening; then `check()` as often as wanted (a `stat`).
    Once the file is found gone or replaced, `lost` says how, for good: the open
    connections are on a file nobody else will see again.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.opened: FileId | None = None
        self.lost: str | None = None

    def remember(self) -> None:
        """Note the file just opened; if the path already names none, it is lost."""
        if self.opened is None and self.lost is None:
            self.opened = file_id(self.path)
            if self.opened is None:
                self.lost = f"database file {self.path} was deleted while open"

    def check(self) -> str | None:
        """How the path no longer names the opened file, or None while it does."""
        if self.lost is None and self.opened is not None:
            now = file_id(self.path)
            if now is None:
                self.lost = f"database file {self.path} was deleted while open ({self.opened})"
            elif now != self.opened:
                self.lost = (
                    f"database file {self.path} was replaced by another file while open "
                    f"(opened {self.opened}; the path now names {now})"
                )
        return self.lost


__all__ = [
    "DatabaseFile",
    "FileId",
    "ensure_file",
    "existing_file_uri",
    "file_id",
    "is_memory",
    "is_plain_file",
    "known_file_uri",
    "open_database",
    "refresh_statistics",
    "remember_file",
]
