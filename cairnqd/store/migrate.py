"""The migration runner: ledger-driven, one write transaction per migration.

Every connect walks all known migrations in order. Each gets its own write
transaction (SQLite `BEGIN IMMEDIATE`; Postgres an exclusive lock on the ledger table)
inside which the ledger is checked and, if the name is absent, the file runs and its
name is recorded. N processes cold-starting at once therefore serialize on the lock,
and every loser re-checks inside it and skips: each migration applies exactly once.

Two ledgers: upstream's `cairnq_migrations` for the shared files (same names as the
public SDKs, so each side sees the other's database as fully migrated) and
`cairnqd_migrations` for our own objects, so upstream's future file names can never
collide with ours. Unknown rows in either ledger are left alone (a newer SDK wrote them).
Each dialect's runner is its package's migrate.py; this module holds what they share.
"""

from __future__ import annotations

from pathlib import Path

from cairnqd._protocol import Dialect, migrations, protocol_root, strip_comments
from cairnqd.errors import ProtocolVersionMismatch

#: The storage protocol this code speaks: the `protocol_version` row its migrations
#: leave in the database, the same for SQLite and Postgres.
STORAGE_PROTOCOL_VERSION = 1


def check_protocol_version(found: int, where: str) -> None:
    """Refuse a database whose `protocol_version` row (`found`, 0 when absent) is not
    the one this code speaks; `where` names the database for the error."""
    if found != STORAGE_PROTOCOL_VERSION:
        raise ProtocolVersionMismatch(
            f"{where}: storage protocol_version={found}, "
            f"cairnqd supports {STORAGE_PROTOCOL_VERSION}"
        )


_LEDGER_FOLDER = {"cairnq": "sql", "cairnqd": "extensions/sql"}


def ledger_sql(dialect: Dialect, ledger: str, op: str) -> str:
    """Statement `op` of `ledger` ("cairnq" or "cairnqd") in `dialect`."""
    path = protocol_root() / _LEDGER_FOLDER[ledger] / dialect / f"{op}.sql"
    return strip_comments(Path(path).read_text(encoding="utf-8")).strip()


#: Each ledger's table, by ledger.
LEDGER_TABLES = {"cairnq": "cairnq_migrations", "cairnqd": "cairnqd_migrations"}


def pending(applied: dict[str, set[str]], dialect: Dialect) -> list[str]:
    """Known migrations of `dialect` missing from `applied` (names by ledger)."""
    return [m.name for m in migrations(dialect) if m.name not in applied[m.ledger]]
