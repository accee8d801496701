"""The fast preparations, `submit_many`'s (`insert_params_for`) and `submit`'s
(`submit_params`), agree with the request object: the same parameters for a good item,
the same error for a bad one.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cairnqd._ids import new_task_id
from cairnqd.errors import SerializationError
from cairnqd.store.arguments import SubmitRequest, insert_params_for, submit_params

# Good and bad values for each argument, the bad ones each hitting a different check.
_TEXT = st.sampled_from(["q", "é", "", "a\x00b", "\ud800", "x" * 1001, 7, None])
_INT = st.sampled_from([0, 1, 3, -1, 2**31, -(2**31), 2**40, True, 1.5, "3", None])
_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "name": _TEXT,
    "payload": st.sampled_from([None, {"i": 1}, [1, 2], float("nan"), {1, 2}, "\ud800"]),
    "queue": _TEXT,
    "key": _TEXT,
    "conflict": st.sampled_from(["reuse", "reject", "replace", "nope", None]),
    "max_attempts": _INT,
    "priority": _INT,
    "metadata": st.sampled_from([None, {"m": "v"}, b"bytes"]),
    "parent_id": _TEXT,
    "root_id": _TEXT,
    "correlation_id": _TEXT,
    "delay_ms": _INT,
    "unknown_arg": st.just(1),
}
items = st.fixed_dictionaries({}, optional={arg: values for arg, values in _VALUES.items()})


def outcome(prepare: Any, item: dict[str, Any]) -> tuple[str, object]:
    try:
        params = prepare(item)
    except (TypeError, ValueError, SerializationError) as exc:
        return type(exc).__name__, str(exc)
    # The id is new each time, and root_id defaults to it.
    own_root = params["root_id"] == params["id"]
    return "ok", {**params, "id": None, "root_id": None if own_root else params["root_id"]}


@settings(max_examples=400, deadline=None)
@given(items)
def test_the_fast_path_prepares_what_the_request_object_does(item: dict[str, Any]) -> None:
    slow = outcome(lambda i: SubmitRequest.from_mapping(i).insert_params(), item)
    fast = outcome(lambda i: insert_params_for(i, new_task_id()), item)
    assert fast == slow


# What `submit` passes: every argument, most at their defaults, some set.
_DEFAULT_ARGS: dict[str, Any] = {
    "payload": None,
    "queue": "default",
    "key": None,
    "conflict": "reuse",
    "max_attempts": 3,
    "priority": 0,
    "metadata": None,
    "parent_id": None,
    "root_id": None,
    "correlation_id": None,
    "delay_ms": 0,
}
submit_arguments = st.fixed_dictionaries(
    {"name": _VALUES["name"]},
    optional={arg: _VALUES[arg] for arg in _DEFAULT_ARGS},
).map(lambda given: {**_DEFAULT_ARGS, **given})


@settings(max_examples=400, deadline=None)
@given(submit_arguments)
def test_submit_prepares_what_the_request_object_does(arguments: dict[str, Any]) -> None:
    slow = outcome(lambda a: SubmitRequest(**a).insert_params(), arguments)
    fast = outcome(submit_params, arguments)
    assert fast == slow


def test_an_item_with_only_a_name_gets_every_default() -> None:
    params = insert_params_for({"name": "n"}, "task_1")
    assert params["queue"] == "default" and params["max_attempts"] == 3
    assert (params["payload"], params["metadata"]) == ("{}", "{}")
    assert params["root_id"] == params["id"] == "task_1" and params["conflict"] == "reuse"
