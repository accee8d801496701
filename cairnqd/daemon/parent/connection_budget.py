"""The Postgres connection budget: what the configuration opens across all hosts,
checked once against what it opens them on, before the parent starts any child.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from cairnqd.config import Config
from cairnqd.daemon.boot import child_push

# Logged as the supervisor's start-up, which is where this runs.
log = logging.getLogger("cairnqd.supervisor")


@dataclass(frozen=True)
class HostNeeds:
    """Connections one host opens at most: through `database.dsn` and on `direct_dsn`."""

    pooled: int
    direct: int


def host_needs(config: Config) -> HostNeeds:
    """Per child its pool, plus a LISTEN of its own unless the parent relays wake-ups
    or none work (transaction pooler). Per parent the maintenance and metrics
    connections, the scheduler's with `schedules:`, the dashboard's when it is served
    (or reports); the leadership sessions (the
    purge lock, the stats leader's with `metrics.queue_stats: leader`, the scheduler's)
    go to `direct_dsn` when set and need none behind a transaction pooler without it
    (lease rows); with `direct_dsn` also the parent's one LISTEN (two with `limits:`,
    the second for tasks settling), and one for the migrations and the checks each of
    the parent's stores makes when it connects."""
    db = config.database
    own_listen = child_push(db) == "listen"
    per_child = db.connections_per_child + (1 if own_listen else 0)
    children = sum(g.processes for g in config.groups.values())
    pooled = children * per_child + 2 + (1 if config.schedules else 0)
    if config.dashboard.listen is not None or config.dashboard.report:
        pooled += 1  # the dashboard's database thread (serving, or reporting only)
    sessions = 1 + (1 if config.metrics.queue_stats == "leader" else 0)
    sessions += 1 if config.schedules else 0
    direct = 0
    if db.direct_dsn is not None:
        direct = sessions + 2  # the LISTEN, and migrations or the proving NOTIFY
        direct += 1 if config.limits else 0  # the settlements' LISTEN (wakerelay.py)
    elif db.pooler != "transaction":
        pooled += sessions
    return HostNeeds(pooled, direct)


def connection_budget(config: Config) -> int:
    """Connections the configuration opens across all hosts, pooled and direct."""
    needs = host_needs(config)
    return config.database.expected_hosts * (needs.pooled + needs.direct)


def server_budget(config: Config) -> int:
    """Of those, the ones that are server connections: all of them without a pooler,
    only those on `direct_dsn` behind one."""
    needs = host_needs(config)
    per_host = needs.pooled + needs.direct if config.database.pooler == "none" else needs.direct
    return config.database.expected_hosts * per_host


def check_connection_budget(config: Config) -> str | None:
    """A refusal message when the budget exceeds the server's limit and
    `database.connection_check` is `refuse`; logs a warning for `warn`."""
    db = config.database
    if db.backend != "postgres" or db.connection_check == "off":
        return None
    try:
        limits = asyncio.run(_connection_limits(config))
    except Exception as exc:  # the children will wait for the database; say so and go on
        log.warning("could not check the connection budget: %s", exc)
        return None
    if limits is None:
        return None
    message = over_budget(config, *limits)
    if message is not None and db.connection_check == "warn":
        log.warning("%s", message)
        return None
    return message


def over_budget(config: Config, limit: int, reserved: int) -> str | None:
    """Why the budget does not fit (the pooler's pool under `session`, the server's
    limits for the rest), or None if it does."""
    db = config.database
    needs, hosts = host_needs(config), db.expected_hosts
    if db.pooler == "session" and db.pool_size is not None and hosts * needs.pooled > db.pool_size:
        return (
            f"the configuration holds up to {hosts * needs.pooled} connections of the "
            f"session pooler's pool at once ({hosts} host(s) x {needs.pooled} each) but "
            f"database.pool_size is {db.pool_size}; raise the pooler's pool_size (and "
            "database.pool_size), lower groups.*.processes or database.connections_per_child, "
            "use pooler: transaction with direct_dsn, or set database.connection_check: warn"
        )
    available = limit - reserved
    needed = server_budget(config)
    if needed <= available:
        return None
    if db.pooler == "none":
        return (
            f"the configuration opens up to {needed} Postgres connections "
            f"({hosts} host(s)) but the server allows {available} "
            f"(max_connections {limit} - superuser_reserved_connections {reserved}); lower "
            "groups.*.processes or database.connections_per_child, raise max_connections, "
            "put a pooler in front (database.pooler), or set database.connection_check: warn"
        )
    return (
        f"the configuration opens up to {needed} direct Postgres connections on "
        f"database.direct_dsn ({hosts} host(s) x {needs.direct} each) but the server "
        f"allows {available} (max_connections {limit} - superuser_reserved_connections "
        f"{reserved}), before counting the pooler's own; raise max_connections, or set "
        "database.connection_check: warn"
    )


def describe_budget(config: Config, limit: int, reserved: int) -> str:
    """What fits, for `cairnqd check --connect`: each host's needs and their limits."""
    db = config.database
    needs, hosts = host_needs(config), db.expected_hosts
    available = limit - reserved
    if db.pooler == "none":
        return f"up to {connection_budget(config)} of {available} available ({hosts} host(s))"
    pool = f"pool_size {db.pool_size}" if db.pool_size is not None else "pool_size not set"
    held = (
        f"{needs.pooled} held through the pooler ({pool})"
        if db.pooler == "session"
        else f"{needs.pooled} multiplexed by the pooler"
    )
    return (
        f"each of {hosts} host(s): {held}, {needs.direct} direct; "
        f"{server_budget(config)} direct of {available} available on the server"
    )


async def _connection_limits(config: Config) -> tuple[int, int] | None:
    from cairnqd.store.factory import store_for

    return await store_for(config.database, "background").server_connection_limits()
