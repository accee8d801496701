"""Run inside a host (see netns.py): connect to Postgres, query, report as JSON lines.

    python pg_probe.py DSN [--connect-timeout S] [--keepalives] [--sleep S]

Prints {"event": "connected"} once connected and `select 1` came back, then runs
`select pg_sleep(S)` when asked to, and ends with {"event": "done", "ok": ...,
"error": ..., "elapsed_s": ...}: whether it all worked, libpq's error if not, and how
long it took from the start. A plain script: the test runs it in another namespace.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import psycopg

# libpq's keepalive and user-timeout settings at their shortest sensible values.
SHORT_KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 1,
    "keepalives_interval": 1,
    "keepalives_count": 2,
    "tcp_user_timeout": 3000,
}


def report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dsn")
    parser.add_argument("--connect-timeout", type=int, default=10)
    parser.add_argument("--keepalives", action="store_true")
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args(argv)
    params = SHORT_KEEPALIVES if args.keepalives else {}
    started = time.monotonic()
    try:
        with psycopg.connect(
            args.dsn, autocommit=True, connect_timeout=args.connect_timeout, **params
        ) as conn:
            conn.execute("select 1")
            report(event="connected")
            if args.sleep:
                conn.execute("select pg_sleep(%s)", [args.sleep])
    except psycopg.Error as exc:
        report(event="done", ok=False, error=str(exc), elapsed_s=time.monotonic() - started)
        return 1
    report(event="done", ok=True, error=None, elapsed_s=time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
