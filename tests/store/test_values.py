"""The value types at the store's edge: `ErrorEnvelope` and `SubmitRequest`."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cairnqd.errors import ErrorEnvelope, TaskError, TaskFailed
from cairnqd.models import TaskDef
from cairnqd.store.arguments import SubmitRequest
from cairnqd.store.base import LEASE_EXPIRED, TaskStore

# -- ErrorEnvelope -------------------------------------------------------------------------


def test_envelope_stored_form_has_exactly_the_five_keys() -> None:
    envelope = ErrorEnvelope("E", "e", "boom", retryable=True, details={"n": 1})
    assert envelope.to_dict() == {
        "type": "E",
        "code": "e",
        "message": "boom",
        "retryable": True,
        "details": {"n": 1},
    }
    assert ErrorEnvelope("E", "e", "m").to_dict()["details"] == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        envelope.message = "changed"  # type: ignore[misc]


def test_envelope_from_an_exception() -> None:
    plain = ErrorEnvelope.from_exception(KeyError("k"), retryable=True)
    assert plain == ErrorEnvelope("KeyError", "handler_error", "'k'", retryable=True)
    coded = ErrorEnvelope.from_exception(ValueError("x"), retryable=False, code="bad_input")
    assert (coded.code, coded.retryable) == ("bad_input", False)
    # A TaskError keeps its own fields, its own retryable included.
    chosen = TaskError("no stock", code="out_of_stock", type="Stock", details={"sku": "a"})
    from_task_error = ErrorEnvelope.from_exception(chosen, retryable=True)
    assert from_task_error == ErrorEnvelope(
        "Stock", "out_of_stock", "no stock", retryable=False, details={"sku": "a"}
    )
    assert chosen.envelope() == from_task_error.to_dict()


def test_envelope_from_what_another_sdk_stored() -> None:
    nothing = ErrorEnvelope.from_stored(None)
    assert nothing == ErrorEnvelope("TaskError", "task_error", "task failed")
    partial = ErrorEnvelope.from_stored({"code": 7, "message": "m", "details": ["not", "a", "map"]})
    assert partial == ErrorEnvelope("TaskError", "7", "m")
    nulls = ErrorEnvelope.from_stored({"type": None, "code": None, "message": None})
    assert nulls == ErrorEnvelope("TaskError", "task_error", "task failed")  # not "None"
    failed = TaskFailed({"type": "T", "code": "c", "message": "m", "retryable": 1})
    assert (failed.type, failed.code, failed.message, failed.retryable) == ("T", "c", "m", True)
    assert str(failed) == "m"  # the message alone, as the public SDK words it


def test_lease_expired_envelope_is_the_protocols() -> None:
    assert LEASE_EXPIRED.to_dict() == {
        "type": "LeaseExpired",
        "code": "lease_expired",
        "message": "task lease expired and max attempts reached",
        "retryable": False,
        "details": {},
    }


async def test_fail_accepts_an_envelope(store: TaskStore) -> None:
    task = await store.submit(name="env.fail", max_attempts=1)
    await store.claim(queues=["default"], worker_id="w")
    envelope = ErrorEnvelope("E", "e", "boom", details={"at": [1, 2]})
    failed = await store.fail(task_id=task.id, worker_id="w", error=envelope)
    assert failed.status == "failed"
    assert failed.error == envelope.to_dict()


# -- SubmitRequest -------------------------------------------------------------------------


def test_submit_request_defaults_match_submit() -> None:
    request = SubmitRequest(name="n")
    assert (request.queue, request.conflict, request.max_attempts, request.priority) == (
        "default",
        "reuse",
        3,
        0,
    )
    assert request.delay_ms == 0 and request.key is None and request.payload is None


def test_submit_request_from_a_mapping() -> None:
    request = SubmitRequest.from_mapping({"name": TaskDef("typed"), "priority": 5})
    assert (request.name, request.priority) == ("typed", 5)
    with pytest.raises(TypeError, match="colour"):
        SubmitRequest.from_mapping({"name": "n", "colour": "red"})
    with pytest.raises(TypeError, match="name"):
        SubmitRequest.from_mapping({"payload": {}})


def test_submit_request_params_encode_once_under_a_new_id() -> None:
    request = SubmitRequest(name="n", payload={"a": "é"}, metadata=None)
    first, second = request.insert_params(), request.insert_params()
    assert first["id"] != second["id"]
    assert first["root_id"] == first["id"]
    assert first["payload"] == json.dumps({"a": "é"}, separators=(",", ":"))
    assert first["metadata"] == "{}" and first["metadata_value"] == {}
    assert SubmitRequest(name="n", root_id="r").insert_params()["root_id"] == "r"
