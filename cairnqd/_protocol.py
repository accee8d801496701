"""Load the protocol's SQL files and prepare them for a driver.

The files are the contract; this module only finds them, strips comments, rewrites
optional filters for the filters a caller actually supplied, and (for Postgres) turns
`:name` parameters into psycopg placeholders. Every transformation is memoized per
statement and filter set: the claim loop asks for the same few texts thousands of
times a second.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Dialect = Literal["sqlite", "postgres"]

# `:name` but not `::cast`, and not inside an identifier.
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_LINE_COMMENT = re.compile(r"--[^\n]*")
_OPTIONAL_FILTER = re.compile(
    r"\(\s*:(\w+)(?:::\w+)?\s+is\s+null\s+or\s+([\w.]+)\s*=\s*:\1\s*\)", re.I
)


def protocol_root() -> Path:
    """The folder holding migrations/, sql/ and extensions/.

    A wheel carries it as `cairnqd/_protocol_files`; a source checkout (editable
    install, tests) reads the repository's `protocol/` directly, so a stale copy can
    never shadow the files being edited.
    """
    package_dir = Path(__file__).resolve().parent
    source_tree = package_dir.parent / "protocol"
    if (source_tree / "sql").is_dir():
        return source_tree
    bundled = package_dir / "_protocol_files"
    if (bundled / "sql").is_dir():
        return bundled
    raise FileNotFoundError(
        f"cairnqd protocol files not found in {source_tree} or {bundled}; "
        "the installation is incomplete"
    )


@dataclass(frozen=True)
class Statement:
    """One executable statement: the text for the driver and the names it binds.

    A *row statement* (`row_width` > 0; SQLite's insert_many) binds no names: its text
    ends in one `values` row of `row_width` `?` placeholders, which `rows_text`
    repeats once per row to bind."""

    name: str
    text: str
    params: tuple[str, ...]
    row_width: int = 0


def strip_comments(sql: str) -> str:
    return _LINE_COMMENT.sub("", sql)


@functools.cache
def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _statement_path(dialect: Dialect, name: str) -> Path:
    """`name` is looked up in sql/ then extensions/sql/; `extensions/<name>` asks for
    the extension file only (the ledger statements exist in both, one per ledger)."""
    root = protocol_root()
    folders = [root / "sql" / dialect, root / "extensions" / "sql" / dialect]
    if name.startswith("extensions/"):
        name, folders = name.removeprefix("extensions/"), folders[1:]
    for folder in folders:
        candidate = folder / f"{name}.sql"
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no statement {name!r} for {dialect} under {root}")


def raw_sql(dialect: Dialect, name: str) -> str:
    """The statement's file text, comments stripped."""
    return strip_comments(_read(_statement_path(dialect, name))).strip().rstrip(";")


def specialize(sql: str, supplied: frozenset[str]) -> str:
    """Rewrite each optional filter `(:p is null or col = :p)` for the call at hand:
    `col = :p` when `p` is supplied, `true` when it is not.

    An `or` with a bind parameter hides the index from both planners; once the
    caller has told us which filters are set, the predicate is a plain equality or
    nothing at all (which also spares Postgres from typing a bare NULL parameter).
    """

    def rewrite(match: re.Match[str]) -> str:
        param, column = match.group(1), match.group(2)
        return f"{column} = :{param}" if param in supplied else "true"

    return _OPTIONAL_FILTER.sub(rewrite, sql)


def to_psycopg(sql: str) -> str:
    # psycopg reads `%` as the start of a placeholder; a literal one must be doubled.
    escaped = sql.replace("%", "%%")
    return _PARAM.sub(lambda m: f"%({m.group(1)})s", escaped)


@functools.cache
def statement(dialect: Dialect, name: str, supplied: frozenset[str] = frozenset()) -> Statement:
    """The ready-to-run statement `name`, specialized for the `supplied` filters."""
    sql = specialize(raw_sql(dialect, name), supplied)
    params = tuple(dict.fromkeys(_PARAM.findall(sql)))
    text = to_psycopg(sql) if dialect == "postgres" else sql
    # Postgres reads `?` as a jsonb operator; only SQLite's statements mean a placeholder.
    row_width = sql.count("?") if dialect == "sqlite" and not params else 0
    return Statement(name=name, text=text, params=params, row_width=row_width)


def composed(dialect: Dialect, name: str, parts: Mapping[str, str]) -> Statement:
    """Statement `name` with each `{part}` its text holds replaced by `parts[part]`:
    for the few statements whose shape follows the caller's configuration (a limited
    claim's partitions and exclusions). What is put in must be SQL the caller built
    from checked names; values still travel as `:name` parameters."""
    sql = raw_sql(dialect, name)
    for part, text in parts.items():
        marker = "{" + part + "}"
        if marker not in sql:
            raise ValueError(f"statement {name!r} has no {marker} to fill")
        sql = sql.replace(marker, text)
    params = tuple(dict.fromkeys(_PARAM.findall(sql)))
    text = to_psycopg(sql) if dialect == "postgres" else sql
    return Statement(name=name, text=text, params=params)


@functools.lru_cache(maxsize=64)
def rows_text(stmt: Statement, rows: int) -> str:
    """The text of row statement `stmt` with its `values` row repeated `rows` times."""
    head, keyword, row = stmt.text.rpartition("values")
    if not keyword or row.count("?") != stmt.row_width or not stmt.row_width:
        raise ValueError(f"{stmt.name} is not a row statement")
    return f"{head}values {', '.join([row.strip()] * rows)}"


@dataclass(frozen=True)
class Migration:
    """A migration file and the ledger it is recorded in."""

    name: str  # the ledger name: the file name, `.sql` included
    sql: str
    ledger: Literal["cairnq", "cairnqd"]


def migrations(dialect: Dialect) -> list[Migration]:
    """Shared migrations first (upstream's ledger), then cairnqd's own extensions."""
    root = protocol_root()
    found: list[Migration] = []
    for folder, ledger in (
        (root / "migrations" / dialect, "cairnq"),
        (root / "extensions" / "migrations" / dialect, "cairnqd"),
    ):
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.sql")):
            found.append(Migration(path.name, _read(path), ledger))  # type: ignore[arg-type]
    return found


def on_demand(dialect: Dialect, name: str) -> list[str]:
    """The statements of `extensions/on_demand/<dialect>/<name>.sql`, one by one:
    schema objects that only some databases want (the dashboard's indexes), made by the
    feature that wants them rather than by a migration. Each statement ends with `;`
    and holds none inside it."""
    path = protocol_root() / "extensions" / "on_demand" / dialect / f"{name}.sql"
    statements = strip_comments(_read(path)).split(";")
    return [" ".join(s.split()) for s in statements if s.strip()]
