"""The migration ledgers and the storage protocol version, shared by each dialect's
runner (its package's migrate.py). One write transaction per migration, the ledger
checked inside it, so every migration applies exactly once however many processes start
together (docs/architecture.md, "Migrations").
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
