"""The Postgres connection budget: what the configuration opens across all hosts,
checked once against the server's limit before the parent starts any child.

`database.connection_check` decides what going over does: refuse to start, warn, or
nothing (`off`).
"""

from __future__ import annotations

import asyncio
import logging

from cairnqd.config import Config

# Logged as the supervisor's start-up, which is where this runs.
log = logging.getLogger("cairnqd.supervisor")


def connection_budget(config: Config) -> int:
    """Postgres connections the configuration opens across all hosts: per child its
    pool plus the LISTEN connection; per parent the maintenance and metrics
    connections and the purge lock's session, plus the stats leader's session with
    `metrics.queue_stats: leader`, the scheduler's two with schedules, and the
    dashboard's one when it is served."""
    per_child = config.database.connections_per_child + 1
    children = sum(g.processes for g in config.groups.values())
    parent = 3
    if config.metrics.queue_stats == "leader":
        parent += 1  # the stats collector holds its leader lock on a session of its own
    if config.schedules:
        parent += 2  # the scheduler's connection and its leader lock's session
    if config.dashboard.listen is not None or config.dashboard.report:
        parent += 1  # the dashboard's database thread (serving, or reporting only)
    return config.database.expected_hosts * (children * per_child + parent)


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
    """Why the budget does not fit a server with these limits, or None if it does."""
    db = config.database
    available = limit - reserved
    needed = connection_budget(config)
    if needed <= available:
        return None
    return (
        f"the configuration opens up to {needed} Postgres connections "
        f"({db.expected_hosts} host(s)) but the server allows {available} "
        f"(max_connections {limit} - superuser_reserved_connections {reserved}); lower "
        "groups.*.processes or database.connections_per_child, raise max_connections, "
        "or set database.connection_check: warn"
    )


async def _connection_limits(config: Config) -> tuple[int, int] | None:
    from cairnqd.store.factory import store_for

    return await store_for(config.database, "background").server_connection_limits()
