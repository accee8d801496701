"""The dashboard over rows other clients wrote with values of the wrong type (SQLite keeps
text in a column declared integer) or JSON Python reads oddly (1e999 reads as infinite):
every page and list answers 200, the row shown with the value's text marked
"(unreadable)", and no page writes a bare Infinity or NaN where JSON is shown.

A real `cairnqd dashboard` over real HTTP on a real SQLite file; Postgres for what its
typed columns can hold (a time past year 9999, a progress of NaN, a jsonb number
Python reads as infinite, a due time whose age overflows bigint)."""

from __future__ import annotations

import asyncio
import html
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from tests.dashboard.conftest import Http
from tests.dashboard.standalone import Standalone
from tests.support.databases import PgDatabases, make_store, require_postgres

pytestmark = pytest.mark.timeout(240)

NOW = int(time.time() * 1000)
#: Within bigint, past the year 9999 every date reader stops at.
FAR_MS = 9_000_000_000_000_000_000
#: What every row holds unless its case says otherwise.
DEFAULTS: dict[str, Any] = {
    "name": "foreign",
    "queue": "default",
    "status": "queued",
    "payload": '{"foreign": 1}',
    "metadata": "{}",
    "attempt": 0,
    "max_attempts": 3,
    "priority": 0,
    "run_at_ms": NOW,
    "updated_at_ms": NOW,
}
SQLITE_ROWS: dict[str, dict[str, Any]] = {
    "task_run_at": {"run_at_ms": "soon"},
    "task_created": {"created_at_ms": "yesterday"},
    "task_attempts": {"attempt": "one", "max_attempts": "three"},
    "task_progress": {
        "status": "succeeded",
        "progress": "half",
        "result": "1e999",
        "completed_at_ms": NOW,
    },
    "task_finished": {"status": "succeeded", "completed_at_ms": "later", "result": "2"},
    "task_updated": {"updated_at_ms": "whenever"},
    "task_lease": {"status": "running", "worker_id": "w-1", "lease_until_ms": "forever"},
    "task_priority": {"priority": "high"},
    "task_blob": {"priority": b"\x01\x02"},
    "task_cancel": {"cancel_requested_at_ms": "asap"},
    "task_json": {"payload": '{"foreign": 1, "big": 1e999}', "metadata": '{"small": -1e999}'},
    "task_error": {
        "status": "failed",
        "completed_at_ms": NOW,
        "error": '{"type": "ForeignError", "message": 42, "retryable": 1e999, '
        '"details": {"n": 1e999}}',
    },
    "task_error_text": {"status": "failed", "completed_at_ms": "at noon", "error": '"it broke"'},
    "task_far": {"created_at_ms": FAR_MS, "run_at_ms": FAR_MS},
    "task_real": {"created_at_ms": NOW + 0.5, "run_at_ms": 1.5e300},
    # Due at -Infinity: its queue's oldest queued task has waited forever.
    "task_due_neg_inf": {"run_at_ms": float("-inf"), "queue": "odd-due"},
}
#: Its attempt history gets the text its row holds, by the triggers that keep it.
HISTORY = "task_history"
#: What each row's page shows, unescaped.
SQLITE_SHOWN = {
    "task_run_at": ["soon (unreadable)"],
    "task_created": ["yesterday (unreadable)"],
    "task_attempts": ["one (unreadable)/three (unreadable)"],
    "task_progress": ["half (unreadable)", '"raw": "Infinity"'],
    "task_finished": ["later (unreadable)"],
    "task_updated": ["whenever (unreadable)"],
    "task_lease": ["forever (unreadable)"],
    "task_priority": ["high (unreadable)"],
    "task_blob": ["\\x01\\x02 (unreadable)"],
    "task_cancel": ["asap (unreadable)"],
    "task_json": ['"raw": "Infinity"', '"raw": "-Infinity"'],
    "task_error": ["ForeignError", "<dd>42</dd>", '"raw": "Infinity"'],
    "task_error_text": ["it broke", "at noon (unreadable)"],
    "task_far": [f"{FAR_MS} (unreadable)"],
    # The store's read makes an integer of a real in a time column: 301 digits here.
    "task_real": ["<dt>due</dt><dd>15000000000000000", "… (301 characters) (unreadable)"],
    HISTORY: ["#one (unreadable)", "started x (unreadable)", "ended y (unreadable)"],
    "task_due_neg_inf": ["<dt>due</dt><dd>-inf (unreadable)</dd>"],
}
LISTS = [
    "/tasks",
    "/tasks?status=queued",
    "/tasks?queue=default",
    "/tasks?sort=run_at",
    "/tasks?sort=finished",
    "/tasks?name=foreign&sort=run_at",
    "/search?q=foreign",
]
# A bare JSON token Python writes for a float JSON cannot hold.
_BARE = re.compile(r"[:\[,]\s*-?(?:Infinity|NaN)\b")
_LISTED = re.compile(r'href="/task/([A-Za-z0-9_]+)"')


async def _submit(dialect: str, target: str) -> dict[str, str]:
    """A good task, and a parent with the child submitted after it (the parent's row is
    made odd afterwards), through the store, which migrates the database first."""
    store = make_store(dialect, target)
    await store.connect()
    try:
        good = await store.submit(name="foreign", payload={"foreign": "good"})
        parent = await store.submit(name="foreign", payload={"foreign": "parent"})
        child = await store.submit(name="foreign", payload={"foreign": "child"}, after=[parent.id])
    finally:
        await store.close()
    return {"good": good.id, "parent": parent.id, "child": child.id}


def _insert_sqlite(path: str, parent: str) -> None:
    with closing(sqlite3.connect(path)) as conn:
        for n, (task_id, odd) in enumerate([*SQLITE_ROWS.items(), (HISTORY, {})]):
            row = {"id": task_id, **DEFAULTS, "created_at_ms": NOW + n, **odd}
            columns = ", ".join(row)
            marks = ", ".join("?" * len(row))
            conn.execute(
                f"insert into cairnq_tasks ({columns}) values ({marks})", list(row.values())
            )
        conn.execute(
            "update cairnq_tasks set attempt = 'one', max_attempts = 'three',"
            " updated_at_ms = 'x', run_at_ms = 'soon' where id = ?",
            (parent,),
        )
        # As a script might run it: claimed with text for its attempt, then failed.
        conn.execute(
            "update cairnq_tasks set status = 'running', attempt = 'one', worker_id = 'w-2',"
            " updated_at_ms = 'x' where id = ?",
            (HISTORY,),
        )
        conn.execute(
            "update cairnq_tasks set status = 'failed', updated_at_ms = 'y', error ="
            ' \'{"type": "E", "message": "m"}\' where id = ?',
            (HISTORY,),
        )
        conn.commit()


#: jsonb writes 1e999 as an integer of 1,000 digits, which Python reads as one; a
#: fraction of 400 digits it writes as it is, and Python reads it as infinite.
HUGE = "1" + "0" * 400 + ".5"
POSTGRES_ROWS: dict[str, dict[str, Any]] = {
    "task_far": {"created_at_ms": FAR_MS, "run_at_ms": FAR_MS, "lease_until_ms": -FAR_MS},
    "task_progress": {
        "status": "succeeded",
        "progress": "NaN",
        "result": HUGE,
        "completed_at_ms": NOW,
    },
    "task_json": {"payload": f'{{"foreign": 1, "big": {HUGE}}}', "metadata": f"[-{HUGE}]"},
    "task_error": {
        "status": "failed",
        "completed_at_ms": FAR_MS,
        "error": f'{{"type": "ForeignError", "message": 42, "details": {{"n": {HUGE}}}}}',
    },
    "task_integer": {"status": "succeeded", "result": "1e999", "completed_at_ms": NOW},
    # Its queue's oldest age, now minus this, is past bigint: Postgres refuses to say it.
    "task_due_min": {"run_at_ms": -(2**63), "queue": "odd-due"},
}
POSTGRES_SHOWN = {
    "task_far": [f"{FAR_MS} (unreadable)", f"-{FAR_MS} (unreadable)"],
    "task_progress": ["nan (unreadable)", '"raw": "Infinity"'],
    "task_json": ['"raw": "Infinity"', '"raw": "-Infinity"'],
    "task_error": ["ForeignError", "<dd>42</dd>", '"raw": "Infinity"'],
    "task_integer": ["<pre>1" + "0" * 999 + "</pre>"],
    "task_due_min": [f"<dt>due</dt><dd>{-(2**63)} (unreadable)</dd>"],
}


def _insert_postgres(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as pg:
        for n, (task_id, odd) in enumerate(POSTGRES_ROWS.items()):
            row = {"id": task_id, **DEFAULTS, "created_at_ms": NOW + n, **odd}
            columns = ", ".join(row)
            marks = ", ".join(
                "%s::jsonb" if c in ("payload", "metadata", "result", "error") else "%s"
                for c in row
            )
            pg.execute(
                f"insert into cairnq_tasks ({columns}) values ({marks})",
                list(row.values()),
            )


class Served:
    """A standalone dashboard over a database holding the odd rows and one good task."""

    def __init__(self, dialect: str, target: str, folder: Path, ids: dict[str, str]) -> None:
        self.dialect = dialect
        self.good = ids["good"]
        self.ids = ids
        database = {"path": target} if dialect == "sqlite" else {"dsn": target}
        config = {
            "version": 1,
            "database": database,
            "handlers": ["cairnqd.demo:registry"],
            "runtime_dir": str(folder / "run"),
            "groups": {"g": {"queues": ["default"]}},
            "dashboard": {"listen": "127.0.0.1:0"},
        }
        path = folder / "c.yaml"
        path.write_text(yaml.safe_dump(config))
        self.process = Standalone(path)
        self.http = Http(self.process.port())

    def page(self, path: str) -> str:
        """The page at `path`, which must answer 200; its text unescaped."""
        reply = self.http.get(path)
        assert reply.status == 200, (path, reply.status, reply.text[:2000])
        return html.unescape(reply.text)


def _served(dialect: str, folder: Path) -> Iterator[Served]:
    pg: PgDatabases | None = None
    if dialect == "postgres":
        require_postgres()
        pg = PgDatabases()
        target = pg.new()
    else:
        target = str(folder / "tasks.db")
    try:
        ids = asyncio.run(_submit(dialect, target))
        if dialect == "sqlite":
            _insert_sqlite(target, ids["parent"])
        else:
            _insert_postgres(target)
        served = Served(dialect, target, folder, ids)
        try:
            yield served
        finally:
            code = served.process.stop()
            log = served.process.output()
            assert code == 0, log
            assert "Traceback" not in log, log
    finally:
        if pg is not None:
            pg.drop_all()


@pytest.fixture(scope="module")
def sqlite_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _served("sqlite", tmp_path_factory.mktemp("foreign-sqlite"))


@pytest.fixture(scope="module")
def pg_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _served("postgres", tmp_path_factory.mktemp("foreign-postgres"))


def _no_bare_numbers(text: str, where: str) -> None:
    found = _BARE.search(text)
    assert found is None, (where, text[max(0, found.start() - 200) : found.end() + 50])


@pytest.mark.parametrize("path", LISTS)
def test_every_list_shows_the_odd_rows(sqlite_served: Served, path: str) -> None:
    text = sqlite_served.page(path)
    listed = set(_LISTED.findall(text))
    assert "sort=finished" in path or sqlite_served.good in listed, path
    if path == "/search?q=foreign" or "sort=" not in path:
        # Listed by creation time: every row whose creation time is a number.
        assert {"task_run_at", "task_attempts", "task_real", "task_far"} <= listed, path
        assert "soon (unreadable)" in text
        assert "one (unreadable)/three (unreadable)" in text
        assert "1.5e+300 (unreadable)" in text
    if path == "/search?q=foreign":
        assert "task_created" in listed and "yesterday (unreadable)" in text
    if "sort=finished" in path:
        assert "task_progress" in listed


@pytest.mark.parametrize("size", [1, 3])
@pytest.mark.parametrize("sort", ["created", "run_at", "finished"])
def test_paging_through_odd_rows_lists_each_once(
    sqlite_served: Served, sort: str, size: int
) -> None:
    """A page may end on a row whose sort value is a real (task_real, created at NOW +
    0.5): the next goes on with every row below it, task_run_at at NOW included."""
    everything = _LISTED.findall(sqlite_served.page(f"/tasks?sort={sort}&limit=500"))
    if sort == "created":
        assert everything.index("task_real") + 1 == everything.index("task_run_at")
    seen: list[str] = []
    path: str | None = f"/tasks?sort={sort}&limit={size}"
    while path is not None:
        text = sqlite_served.page(path)
        body = text[text.index('<main id="page"') :]
        seen += _LISTED.findall(body)
        following = re.search(r'<a rel="next" href="([^"]+)"', text)
        path = following.group(1) if following else None
        assert len(seen) <= len(everything), seen
    assert seen == everything


@pytest.mark.parametrize("task_id", sorted(SQLITE_SHOWN))
def test_the_task_page_shows_each_odd_value(sqlite_served: Served, task_id: str) -> None:
    text = sqlite_served.page(f"/task/{task_id}")
    for shown in SQLITE_SHOWN[task_id]:
        assert shown in text, (task_id, shown)
    _no_bare_numbers(text, task_id)
    sqlite_served.page(f"/task/{task_id}/graph")


def test_dependencies_of_an_odd_row(sqlite_served: Served) -> None:
    parent_id, child_id = sqlite_served.ids["parent"], sqlite_served.ids["child"]
    child = sqlite_served.page(f"/task/{child_id}")
    assert f'href="/task/{parent_id}"' in child and "Waits for 1 parent" in child
    parent = sqlite_served.page(f"/task/{parent_id}")
    assert f'href="/task/{child_id}"' in parent and "soon (unreadable)" in parent
    drawn = sqlite_served.page(f"/task/{parent_id}/graph")
    assert "one (unreadable)/three (unreadable)" in drawn
    assert f'data-task="{child_id}"' in drawn
    layer = sqlite_served.page(f"/task/{child_id}/graph?layer=0")
    assert "one (unreadable)/three (unreadable)" in layer


def test_the_overview_and_failed_groups_with_odd_rows(sqlite_served: Served) -> None:
    overview = sqlite_served.page("/")
    assert "did not answer" not in overview
    # A due time of -Infinity: as old as an age gets (INT8_MAX ms), not a failed overview.
    assert re.search(r'odd-due</a></th>.*?<td class="num">106751991167d 07h</td>', overview)
    failed = sqlite_served.page("/failed")
    assert "did not answer" not in failed
    assert "ForeignError" in failed and ">42<" in failed
    # SQLite's max() of a group holding text is that text.
    assert "at noon (unreadable)" in failed


def test_a_good_row_looks_as_before(sqlite_served: Served) -> None:
    text = sqlite_served.page(f"/task/{sqlite_served.good}")
    assert "unreadable" not in text
    assert "<dt>attempt</dt><dd>0/3</dd>" in text
    assert "<dt>priority</dt><dd>0</dd>" in text
    assert re.search(r"<dt>created</dt><dd>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d</dd>", text)


@pytest.mark.parametrize("task_id", sorted(POSTGRES_SHOWN))
def test_postgres_odd_values(pg_served: Served, task_id: str) -> None:
    text = pg_served.page(f"/task/{task_id}")
    for shown in POSTGRES_SHOWN[task_id]:
        assert shown in text, (task_id, shown)
    _no_bare_numbers(text, task_id)
    pg_served.page(f"/task/{task_id}/graph")


def test_postgres_lists_and_groups(pg_served: Served) -> None:
    for path in [*LISTS, "/", "/failed"]:
        text = pg_served.page(path)
        assert "did not answer" not in text, path
    overview = pg_served.page("/")
    # run_at_ms at the smallest bigint: the age is computed as numeric, and capped.
    assert "The oldest queued ages are not shown" not in overview
    assert re.search(r'odd-due</a></th>.*?<td class="num">106751991167d 07h</td>', overview)
    assert 'odd-due</a></th><td class="num"><a href="/tasks?queue=odd-due&status=queued">1' in (
        overview
    )
    listed = set(_LISTED.findall(pg_served.page("/tasks")))
    assert set(POSTGRES_ROWS) | {pg_served.good} <= listed
    assert f"{FAR_MS} (unreadable)" in pg_served.page("/failed")
