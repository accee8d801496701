"""Reading a dashboard request's query string and form: filters, cursors, names.

Every malformed value is a `BadRequest` naming the parameter and what it expected, so
the server answers 400 with that message; no input reaches the database unchecked.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlencode, urlsplit

from cairnqd.models import STATUSES
from cairnqd.store.browse import SORTS, TaskQuery
from cairnqd.store.operator import TaskFilter

#: The longest value any parameter may carry (a queue or task name is far shorter).
VALUE_MAX = 1000
PAGE_SIZE = 50
_PAGE_MAX = 500
_CURSOR_MAX = 400
_TASK_ID = re.compile(r"[A-Za-z0-9_:.-]{1,255}")
#: A cursor's id above every task id (as the list's first page starts: TaskQuery).
_ABOVE_EVERY_ID = "\U0010ffff"
#: The pages an action or a login may send the browser back to (and /task/ID, and
#: /task/ID/graph).
_PAGES = frozenset({"/", "/tasks", "/failed", "/workers", "/schedules", "/search", "/bulk"})
_TASK_PATH = re.compile(r"/task/[A-Za-z0-9_:.-]{1,255}(/graph)?")
#: The most tasks one "selected" action takes (the largest page of the list).
SELECTED_MAX = 500
#: What each bulk action changes, by the status of a task (as `cairnqd cancel` and
#: `cairnqd retry` by filter).
BULK_STATUSES: dict[str, tuple[str, ...]] = {
    "cancel": ("queued", "running"),
    "retry": ("failed", "canceled"),
}
#: The task list's filters a bulk action by filter takes over, and its own `op`.
BULK_FILTERS = frozenset({"op", "status", "queue", "name", "from", "to"})


class BadRequest(Exception):
    """A request the dashboard cannot answer: the message says which input and why."""


def parse_query(
    query: str, allowed: frozenset[str], what: str = "query parameter"
) -> dict[str, str]:
    """Single-valued parameters from a query string or form body; an unknown, repeated
    or over-long one is a BadRequest."""
    return parse_form(query, allowed, what=what)


def parse_form(
    query: str, allowed: frozenset[str], multi: str | None = None, what: str = "query parameter"
) -> dict[str, str]:
    """As `parse_query`, except that `multi` may be given up to `SELECTED_MAX` times:
    its values come joined by commas (no task id holds one)."""
    fields_max = 50 + (SELECTED_MAX if multi is not None else 0)
    try:
        parsed = parse_qs(
            query, keep_blank_values=True, strict_parsing=False, max_num_fields=fields_max
        )
    except ValueError as exc:
        raise BadRequest(f"malformed {what}s: {exc}") from None
    values: dict[str, str] = {}
    for name, found in parsed.items():
        if name not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise BadRequest(f"unknown {what} {name!r} (known: {known})")
        if len(found) > 1 and name != multi:
            raise BadRequest(f"{what} {name!r} given {len(found)} times; give it once")
        for value in found:
            if len(value) > VALUE_MAX:
                raise BadRequest(f"{what} {name!r} is longer than {VALUE_MAX} characters")
            if any(ord(c) < 32 and c not in "\t\r\n" for c in value):
                raise BadRequest(f"{what} {name!r} holds control characters")
        values[name] = ",".join(found) if name == multi else found[0]
    return values


TASK_FILTERS = frozenset(
    {"status", "queue", "name", "key", "from", "to", "sort", "cursor", "limit"}
)


def parse_time(value: str, name: str) -> int:
    """Epoch milliseconds from `2026-12-01T08:30`, `...:45Z`, `...+01:00` (a time
    without a zone is UTC), a date `2026-12-01`, or epoch milliseconds."""
    if value.isdigit():
        if len(value) > 15:
            raise BadRequest(f"{name}: {value!r} is out of range for epoch milliseconds")
        return int(value)
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise BadRequest(
            f"{name}: {value!r} is not a time; write 2026-12-01T08:30 (UTC), "
            "2026-12-01T08:30+01:00, 2026-12-01 or epoch milliseconds"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def encode_cursor(sort: str, sort_ms: int, task_id: str) -> str:
    raw = f"{sort}:{sort_ms}:{task_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(value: str, sort: str) -> tuple[int, str]:
    """(sort value, id) of the row a page continues after; the cursor must come from
    a page of the same sort."""
    if len(value) > _CURSOR_MAX or not re.fullmatch(r"[A-Za-z0-9_-]+", value):
        raise BadRequest("cursor: not a page cursor of this dashboard (follow the Next link)")
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise BadRequest(
            "cursor: not a page cursor of this dashboard (follow the Next link)"
        ) from None
    parts = raw.split(":", 2)
    if len(parts) != 3 or parts[0] not in SORTS or not re.fullmatch(r"-?\d{1,19}", parts[1]):
        raise BadRequest("cursor: not a page cursor of this dashboard (follow the Next link)")
    if parts[0] != sort:
        raise BadRequest(f"cursor: it pages the {parts[0]!r} sort, not {sort!r}")
    if parts[2] == "":
        # After a row whose sort value is a real (reads.next_cursor): every row of the
        # integer value is still to come, whatever its id.
        return int(parts[1]), _ABOVE_EVERY_ID
    if not _TASK_ID.fullmatch(parts[2]):
        raise BadRequest("cursor: not a page cursor of this dashboard (follow the Next link)")
    return int(parts[1]), parts[2]


def task_query(values: Mapping[str, str]) -> TaskQuery:
    """The task list's query from its (already parsed) parameters."""
    sort = values.get("sort") or "created"
    if sort not in SORTS:
        raise BadRequest(f"sort: must be one of {', '.join(SORTS)}, got {sort!r}")
    status = values.get("status") or None
    if status is not None and status not in STATUSES:
        raise BadRequest(f"status: must be one of {', '.join(STATUSES)}, got {status!r}")
    from_ms = parse_time(values["from"], "from") if values.get("from") else None
    to_ms = parse_time(values["to"], "to") if values.get("to") else None
    if from_ms is not None and to_ms is not None and from_ms >= to_ms:
        raise BadRequest("from: must be before to")
    limit = PAGE_SIZE
    if values.get("limit"):
        text = values["limit"]
        if not text.isdigit() or not 1 <= int(text) <= _PAGE_MAX:
            raise BadRequest(f"limit: must be a whole number from 1 to {_PAGE_MAX}, got {text!r}")
        limit = int(text)
    cursor = decode_cursor(values["cursor"], sort) if values.get("cursor") else None
    query = TaskQuery(
        sort=sort,
        status=status,
        queue=values.get("queue") or None,
        name=values.get("name") or None,
        key=values.get("key") or None,
        from_ms=from_ms,
        to_ms=to_ms,
        cursor=cursor,
        limit=limit,
    )
    _store_checks(query.params)
    return query


def _store_checks(check: Callable[[], object]) -> None:
    """Run the store's own argument checks on what the request asked for, here: a
    request the store refuses is a 400 naming why, and a ValueError later, while the
    page is read or drawn, is never taken for the request's fault (server.py)."""
    try:
        check()
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def task_id(value: str) -> str:
    """A task id from a URL path."""
    if not _TASK_ID.fullmatch(value):
        raise BadRequest(f"task id: {value[:80]!r} is not a task id")
    return value


def with_params(path: str, values: Mapping[str, str | None]) -> str:
    """`path` with the non-empty `values` as its query string."""
    kept = {k: v for k, v in values.items() if v}
    return f"{path}?{urlencode(kept)}" if kept else path


def back_path(value: str | None) -> str | None:
    """`value` if it is a page of this dashboard to send the browser back to (one of
    its paths, with a query), else None: never another site, however spelled."""
    if not value or len(value) > VALUE_MAX:
        return None
    # Browsers drop tabs and newlines inside a URL and read a backslash as a slash,
    # so "/\t/evil.example" and "/\\evil.example" would both be "//evil.example" to them.
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 or c == "\\" for c in value):
        return None
    if not value.startswith("/") or value.startswith("//"):
        return None
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return None
    if parts.path in _PAGES or _TASK_PATH.fullmatch(parts.path):
        return value
    return None


def local_path(value: str | None, default: str = "/") -> str:
    """A redirect target that stays on this dashboard (`back_path`), else `default`."""
    return back_path(value) or default


def selected_ids(value: str) -> list[str]:
    """The task ids of a "selected" form field (`parse_form` joined them by commas)."""
    ids = [task_id(v) for v in value.split(",") if v]
    if not ids:
        raise BadRequest("no task selected: tick the tasks to act on first")
    if len(ids) > SELECTED_MAX:
        raise BadRequest(f"id: at most {SELECTED_MAX} tasks at once, got {len(ids)}")
    return list(dict.fromkeys(ids))


def bulk_filter(values: Mapping[str, str]) -> tuple[str, TaskFilter, str]:
    """(op, filter, description) of a bulk action by filter: the task list's status,
    queue, name and creation range. Everything at once must be asked for: one filter
    at least, as `cairnqd cancel` by filter wants."""
    op = values.get("op", "")
    if op not in BULK_STATUSES:
        raise BadRequest(f"op: must be cancel or retry, got {op[:40]!r}")
    allowed = BULK_STATUSES[op]
    status = values.get("status") or None
    if status is not None and status not in allowed:
        raise BadRequest(f"status: {op} changes only {' and '.join(allowed)} tasks, not {status!r}")
    from_ms = parse_time(values["from"], "from") if values.get("from") else None
    to_ms = parse_time(values["to"], "to") if values.get("to") else None
    if from_ms is not None and to_ms is not None and from_ms >= to_ms:
        raise BadRequest("from: must be before to")
    queue, name = values.get("queue") or None, values.get("name") or None
    if status is None and queue is None and name is None and from_ms is None and to_ms is None:
        raise BadRequest(
            f"{op} all matching: filter the list first (status, queue, name or a creation "
            "range); every task at once is not offered"
        )
    where = TaskFilter(
        statuses=(status,) if status else allowed,
        queue=queue,
        name=name,
        created_after_ms=from_ms,
        created_before_ms=to_ms,
    )
    _store_checks(where.params)
    said = [f"status {'/'.join(where.statuses)}"]
    said += [f"queue {queue}"] if queue else []
    said += [f"name {name}"] if name else []
    said += [f"created from {values['from']}"] if from_ms is not None else []
    said += [f"created before {values['to']}"] if to_ms is not None else []
    return op, where, ", ".join(said)


__all__ = [
    "BULK_FILTERS",
    "BULK_STATUSES",
    "PAGE_SIZE",
    "SELECTED_MAX",
    "TASK_FILTERS",
    "BadRequest",
    "back_path",
    "bulk_filter",
    "decode_cursor",
    "encode_cursor",
    "local_path",
    "parse_form",
    "parse_query",
    "parse_time",
    "selected_ids",
    "task_id",
    "task_query",
    "with_params",
]
