"""The plans the SQL comments argue for, pinned (docs/protocol.md §9.3, #probe-before-claim,
#probe-seq-scan, #specialize-filters).

SQLite: `EXPLAIN QUERY PLAN` of the exact text the store runs (`statement(...)`, bound by
`sqlite_statements.bind`) on a seeded, analyzed database. Postgres: `EXPLAIN` on a seeded,
analyzed table, both as the store sends it (custom plan, parameters known) and as a
prepared statement settles after a few runs (generic plan).
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import psycopg
import pytest
from psycopg import sql as psql

from cairnqd._protocol import _PARAM, raw_sql, specialize, statement
from cairnqd.store.base import wall_clock_ms
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.postgres import connect as pg_connect
from cairnqd.store.sqlite import SQLiteStore
from cairnqd.store.sqlite import statements as sqlite_statements

TEMP_SORT = "USE TEMP B-TREE FOR ORDER BY"
CLAIM_SEARCH = re.compile(
    r"SEARCH cairnq_tasks USING (COVERING )?INDEX cairnq_tasks_claim(_name)?_idx"
    r" \(queue=\? AND status=\?"
)

# -- SQLite ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seeded_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    """6,000 tasks over 3 queues and 4 names, every status, keys on half, then ANALYZE."""
    import asyncio

    path = str(tmp_path_factory.mktemp("plans") / "plans.db")

    async def create() -> None:
        store = SQLiteStore(path)
        await store.connect()
        await store.close()

    asyncio.run(create())
    now = int(time.time() * 1000)
    rows = []
    for i in range(6000):
        kind = i % 10
        if kind < 3:
            status, lease, worker, done = "queued", None, None, None
        elif kind == 3:
            status, lease, worker, done = "running", now + 60_000, "w", None
        else:
            status = ("succeeded", "failed", "canceled")[kind % 3]
            lease, worker, done = None, "w", now - 100_000 + i
        rows.append(
            (
                f"task_{i:026d}",
                ("a", "b", "c", "d")[i % 4],
                ("default", "gpu", "io")[i % 3],
                status,
                i % 5,
                worker,
                lease,
                now - 1000 + i,
                now - 5000 + i,
                now,
                done,
            )
        )
    with closing(sqlite3.connect(path)) as conn:
        conn.executemany(
            """insert into cairnq_tasks (id, name, queue, status, payload, metadata, attempt,
                   max_attempts, priority, worker_id, lease_until_ms, run_at_ms, created_at_ms,
                   updated_at_ms, completed_at_ms)
               values (?, ?, ?, ?, '{}', '{}', 1, 3, ?, ?, ?, ?, ?, ?, ?)""",
            rows,
        )
        conn.executemany(
            "insert into cairnq_task_keys values (?, ?, ?, ?)",
            [(f"key-{i}", f"task_{i:026d}", now, now) for i in range(0, 6000, 2)],
        )
        conn.commit()
        conn.execute("analyze")
    conn = sqlite3.connect(path)
    try:
        yield conn
    finally:
        conn.close()


def sqlite_plan(
    conn: sqlite3.Connection,
    op: str,
    params: dict[str, Any],
    supplied: frozenset[str] = frozenset(),
) -> list[str]:
    stmt = statement("sqlite", op, supplied)
    bound = sqlite_statements.bind(stmt, params, wall_clock_ms)
    return [row[3] for row in conn.execute("explain query plan " + stmt.text, bound).fetchall()]


def _show(plan: list[str]) -> str:
    return "\n".join(plan)


CLAIM = {"worker_id": "w", "lease_ms": 30_000, "limit": 10}
SINGLE_QUEUE_CLAIMS = [
    ("claim_one_queue", {"queue": "gpu", "names": None}),
    ("claim_one_queue", {"queue": "gpu", "names": ["a", "b"]}),
    ("claim_one_queue_one_name", {"queue": "gpu", "name": "a"}),
]
MULTI_QUEUE_CLAIMS = [
    ("claim", {"queues": ["gpu", "io"], "names": None}),
    ("claim", {"queues": ["gpu", "io"], "names": ["a", "b"]}),
    ("claim_one_name", {"queues": ["gpu", "io"], "name": "a"}),
]


@pytest.mark.parametrize(("op", "params"), SINGLE_QUEUE_CLAIMS + MULTI_QUEUE_CLAIMS)
def test_sqlite_claims_search_a_claim_index(
    seeded_sqlite: sqlite3.Connection, op: str, params: dict[str, Any]
) -> None:
    plan = sqlite_plan(seeded_sqlite, op, {**CLAIM, **params})
    assert any(CLAIM_SEARCH.search(line) for line in plan), _show(plan)
    assert not any(line.startswith("SCAN cairnq_tasks") for line in plan), _show(plan)
    if "name" in params:
        assert any("cairnq_tasks_claim_name_idx" in line and "name=?" in line for line in plan), (
            _show(plan)
        )


@pytest.mark.parametrize(("op", "params"), SINGLE_QUEUE_CLAIMS + MULTI_QUEUE_CLAIMS)
def test_sqlite_claims_update_the_rows_they_drew_by_rowid(
    seeded_sqlite: sqlite3.Connection, op: str, params: dict[str, Any]
) -> None:
    """The update goes to each drawn row by its rowid, never through the primary key's
    index on id first (protocol/sql/sqlite/claim.sql)."""
    plan = sqlite_plan(seeded_sqlite, op, {**CLAIM, **params})
    assert any(
        line.startswith("SEARCH cairnq_tasks USING INTEGER PRIMARY KEY (rowid=?)") for line in plan
    ), _show(plan)
    assert not any("sqlite_autoindex_cairnq_tasks" in line for line in plan), _show(plan)


@pytest.mark.parametrize(("op", "params"), SINGLE_QUEUE_CLAIMS)
def test_sqlite_single_queue_claims_read_in_claim_order(
    seeded_sqlite: sqlite3.Connection, op: str, params: dict[str, Any]
) -> None:
    plan = sqlite_plan(seeded_sqlite, op, {**CLAIM, **params})
    assert TEMP_SORT not in plan, _show(plan)


@pytest.mark.parametrize(("op", "params"), MULTI_QUEUE_CLAIMS)
def test_sqlite_multi_queue_claims_sort_only_claimable_rows(
    seeded_sqlite: sqlite3.Connection, op: str, params: dict[str, Any]
) -> None:
    """With several queues (a json_each list) no index yields claim order across them,
    so SQLite sorts (docs/protocol.md §6.2: a list filter sorts the claimable backlog). What must
    hold is that the rows sorted come from an index range, not a table scan."""
    plan = sqlite_plan(seeded_sqlite, op, {**CLAIM, **params})
    assert any(CLAIM_SEARCH.search(line) for line in plan), _show(plan)


PURGE = {"older_than_ms": 0, "limit": 1000}


def test_sqlite_unfiltered_purge_reads_completed_index(seeded_sqlite: sqlite3.Connection) -> None:
    plan = sqlite_plan(seeded_sqlite, "purge", PURGE)
    assert any("USING INDEX cairnq_tasks_completed_idx" in line for line in plan), _show(plan)
    assert TEMP_SORT not in plan, _show(plan)


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({"status": "failed"}, "cairnq_tasks_status_completed_idx"),
        ({"queue": "gpu"}, "cairnq_tasks_queue_completed_idx"),
        ({"queue": "gpu", "name": "a"}, "cairnq_tasks_queue_completed_idx"),
    ],
    ids=["status", "queue", "queue+name"],
)
def test_sqlite_filtered_purge_reaches_its_index(
    seeded_sqlite: sqlite3.Connection, filters: dict[str, str], index: str
) -> None:
    plan = sqlite_plan(seeded_sqlite, "purge", {**PURGE, **filters}, frozenset(filters))
    assert any(f"INDEX {index} (" in line for line in plan), _show(plan)
    assert TEMP_SORT not in plan, _show(plan)


def test_sqlite_stats_with_queue_uses_an_index(seeded_sqlite: sqlite3.Connection) -> None:
    plan = sqlite_plan(seeded_sqlite, "stats", {"queue": "gpu"}, frozenset({"queue"}))
    assert any(re.match(r"SEARCH cairnq_tasks USING .*INDEX \w+ \(queue=\?", p) for p in plan), (
        _show(plan)
    )


def test_sqlite_queue_depth_searches_the_claim_index(seeded_sqlite: sqlite3.Connection) -> None:
    plan = sqlite_plan(seeded_sqlite, "queue_depth", {"queue": "gpu", "max_depth": 100})
    assert any(CLAIM_SEARCH.search(line) for line in plan), _show(plan)
    assert not any(line.startswith("SCAN cairnq_tasks") for line in plan), _show(plan)


def test_sqlite_recover_leases_uses_lease_index(seeded_sqlite: sqlite3.Connection) -> None:
    plan = sqlite_plan(seeded_sqlite, "recover_leases", {"error": "{}"})
    assert any("INDEX cairnq_tasks_lease_idx (lease_until_ms" in line for line in plan), _show(plan)


def test_sqlite_renewals_probe_the_primary_key(seeded_sqlite: sqlite3.Connection) -> None:
    # json_each hides how short the list is: the `+status` keeps the planner from
    # walking every running row instead of probing each id (renew_leases.sql).
    items = json.dumps([{"id": "task_00001", "a": 1}, {"id": "task_00003", "a": 1}])
    params = {"items": items, "worker_id": "w", "lease_ms": 30_000}
    plan = sqlite_plan(seeded_sqlite, "extensions/renew_leases", params)
    probe = "SEARCH cairnq_tasks USING INDEX sqlite_autoindex_cairnq_tasks_1 (id=?)"
    assert probe in plan, _show(plan)
    assert not any(line.startswith("SCAN cairnq_tasks") for line in plan), _show(plan)


@pytest.mark.parametrize(
    "params",
    [{"queues": ["gpu"], "names": None}, {"queues": ["gpu", "io"], "names": ["a", "b"]}],
    ids=["one-queue", "queues+names"],
)
def test_sqlite_claimable_probe_uses_indexes(
    seeded_sqlite: sqlite3.Connection, params: dict[str, Any]
) -> None:
    plan = sqlite_plan(seeded_sqlite, "claimable_probe", params)
    assert any("INDEX cairnq_tasks_lease_idx (lease_until_ms" in line for line in plan), _show(plan)
    assert any(CLAIM_SEARCH.search(line) for line in plan), _show(plan)
    assert not any(line.startswith("SCAN cairnq_tasks") for line in plan), _show(plan)


def test_sqlite_key_cascade_uses_cairnqd_index(seeded_sqlite: sqlite3.Connection) -> None:
    # What the ON DELETE CASCADE of a purged task runs against the key table.
    plan = [
        row[3]
        for row in seeded_sqlite.execute(
            "explain query plan delete from cairnq_task_keys where task_id = ?", ("task_x",)
        ).fetchall()
    ]
    assert any("INDEX cairnqd_task_keys_task_id_idx (task_id=?)" in line for line in plan), _show(
        plan
    )


# -- Postgres ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seeded_pg() -> Iterator[str]:
    """~20k terminal rows, a few queued and running ones, then ANALYZE
    (docs/protocol.md#probe-seq-scan)."""
    import asyncio

    from tests.support.databases import PgDatabases, require_postgres

    require_postgres()
    dbs = PgDatabases()
    try:
        dsn = dbs.new()

        async def create() -> None:
            store = PostgresStore(dsn, max_size=1)
            await store.connect()
            await store.close()

        asyncio.run(create())
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                """insert into cairnq_tasks (id, name, queue, status, payload, metadata, attempt,
                       max_attempts, priority, worker_id, run_at_ms, created_at_ms,
                       updated_at_ms, completed_at_ms)
                   select 'task_t' || lpad(g::text, 25, '0'), 'n' || (g % 4), 'q' || (g % 20),
                          (array['succeeded', 'failed', 'canceled'])[1 + g % 3], '{}', '{}',
                          1, 3, 0, 'w', 1000 + g, 1000 + g, 2000 + g, 3000 + g
                   from generate_series(1, 20000) as g"""
            )
            conn.execute(
                """insert into cairnq_tasks (id, name, queue, status, payload, metadata, attempt,
                       max_attempts, priority, run_at_ms, created_at_ms, updated_at_ms)
                   select 'task_q' || lpad(g::text, 25, '0'), 'n' || (g % 4), 'default',
                          'queued', '{}', '{}', 0, 3, 0, 5000 + g, 5000 + g, 5000 + g
                   from generate_series(1, 5) as g"""
            )
            conn.execute(
                """insert into cairnq_tasks (id, name, queue, status, payload, metadata, attempt,
                       max_attempts, priority, worker_id, lease_until_ms, run_at_ms,
                       created_at_ms, updated_at_ms)
                   select 'task_r' || lpad(g::text, 25, '0'), 'n1', 'default', 'running',
                          '{}', '{}', 1, 3, 0, 'w', 9999999999999, 100, 100, 100
                   from generate_series(1, 3) as g"""
            )
            conn.execute("analyze cairnq_tasks")
        yield dsn
    finally:
        dbs.drop_all()


#: A renewal of the seeded running tasks, and of one finished.
RENEWAL_ITEMS = json.dumps(
    [{"id": f"task_r{g:025d}", "a": 1} for g in (1, 2, 3)] + [{"id": f"task_t{7:025d}", "a": 1}]
)

PG_CASES = [
    ("claimable_probe", {"queues": ["default"], "names": None}),
    ("claimable_probe", {"queues": ["default", "gpu"], "names": ["n1", "n2"]}),
    ("claim_one_queue", {**CLAIM, "queue": "default", "names": None}),
    ("claim_one_queue", {**CLAIM, "queue": "default", "names": ["n1"]}),
    ("claim_one_queue_one_name", {**CLAIM, "queue": "default", "name": "n1"}),
    ("recover_leases", {"error": "{}"}),
]
PG_IDS = [
    "probe",
    "probe-filtered",
    "claim-one-queue",
    "claim-one-queue-names",
    "claim-1q-1n",
    "recover",
]


def _pg_explain_custom(dsn: str, op: str, params: dict[str, Any]) -> list[str]:
    stmt = statement("postgres", op)
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("explain " + stmt.text, pg_connect.bind(stmt, params)).fetchall()  # type: ignore[arg-type]
    return [r[0] for r in rows]


def _pg_explain_generic(
    dsn: str, op: str, params: dict[str, Any], supplied: frozenset[str] = frozenset()
) -> list[str]:
    """The plan a prepared statement falls back to once its custom plans stop paying."""
    text = specialize(raw_sql("postgres", op), supplied)
    names = list(dict.fromkeys(_PARAM.findall(text)))
    positional = _PARAM.sub(lambda m: f"${names.index(m.group(1)) + 1}", text)
    values = pg_connect.bind(statement("postgres", op, supplied), params)
    with psycopg.connect(dsn) as conn:
        conn.execute("set plan_cache_mode = force_generic_plan")
        conn.execute(f"prepare probe as {positional}")  # type: ignore[arg-type]
        # EXECUTE's arguments cannot carry parameter types, so they go in as literals.
        arguments = psql.SQL(", ").join(psql.Literal(values[n]) for n in names)
        rows = conn.execute(psql.SQL("explain execute probe({})").format(arguments)).fetchall()
    return [r[0] for r in rows]


@pytest.mark.parametrize(("op", "params"), PG_CASES, ids=PG_IDS)
@pytest.mark.parametrize("mode", ["custom", "generic"])
def test_postgres_hot_statements_never_scan_the_table(
    seeded_pg: str, op: str, params: dict[str, Any], mode: str
) -> None:
    explain = _pg_explain_custom if mode == "custom" else _pg_explain_generic
    plan = explain(seeded_pg, op, params)
    assert not any("Seq Scan on cairnq_tasks" in line for line in plan), "\n".join(plan)
    if mode == "generic":
        # A generic plan names its parameters instead of the values bound above.
        assert not any("'default'::text" in line for line in plan), "\n".join(plan)


@pytest.mark.parametrize("mode", ["custom", "generic"])
def test_postgres_renewals_probe_the_primary_key(seeded_pg: str, mode: str) -> None:
    # Joined to the item list instead, the planner walked the lease or the status index
    # over every running task (renew_leases.sql).
    explain = _pg_explain_custom if mode == "custom" else _pg_explain_generic
    params = {"items": RENEWAL_ITEMS, "worker_id": "w", "lease_ms": 30_000}
    plan = explain(seeded_pg, "extensions/renew_leases", params)
    assert any("Index Scan using cairnq_tasks_pkey on cairnq_tasks" in line for line in plan), (
        "\n".join(plan)
    )
    walks = ("cairnq_tasks_lease_idx", "cairnq_tasks_status_")
    assert not any(index in line for line in plan for index in walks), "\n".join(plan)


def test_postgres_probe_arms_use_their_indexes(seeded_pg: str) -> None:
    plan = "\n".join(
        _pg_explain_custom(seeded_pg, "claimable_probe", {"queues": ["default"], "names": None})
    )
    assert "cairnq_tasks_lease_idx" in plan, plan
    assert re.search(r"Index (Only )?Scan using cairnq_tasks_claim(_name)?_idx", plan), plan


def test_postgres_single_queue_claim_reads_in_claim_order(seeded_pg: str) -> None:
    plan = "\n".join(
        _pg_explain_custom(
            seeded_pg, "claim_one_queue", {**CLAIM, "queue": "default", "names": None}
        )
    )
    assert "cairnq_tasks_claim_idx" in plan, plan
    # The draw walks the index in claim order: no sort of the claimable rows.
    assert not re.search(r"Sort Key: .*priority", plan), plan


PG_CLAIMS = [
    ("claim", {**CLAIM, "queues": ["default", "gpu"], "names": None}),
    ("claim_one_name", {**CLAIM, "queues": ["default", "gpu"], "name": "n1"}),
    ("claim_one_queue", {**CLAIM, "queue": "default", "names": ["n1"]}),
    ("claim_one_queue_one_name", {**CLAIM, "queue": "default", "name": "n1"}),
]


@pytest.mark.parametrize(("op", "params"), PG_CLAIMS, ids=[op for op, _ in PG_CLAIMS])
@pytest.mark.parametrize("mode", ["custom", "generic"])
def test_postgres_claims_update_the_rows_they_locked_by_address(
    seeded_pg: str, op: str, params: dict[str, Any], mode: str
) -> None:
    """The update reads the locked rows by their ctid (a TID scan), never by looking
    their ids up in the primary key again (protocol/sql/postgres/claim.sql)."""
    explain = _pg_explain_custom if mode == "custom" else _pg_explain_generic
    plan = "\n".join(explain(seeded_pg, op, params))
    assert re.search(r"Tid Scan on cairnq_tasks\b", plan), plan
    assert "cairnq_tasks_pkey" not in plan, plan
    assert "LockRows" in plan, plan


def test_postgres_key_cascade_uses_cairnqd_index(seeded_pg: str) -> None:
    with psycopg.connect(seeded_pg, autocommit=True) as conn:
        conn.execute(
            """insert into cairnq_task_keys
               select 'key-' || id, id, 1, 1 from cairnq_tasks where id like 'task_t%'"""
        )
        conn.execute("analyze cairnq_task_keys")
        rows = conn.execute(
            "explain delete from cairnq_task_keys where task_id = %s", ("task_x",)
        ).fetchall()
    plan = "\n".join(r[0] for r in rows)
    assert "cairnqd_task_keys_task_id_idx" in plan, plan


# -- optional-filter specialization (docs/protocol.md §6.12) -----------------------------

SPECIALIZED = [
    ("purge", frozenset({"queue"})),
    ("purge", frozenset({"status"})),
    ("purge", frozenset({"queue", "status", "name"})),
    ("stats", frozenset({"queue"})),
    ("list", frozenset({"status", "queue", "name", "root_id", "correlation_id"})),
]


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
@pytest.mark.parametrize(
    ("op", "supplied"), SPECIALIZED, ids=[f"{op}-{'+'.join(sorted(f))}" for op, f in SPECIALIZED]
)
def test_supplied_filters_are_specialized(dialect: str, op: str, supplied: frozenset[str]) -> None:
    """A supplied optional filter must become a plain equality: an `is null or` arm
    hides the index from SQLite always, and from a Postgres generic plan."""
    text = statement(dialect, op, supplied).text  # type: ignore[arg-type]
    for name in supplied:
        placeholder = f":{name}" if dialect == "sqlite" else f"%({name})s"
        arm = re.compile(re.escape(placeholder) + r"(::\w+)?\s+is\s+null", re.I)
        assert not arm.search(text), f"{op}: filter {name!r} left unspecialized:\n{text}"
        column = "status" if name == "status" else name
        assert f"{column} = {placeholder}" in text, text


def test_sqlite_top_window_reads_only_index_ranges(seeded_sqlite: sqlite3.Connection) -> None:
    """`cairnqd top`'s rates (TaskStore.recent_counts): the submits by the primary key,
    the ends by the completed index, never a scan of the table."""
    now = int(time.time() * 1000)
    # The seed's ids are its rows' order: the window holds its last few.
    submitted = sqlite_plan(
        seeded_sqlite, "extensions/recent_submitted", {"from_id": f"task_{5990:026d}"}
    )
    assert any(re.search(r"SEARCH cairnq_tasks USING .*\(id>\?\)", p) for p in submitted), _show(
        submitted
    )
    ended = sqlite_plan(seeded_sqlite, "extensions/recent_finished", {"since_ms": now - 5000})
    assert any("cairnq_tasks_completed_idx (completed_at_ms>?)" in p for p in ended), _show(ended)


@pytest.mark.parametrize("op", ["extensions/recent_submitted", "extensions/recent_finished"])
def test_postgres_top_window_never_scans_the_table(seeded_pg: str, op: str) -> None:
    # The window holds the seed's last few ids and ends.
    params = {"from_id": "task_t" + f"{19990:025d}", "since_ms": 3000 + 19990}
    plan = _pg_explain_custom(seeded_pg, op, params)
    assert not any("Seq Scan on cairnq_tasks" in line for line in plan), "\n".join(plan)
