"""Building tasks from rows: the hot paths' shortcut (`adopt_task`, `take=True`) gives
exactly the task the dataclass constructor gives."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cairnqd.models import Task, adopt_task
from cairnqd.store.arguments import insert_params_for
from cairnqd.store.statement_params import new_task

FIELDS = [f.name for f in fields(Task)]

values = st.fixed_dictionaries(
    {name: st.one_of(st.none(), st.integers(0, 2**40), st.text(max_size=8)) for name in FIELDS}
)


@given(values)
def test_adopting_a_full_row_equals_the_constructor(row: dict[str, Any]) -> None:
    expected = Task(**row)
    task = adopt_task(dict(row))
    assert task == expected
    assert repr(task) == repr(expected)
    task.status = "running"  # still an ordinary, mutable dataclass instance
    assert task.status == "running"


def test_from_row_takes_a_fresh_row_and_copies_any_other() -> None:
    row: dict[str, Any] = {f: None for f in FIELDS} | {
        "id": "task_1", "name": "n", "queue": "q", "status": "queued",
        "payload": '{"a":1}', "metadata": "{}", "attempt": 0, "max_attempts": 3,
        "priority": 0, "run_at_ms": 5, "created_at_ms": 5, "updated_at_ms": 5,
    }  # fmt: skip
    copied = Task.from_row(dict(row))
    taken = Task.from_row(dict(row), take=True)
    assert copied == taken
    assert taken.payload == {"a": 1}
    kept = dict(row)
    Task.from_row(kept)  # without take the caller's row is left alone
    assert kept == row
    # A row with a column we do not know (a newer schema) still reads, by copy.
    wider = Task.from_row({**row, "future_column": 1}, take=True)
    assert wider == copied


def test_new_task_is_the_task_an_insert_makes() -> None:
    params = insert_params_for({"name": "n", "payload": {"i": 1}, "priority": 2}, "task_1")
    task = new_task(params, 10, 7)
    assert task == Task(
        id=params["id"], name="n", queue="default", status="queued", payload={"i": 1},
        metadata={}, attempt=0, max_attempts=3, priority=2, parent_id=None,
        root_id=params["id"], correlation_id=None, run_at_ms=10, created_at_ms=7,
        updated_at_ms=7,
    )  # fmt: skip
