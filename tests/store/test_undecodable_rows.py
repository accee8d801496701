"""Rows another client wrote that this runtime cannot decode: one fails alone, at once.

Every bad row here is written with plain SQL beside the store, as another SDK or a
script would: SQLite text that is not UTF-8 (`json_valid` accepts it; `sqlite3` refuses
to fetch it), SQLite JSON nested deeper than Python decodes, Postgres jsonb nested 5,000
levels (Postgres accepts it; Python's decoder recurses out), a number Python refuses.
A claim must fail that row alone (status `failed`, an `undecodable_row` envelope
naming the column) and hand the good rows claimed with it, and those behind it, to the
worker untouched; reads must show the row, its text escaped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sqlite3
import sys
import traceback
from collections.abc import Callable
from contextlib import closing
from typing import Any

import psycopg
import pytest

from cairnqd._jsoncodec import MAX_JSON_DEPTH, Undecodable, dump_json
from cairnqd.context import TaskContext
from cairnqd.errors import SerializationError
from cairnqd.models import Task
from cairnqd.store.base import QuarantinedRow, TaskStore
from cairnqd.store.browse import TaskQuery
from cairnqd.worker import Worker
from tests.support.undecodable import (
    BAD_PRIORITY,
    POSTGRES_BAD,
    SQLITE_BAD,
    BadRow,
    insert_bad,
    nested,
    now_ms,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.timeout(120)

GOOD = 20


def bad_row_state(dialect: str, target: str) -> dict[str, Any]:
    """The bad row's settlement columns, read by plain SQL (none of them is odd)."""
    sql = (
        "select status, attempt, worker_id, lease_until_ms, completed_at_ms, error "
        f"from cairnq_tasks where priority = {BAD_PRIORITY}"
    )
    if dialect == "sqlite":
        with closing(sqlite3.connect(target)) as conn:
            conn.row_factory = sqlite3.Row
            found = dict(conn.execute(sql).fetchone())
        found["error"] = None if found["error"] is None else json.loads(found["error"])
        return found
    with psycopg.connect(target) as pg:
        cursor = pg.execute(sql)
        names = [d.name for d in cursor.description or ()]
        fetched = cursor.fetchone()
        assert fetched is not None
        return dict(zip(names, fetched, strict=True))


def bad_cases(dialect: str) -> dict[str, BadRow]:
    return SQLITE_BAD if dialect == "sqlite" else POSTGRES_BAD


def each_case(test: Callable[..., Any]) -> Any:
    """Run `test` for every bad row of both dialects (`dialect` and `case` params)."""
    cases = [("sqlite", name) for name in SQLITE_BAD] + [
        ("postgres", name) for name in POSTGRES_BAD
    ]
    return pytest.mark.parametrize(
        ("dialect", "case"),
        cases,
        ids=[f"{d}-{n}" for d, n in cases],
        indirect=["dialect"],
    )(test)


async def _submit_good(store: TaskStore) -> list[str]:
    tasks = await store.submit_many([{"name": "good", "payload": {"i": i}} for i in range(GOOD)])
    return [t.id for t in tasks]


@each_case
async def test_a_claim_fails_the_undecodable_row_alone_and_at_once(
    store: TaskStore, dialect: str, db_target: str, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    bad = bad_cases(dialect)[case]
    good_ids = await _submit_good(store)
    insert_bad(dialect, db_target, bad)
    seen: list[QuarantinedRow] = []
    store.on_undecodable = seen.append
    caplog.set_level(logging.WARNING, logger="cairnqd.store")

    # The bad row is drawn first, with three good ones beside it in the same batch.
    first = await store.claim(queues=["default"], worker_id="w1", limit=4, lease_ms=60_000)
    assert [t.name for t in first] == ["good"] * 3
    assert all(t.status == "running" and t.attempt == 1 for t in first)

    state = bad_row_state(dialect, db_target)
    assert state["status"] == "failed"
    assert (state["attempt"], state["worker_id"], state["lease_until_ms"]) == (1, "w1", None)
    assert state["completed_at_ms"] is not None
    error = state["error"]
    assert (error["type"], error["code"], error["retryable"]) == (
        "UndecodableRow",
        "undecodable_row",
        False,
    )
    assert error["details"]["column"] == bad.column
    assert bad.column in error["message"]
    assert error["details"]["reason"]

    # Counted and logged once, for this row only.
    assert store.undecodable_rows == 1
    assert len(seen) == 1 and seen[0].failed and seen[0].error.column == bad.column
    warnings = [r for r in caplog.records if "failed without running" in r.getMessage()]
    assert len(warnings) == 1 and bad.column in warnings[0].getMessage()

    # Every good task behind it is claimed too, each on its first attempt.
    claimed = {t.id: t for t in first}
    while len(claimed) < GOOD:
        more = await store.claim(queues=["default"], worker_id="w1", limit=5)
        assert more, f"claims stopped at {len(claimed)} of {GOOD} good tasks"
        claimed.update((t.id, t) for t in more)
    assert sorted(claimed) == sorted(good_ids)
    assert {t.attempt for t in claimed.values()} == {1}
    assert store.undecodable_rows == 1
    assert await store.claim(queues=["default"], worker_id="w1", limit=5) == []


@each_case
async def test_reads_show_the_undecodable_row_escaped(
    store: TaskStore, dialect: str, db_target: str, case: str
) -> None:
    bad = bad_cases(dialect)[case]
    await _submit_good(store)
    insert_bad(dialect, db_target, bad)

    listed = await store.list(limit=100)
    assert len(listed) == GOOD + 1
    (odd,) = [t for t in listed if t.priority == BAD_PRIORITY]
    _check_shown(odd, bad)
    if isinstance(bad.id, str):  # an id that is not text cannot be asked for by its text
        got = await store.get(odd.id)
        assert got is not None
        _check_shown(got, bad)

    stats = await store.stats()
    assert stats["default"]["queued"] == GOOD + 1
    page = await store.dashboard.browse(TaskQuery(limit=100))
    assert len(page) == GOOD + 1
    assert _escaped(bad.name) in {s.name for s in page}


def _escaped(value: str | bytes) -> str:
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def _check_shown(task: Task, bad: BadRow) -> None:
    assert task.id == _escaped(bad.id)
    assert task.name == _escaped(bad.name)
    if bad.column in ("payload", "metadata"):
        marker = getattr(task, bad.column)
        assert isinstance(marker, Undecodable), marker
        assert marker.reason
        written = getattr(bad, bad.column)
        assert marker.preview.startswith(_escaped(written)[:50])
        assert len(marker.preview) < 300  # cut short to stay readable


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
async def test_sqlite_text_not_utf8_in_a_scan_and_a_transaction(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    """Every read path meets the bad row: a scan read off the loop (`list`), a short
    read (`get`), a claim that settles results in the same transaction."""
    await _submit_good(store)
    insert_bad(dialect, db_target, SQLITE_BAD["name-not-utf8"])
    (held,) = await store.claim(queues=["default"], worker_id="w0", limit=1, names=["good"])
    statuses: dict[str, str] = {}
    claimed = await store.claim_session(
        queues=["default"],
        worker_id="w0",
        names=None,
        plan=lambda draw: draw(None, 3),
        settle=[(held.id, '{"ok":1}', held.attempt)],
        on_settled=statuses.update,
    )
    assert claimed is not None and len(claimed) == 2
    assert statuses == {held.id: "succeeded"}  # the settlement rode in the replayed claim
    assert bad_row_state(dialect, db_target)["status"] == "failed"
    counts = await store.stats()
    assert counts["default"]["failed"] == 1 and counts["default"]["succeeded"] == 1


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"], indirect=True)
async def test_a_worker_runs_every_good_task_behind_an_undecodable_row(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    """The reported failure end to end: a real worker, one bad row at the head of the
    queue, 20 good tasks behind it. Before, the claim failed on every pass."""
    bad = (
        SQLITE_BAD["payload-not-utf8"] if dialect == "sqlite" else POSTGRES_BAD["payload-5000-deep"]
    )
    good_ids = await _submit_good(store)
    insert_bad(dialect, db_target, dataclasses.replace(bad, name="good"))
    ran: list[int] = []
    worker = Worker(store, ["default"], poll_interval_ms=50)

    @worker.task
    async def good(ctx: TaskContext, payload: Any) -> None:
        ran.append(payload["i"])

    runner = asyncio.create_task(worker.run(concurrency=4))
    try:

        async def finished() -> int:
            counts = (await store.stats())["default"]
            return counts["succeeded"] + counts["failed"]

        def all_done(n: int) -> bool:
            return n == GOOD + 1

        await wait_for_async("every task to finish", finished, 60, accept=all_done)
    finally:
        worker.stop()
        await runner
    assert sorted(ran) == list(range(GOOD))
    for task_id in good_ids:
        task = await store.get(task_id)
        assert task is not None and (task.status, task.attempt) == ("succeeded", 1)
    assert bad_row_state(dialect, db_target)["error"]["code"] == "undecodable_row"


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
async def test_990_levels_on_sqlite_read_back_from_any_stack_depth(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    """The decoder shares the interpreter's recursion limit with its caller: a deep
    value read from deep in a stack is decoded again on a fresh one."""
    insert_bad(dialect, db_target, BadRow("none", payload=nested(990)))

    def depth_of(value: Any) -> int:
        depth = 0
        while isinstance(value, list) and value:
            value, depth = value[0], depth + 1
        return depth + 1

    (claimed,) = await store.claim(queues=["default"], worker_id="w1", limit=5)
    assert depth_of(claimed.payload) == 990
    assert store.undecodable_rows == 0

    # From deep in the caller's own stack: most of the recursion limit already used.
    def deep_call(levels: int) -> Any:
        if levels:
            return deep_call(levels - 1)
        return Task.from_row(_row_of(claimed, nested(MAX_JSON_DEPTH)))

    # Leave the decoder far fewer frames than the value has levels.
    used = sys.getrecursionlimit() - len(traceback.extract_stack()) - 100
    read = deep_call(used)
    assert depth_of(read.payload) == MAX_JSON_DEPTH


def _row_of(task: Task, payload: str) -> dict[str, Any]:
    row = {k: v for k, v in vars(task).items()}
    row.update(payload=payload, result=None, error=None, metadata="{}")
    return row


# -- what the SDK writes: never what it could not read back -------------------------------


def _deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_dump_json_refuses_nesting_beyond_the_limit_naming_the_argument() -> None:
    assert dump_json(_deep(MAX_JSON_DEPTH)).count("[") == MAX_JSON_DEPTH
    for what in ("payload", "result", "metadata"):
        with pytest.raises(SerializationError, match=rf"^{what} nests {MAX_JSON_DEPTH + 1} levels"):
            dump_json(_deep(MAX_JSON_DEPTH + 1), what=what)
    with pytest.raises(SerializationError, match=r"^payload nests more than"):
        dump_json(_deep(50_000), what="payload")
    nested_objects: Any = {}
    for _ in range(MAX_JSON_DEPTH):
        nested_objects = {"k": nested_objects}
    with pytest.raises(SerializationError, match="nests 513 levels"):
        dump_json(nested_objects, what="payload")


def test_dump_json_counts_levels_not_brackets() -> None:
    """Wide values hold many brackets and few levels; brackets inside strings are text."""
    wide = [{"a": [i, {"b": "[[[{{{"}]} for i in range(5 * MAX_JSON_DEPTH)]
    assert json.loads(dump_json(wide, what="payload")) == wide
    text_brackets = {"s": "[" * (3 * MAX_JSON_DEPTH), "t": "{" * MAX_JSON_DEPTH}
    assert json.loads(dump_json(text_brackets)) == text_brackets
    mixed = [_deep(MAX_JSON_DEPTH - 1), *[[[]] for _ in range(MAX_JSON_DEPTH)]]
    assert dump_json(mixed)
    with pytest.raises(SerializationError, match="nests 513 levels"):
        dump_json([[[]] for _ in range(MAX_JSON_DEPTH)] + [_deep(MAX_JSON_DEPTH)])


async def test_the_store_refuses_too_deep_values_on_both(store: TaskStore) -> None:
    with pytest.raises(SerializationError, match=r"^payload nests"):
        await store.submit(name="n", payload=_deep(MAX_JSON_DEPTH + 1))
    with pytest.raises(SerializationError, match=r"^metadata nests"):
        await store.submit(name="n", metadata={"m": _deep(MAX_JSON_DEPTH)})
    edge = await store.submit(name="n", payload=_deep(MAX_JSON_DEPTH))
    (claimed,) = await store.claim(queues=["default"], worker_id="w", limit=1)
    assert claimed.id == edge.id and claimed.payload == _deep(MAX_JSON_DEPTH)
    with pytest.raises(SerializationError, match=r"^result nests"):
        await store.complete(task_id=edge.id, worker_id="w", result=_deep(MAX_JSON_DEPTH + 1))
    done = await store.complete(task_id=edge.id, worker_id="w", result=_deep(MAX_JSON_DEPTH))
    got = await store.get(done.id)
    assert got is not None and got.result == _deep(MAX_JSON_DEPTH)


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
async def test_recovering_an_expired_lease_on_a_row_not_utf8(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    """The reaper's recovery reads back each row's name: a name that is not UTF-8 must
    not stop it, nor the hand-back of a dead worker's tasks."""
    insert_bad(dialect, db_target, SQLITE_BAD["name-not-utf8"])
    with closing(sqlite3.connect(db_target)) as conn:
        conn.execute(
            "update cairnq_tasks set status = 'running', worker_id = 'w0', attempt = 1,"
            " lease_until_ms = ? where priority = ?",
            (now_ms() - 1000, BAD_PRIORITY),
        )
        conn.commit()
    (recovered,) = await store.recover_leases()
    assert (recovered["name"], recovered["status"]) == ("odd\\xffname", "queued")
    assert await store.claim(queues=["default"], worker_id="w1", limit=5) == []
    state = bad_row_state(dialect, db_target)
    assert (state["status"], state["attempt"], state["worker_id"]) == ("failed", 2, "w1")
    assert await store.release_worker("w1", message="gone") == []


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
async def test_cancel_and_retry_of_a_row_not_utf8_answer_with_it_escaped(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    """SQLite applies an UPDATE before its first row comes back, so a cancel or retry of
    such a row was done while its caller got "Could not decode to UTF-8": half written,
    as far as the caller could tell. Each now answers with the row, escaped; the bulk
    forms (the CLI's and the dashboard's) too, all or nothing."""
    insert_bad(dialect, db_target, SQLITE_BAD["name-not-utf8"])
    (bad_id,) = [t.id for t in await store.list(limit=10) if t.name == "odd\\xffname"]
    canceled = await store.cancel(bad_id)
    assert canceled is not None and (canceled.status, canceled.name) == ("canceled", "odd\\xffname")
    retried = await store.retry(bad_id)
    assert retried is not None and retried.status == "queued"
    (again,) = await store.bulk.cancel([bad_id])
    assert again.status == "canceled"
    (back,) = await store.bulk.retry([bad_id])
    assert back.status == "queued"
    assert bad_row_state(dialect, db_target)["status"] == "queued"
