"""How the store's operations turn their values into statement parameters, and the
fixed values the protocol writes (the lease-expired envelope)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import MISSING, fields
from typing import Any

from cairnqd._jsoncodec import check_storable, dump_json, json_string
from cairnqd.errors import ErrorEnvelope, SerializationError
from cairnqd.models import Task, adopt_task
from cairnqd.store.arguments import Params, require_int, shown

#: What recovery stores on a task whose lease ran out on its last attempt.
LEASE_EXPIRED = ErrorEnvelope(
    type="LeaseExpired",
    code="lease_expired",
    message="task lease expired and max attempts reached",
)
LEASE_EXPIRED_ERROR_JSON = dump_json(LEASE_EXPIRED.to_dict())


def claim_variant(queues: list[str], names: Sequence[str] | None) -> tuple[str, Params]:
    """Pick the claim statement whose equality predicates the planner can read in
    claim order: the list forms sort the whole claimable backlog."""
    one_queue = len(queues) == 1
    one_name = names is not None and len(names) == 1
    if one_queue and one_name:
        assert names is not None
        return "claim_one_queue_one_name", {"queue": queues[0], "name": names[0]}
    if one_name:
        assert names is not None
        return "claim_one_name", {"queues": queues, "name": names[0]}
    name_list = None if names is None else list(names)
    if one_queue:
        return "claim_one_queue", {"queue": queues[0], "names": name_list}
    return "claim", {"queues": queues, "names": name_list}


# A new row's columns that no submit argument sets: the dataclass defaults are what
# insert_task leaves (queued, attempt 0, no result, lease or completion).
_NEW_ROW: dict[str, Any] = {f.name: f.default for f in fields(Task) if f.default is not MISSING}


def new_task(params: Params, run_at_ms: int, created_at_ms: int) -> Task:
    """The task a keyless insert made, from what was inserted (`submit_many` builds
    thousands, hence `adopt_task`)."""
    return adopt_task(
        {
            **_NEW_ROW,
            "id": params["id"],
            "name": params["name"],
            "queue": params["queue"],
            "payload": params["payload_value"],
            "metadata": params["metadata_value"],
            "max_attempts": params["max_attempts"],
            "priority": params["priority"],
            "parent_id": params["parent_id"],
            "root_id": params["root_id"],
            "correlation_id": params["correlation_id"],
            "run_at_ms": run_at_ms,
            "created_at_ms": created_at_ms,
            "updated_at_ms": created_at_ms,
        }
    )


# Rows per insert_many statement: big enough to amortize, small enough for the
# statement's JSON/array parameters to stay a few MB at most.
INSERT_MANY_CHUNK = 5000


def insert_many_params(run: Sequence[Params]) -> Params:
    """Postgres's insert_many: one JSON array with an object per new task, in the
    short keys its json_to_recordset reads (see insert_many.sql).

    The text is written here rather than by the JSON encoder: every value was checked
    when its parameters were made, payload and metadata are JSON text already (so they
    go in as they are, not re-escaped as strings), and a row's optional ids are left
    out when they are absent or, for the root, the task's own id. About 4x cheaper than
    building and encoding a dict per task (`submit_many` writes thousands)."""
    quote = json_string
    rows: list[str] = []
    add = rows.append
    for p in run:
        task_id, root_id = p["id"], p["root_id"]
        parent_id, correlation_id = p["parent_id"], p["correlation_id"]
        # %d writes an int subclass as its value, whatever its str() says.
        row = '{"i":%s,"n":%s,"q":%s,"p":%s,"m":%s,"a":%d,"r":%d,"d":%d' % (  # noqa: UP031
            quote(task_id),
            quote(p["name"]),
            quote(p["queue"]),
            p["payload"],
            p["metadata"],
            p["max_attempts"],
            p["priority"],
            p["delay_ms"],
        )
        if root_id != task_id:
            row += ',"ro":' + quote(root_id)
        if parent_id is not None:
            row += ',"pa":' + quote(parent_id)
        if correlation_id is not None:
            row += ',"co":' + quote(correlation_id)
        add(row)
    return {"new_tasks": "[" + "},".join(rows) + "}]" if rows else "[]"}


def task_rows(run: Sequence[Params], now_ms: int) -> Iterator[tuple[Any, ...]]:
    """Each new task's values as the bulk inserts write them (SQLite's insert_many row,
    Postgres's insert_copy): id, name, queue, payload, metadata, max_attempts,
    priority, parent_id, root_id, correlation_id, run_at_ms, created_at_ms,
    updated_at_ms; the times are `now_ms` (run_at: plus the task's delay)."""
    for p in run:
        yield (
            p["id"],
            p["name"],
            p["queue"],
            p["payload"],
            p["metadata"],
            p["max_attempts"],
            p["priority"],
            p["parent_id"],
            p["root_id"],
            p["correlation_id"],
            now_ms + p["delay_ms"],
            now_ms,
            now_ms,
        )


def insert_rows(run: Sequence[Params], now_ms: int) -> list[Any]:
    """SQLite's insert_many: every new task's values (`task_rows`), flat, in the order
    of the row in its insert_many.sql."""
    return list(itertools.chain.from_iterable(task_rows(run, now_ms)))


#: A result to write: (task id, result as JSON text or None), optionally with the
#: attempt it belongs to, so it cannot settle a later attempt of the same task.
SettleItem = tuple[str, str | None] | tuple[str, str | None, int]


def complete_many_params(worker_id: str, items: Sequence[SettleItem]) -> Params:
    # Both dialects read one JSON array; results travel as JSON text inside it, already
    # checked by the dump_json that encoded each (see complete_many).
    rows = [
        {"id": item[0], "r": item[1]}
        if len(item) == 2
        else {"id": item[0], "r": item[1], "a": item[2]}
        for item in items
    ]
    return {"worker_id": worker_id, "items": dump_json(rows, check=False)}


def encode_error(error: Mapping[str, Any] | ErrorEnvelope) -> str:
    """Serialize an error envelope. One holding values JSON cannot carry keeps its
    scalar fields; text Postgres cannot store (NUL, lone surrogates) is refused."""
    if isinstance(error, ErrorEnvelope):
        envelope = error.to_dict()
    elif isinstance(error, Mapping):
        envelope = dict(error)
    else:
        # `dict("boom")` complained of a "dictionary update sequence", naming nothing.
        raise ValueError(
            f"error must be an error envelope (a mapping, or ErrorEnvelope), got {shown(error)}"
        )
    try:
        text = dump_json(envelope, what="error", check=False)
    except SerializationError:
        # A NaN or an infinity is a float too, and failed the reduced envelope again.
        scalars = {
            k: v
            for k, v in envelope.items()
            if isinstance(v, str | int) or (isinstance(v, float) and math.isfinite(v))
        }
        text = dump_json(scalars, what="error", check=False)
    check_storable(text, what="error")
    return text


__all__ = [
    "INSERT_MANY_CHUNK",
    "LEASE_EXPIRED",
    "LEASE_EXPIRED_ERROR_JSON",
    "SettleItem",
    "claim_variant",
    "complete_many_params",
    "encode_error",
    "insert_many_params",
    "insert_rows",
    "new_task",
    "task_rows",
]


def for_attempt(params: Params, attempt: int | None) -> tuple[Params, frozenset[str]]:
    """An owned write's parameters and the optional filters it keeps: with `attempt`,
    the statement's `(:attempt is null or attempt = :attempt)` stays, bound, so a write
    that reaches the row after the same worker claimed the task again finds no row
    (docs/protocol.md, "Owned writes of one attempt"); without, the filter drops out."""
    if attempt is None:
        return params, frozenset()
    require_int(attempt, "attempt", minimum=1)
    return {**params, "attempt": attempt}, frozenset({"attempt"})
