"""The dashboard's task list and task page on a row another client wrote that this
runtime cannot decode: 200, the row shown with its text escaped."""

from __future__ import annotations

import asyncio
import html
from pathlib import Path

import pytest
import yaml

from tests.dashboard.conftest import Http
from tests.dashboard.standalone import Standalone
from tests.support.databases import make_store
from tests.support.undecodable import bad_row_for_reads, insert_bad

pytestmark = pytest.mark.timeout(180)


async def _migrate(dialect: str, target: str) -> None:
    store = make_store(dialect, target)
    await store.connect()
    try:
        await store.submit(name="fine", payload={"x": 1})
    finally:
        await store.close()


def test_the_task_list_and_page_show_an_undecodable_row(
    tmp_path: Path, dialect: str, db_target: str
) -> None:
    asyncio.run(_migrate(dialect, db_target))
    insert_bad(dialect, db_target, bad_row_for_reads(dialect))
    database = {"path": db_target} if dialect == "sqlite" else {"dsn": db_target}
    config = {
        "version": 1,
        "database": database,
        "handlers": ["cairnqd.demo:registry"],
        "runtime_dir": str(tmp_path / "run"),
        "groups": {"g": {"queues": ["default"]}},
        "dashboard": {"listen": "127.0.0.1:0"},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    process = Standalone(path)
    try:
        http = Http(process.port())
        listed = http.get("/tasks")
        assert listed.status == 200, listed.text[:2000]
        assert "/task/task_bad" in listed.text
        shown_name = "odd\\xffname" if dialect == "sqlite" else "odd"
        assert shown_name in html.unescape(listed.text)
        page = http.get("/task/task_bad")
        assert page.status == 200, page.text[:2000]
        text = html.unescape(page.text)
        assert "undecodable" in text
        # The raw text inside the JSON shown: its backslash escaped once more.
        assert ('"raw": "{\\"a\\":\\"\\\\xff' if dialect == "sqlite" else "[[[[") in text
    finally:
        assert process.stop() == 0, process.output()
