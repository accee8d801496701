"""The protocol's SQL files on disk, read the way the store's runners read them.

Shared by the tests/protocol/test_sql_*.py modules. Deliberately independent of
cairnqd._protocol: these modules test the files, not the store's loader.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "protocol"
DIALECTS = ("sqlite", "postgres")

_LINE_COMMENT = re.compile(r"--[^\n]*")
# A `:name` parameter, not a Postgres `::cast` nor a time literal's colon.
PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def migration_files(dialect: str) -> list[Path]:
    return sorted((ROOT / "migrations" / dialect).glob("*.sql"))


def extension_migration_files(dialect: str) -> list[Path]:
    return sorted((ROOT / "extensions" / "migrations" / dialect).glob("*.sql"))


def statement_files(dialect: str) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in (ROOT / "sql" / dialect, ROOT / "extensions" / "sql" / dialect):
        for path in sorted(folder.glob("*.sql")):
            found[f"{'sql' if folder.parent == ROOT / 'sql' else 'extensions'}/{path.stem}"] = path
    return found


def strip_comments(sql: str) -> str:
    return _LINE_COMMENT.sub("", sql)


def statement_text(dialect: str, op: str, *, extension: bool = False) -> str:
    folder = ROOT / ("extensions/sql" if extension else "sql") / dialect
    return strip_comments((folder / f"{op}.sql").read_text(encoding="utf-8")).strip()


def split_sqlite(sql: str) -> list[str]:
    """Statements of a SQLite migration, split the way the runners split them."""
    out: list[str] = []
    pending = ""
    for line in sql.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            if strip_comments(pending).strip().strip(";").strip():
                out.append(pending)
            pending = ""
    assert not strip_comments(pending).strip(), f"unterminated statement: {pending!r}"
    return out


def to_psycopg(sql: str) -> str:
    return PARAM.sub(lambda m: f"%({m.group(1)})s", strip_comments(sql).replace("%", "%%"))


def normalize(sql: str) -> str:
    return " ".join(strip_comments(sql).split()).lower()
