"""Postgres DSN text: checked without echoing it, and redacted before it is shown,
since it may hold a password."""

from __future__ import annotations

import re


def redact_dsn(dsn: str) -> str:
    """Replace the password of a URL or key=value DSN with `***`."""
    scheme, sep, rest = dsn.partition("://")
    if sep:
        # libpq splits user info at the last '@' of the authority; mirror it.
        userinfo, at, host = rest.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        if at and colon:
            dsn = f"{scheme}://{user}:***@{host}"
    return re.sub(r"(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)", r"\1***", dsn)


def dsn_problem(dsn: str) -> str | None:
    """Why a string cannot be a libpq DSN; never echoes it, as it may hold a password."""
    scheme, sep, _ = dsn.partition("://")
    if sep and scheme not in ("postgres", "postgresql"):
        return f"unsupported scheme {scheme}://: expected postgresql://"
    if not sep and "=" not in dsn:
        return "expected a postgresql:// URL or key=value pairs (host=... dbname=...)"
    return None
