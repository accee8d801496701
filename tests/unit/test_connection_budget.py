"""The connection budget per pooler set-up: what each host opens through the pooler and
on direct_dsn, and what it is compared with (docs/operations.md, "Behind a pooler")."""

from __future__ import annotations

import textwrap
from pathlib import Path

from cairnqd.config import Config, load_config
from cairnqd.daemon.parent.connection_budget import (
    HostNeeds,
    connection_budget,
    describe_budget,
    host_needs,
    over_budget,
    server_budget,
)

BASE = """\
version: 1
database:
  dsn: postgresql://app@pgbouncer:6432/tasks
{database}
handlers: [cairnqd.demo:registry]
metrics:
  queue_stats: leader
groups:
  default:
    queues: [default]
    processes: 4
"""


def config(tmp_path: Path, database: str, extra: str = "") -> Config:
    path = tmp_path / "cairnq.yaml"
    path.write_text(BASE.format(database=textwrap.indent(textwrap.dedent(database), "  ")) + extra)
    return load_config(path, env={})


def test_without_a_pooler_every_connection_is_the_servers(tmp_path: Path) -> None:
    c = config(tmp_path, "expected_hosts: 2\n")
    # 4 children x (1 pool + 1 LISTEN) + maintenance, metrics, purge lock, stats leader.
    assert host_needs(c) == HostNeeds(pooled=12, direct=0)
    assert connection_budget(c) == server_budget(c) == 24
    assert over_budget(c, 27, 3) is None
    message = over_budget(c, 26, 3)
    assert message is not None and "opens up to 24 Postgres connections" in message


def test_session_pooler_counts_against_pool_size(tmp_path: Path) -> None:
    # The case: two hosts needing 24 connections of a session pool of 20.
    c = config(tmp_path, "pooler: session\npool_size: 20\nexpected_hosts: 2\n")
    assert host_needs(c) == HostNeeds(pooled=12, direct=0)
    message = over_budget(c, 100, 3)
    assert message is not None
    assert "up to 24 connections of the session pooler's pool" in message
    assert "2 host(s) x 12 each" in message and "database.pool_size is 20" in message
    fits = config(tmp_path, "pooler: session\npool_size: 24\nexpected_hosts: 2\n")
    assert over_budget(fits, 100, 3) is None
    assert "12 held through the pooler (pool_size 24)" in describe_budget(fits, 100, 3)


def test_transaction_pooler_counts_only_direct_connections(tmp_path: Path) -> None:
    without = config(tmp_path, "pooler: transaction\nexpected_hosts: 50\n")
    # No LISTEN per child, leadership by lease rows: nothing direct at all.
    assert host_needs(without) == HostNeeds(pooled=6, direct=0)
    assert server_budget(without) == 0
    assert over_budget(without, 10, 3) is None
    direct = config(
        tmp_path,
        "pooler: transaction\nexpected_hosts: 50\ndirect_dsn: postgresql://app@db/tasks\n",
    )
    # The parent's LISTEN, purge and stats sessions, one for migrations or its probe.
    assert host_needs(direct) == HostNeeds(pooled=6, direct=4)
    assert server_budget(direct) == 200
    message = over_budget(direct, 100, 3)
    assert message is not None and "200 direct Postgres connections" in message
    assert "50 host(s) x 4 each" in message
    assert describe_budget(direct, 300, 3).startswith("each of 50 host(s): 6 multiplexed")
