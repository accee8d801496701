"""What blocks the database when a worker's calls make no progress, in a sentence for
the log (or None): on Postgres the sessions holding awaited locks, on SQLite the
processes with the file open. Asked once per stall from a child's heartbeat thread.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cairnqd._protocol import raw_sql

#: How long the Postgres look may take, connecting included.
_LOOK_TIMEOUT_S = 3


def postgres_blockers(dsn: str) -> str | None:
    """The sessions holding the locks others wait on, or None (none, or unreachable)."""
    import psycopg  # a SQLite daemon never loads the driver

    try:
        with psycopg.connect(
            dsn,
            autocommit=True,
            connect_timeout=_LOOK_TIMEOUT_S,
            options=f"-c statement_timeout={_LOOK_TIMEOUT_S * 1000}",
        ) as conn:
            rows = conn.execute(raw_sql("postgres", "lock_blockers")).fetchall()
    except psycopg.Error:
        return None
    if not rows:
        return None
    return "; ".join(_describe_session(row) for row in rows)


def _describe_session(row: tuple[Any, ...]) -> str:
    pid, user, app, addr, state, held_s, query = row
    who = f"pid {pid} ({user}" + (f", {app}" if app else "") + (f", {addr}" if addr else "") + ")"
    held = f", in a transaction for {held_s:.0f}s" if held_s is not None else ""
    return f"session {who} {state}{held}: {query!r}"


def sqlite_lock_holders(path: str, *, ours: frozenset[int] = frozenset()) -> str:
    """Say that another connection holds SQLite's write lock, naming the processes
    (other than `ours`) that have the file or its WAL open."""
    target = Path(path).resolve()
    names = {str(target), f"{target}-wal"}
    holders: list[str] = []
    for entry in _proc_entries():
        pid = int(entry.name)
        if pid in ours:
            continue
        if any(link in names for link in _open_files(entry)):
            holders.append(f"pid {pid} ({_command(entry)})")
    where = f"SQLite's write lock on {target} is held by another connection"
    if not holders:
        return where
    shown = ", ".join(holders[:5]) + (f" and {len(holders) - 5} more" if len(holders) > 5 else "")
    return f"{where}; processes with the file open: {shown}"


def _proc_entries() -> list[Path]:
    try:
        return [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    except OSError:
        return []


def _open_files(proc: Path) -> list[str]:
    try:
        fds = list((proc / "fd").iterdir())
    except OSError:
        return []  # gone, or not ours to read
    links = []
    for fd in fds:
        try:
            links.append(os.readlink(fd))
        except OSError:
            continue
    return links


def _command(proc: Path) -> str:
    try:
        raw = (proc / "cmdline").read_bytes()
    except OSError:
        return "?"
    text = raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()
    return text[:80] or "?"
