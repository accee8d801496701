"""Argument checks for the store's operations, each naming the argument, and
`SubmitRequest`. The limits are Postgres's, applied on SQLite too, so every row either
dialect writes can move to the other and to the public SDKs unchanged
(docs/architecture.md, "Argument limits").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any

from cairnqd._ids import new_task_id
from cairnqd._jsoncodec import dump_json_or_empty, load_json
from cairnqd.models import CONFLICTS, STATUSES, TERMINAL_STATUSES, task_name

Params = dict[str, Any]


INT4_MIN = -(2**31)
INT4_MAX = 2**31 - 1
INT8_MIN = -(2**63)
INT8_MAX = 2**63 - 1
MAX_DURATION_MS = 100 * 365 * 86_400_000
MAX_TEXT_BYTES = 1000
#: The most any of a worker's counts may be (concurrency, prefetch, a batch size, a
#: resource's capacity): a claim asks for batch size x (free call slots + prefetch)
#: rows in one 64-bit LIMIT, which factors of at most 32 bits keep inside.
MAX_WORKER_COUNT = INT4_MAX
# The optional text arguments of a submit that hold ids or a key.
TEXT_IDS = ("key", "parent_id", "root_id", "correlation_id")


def require_str(
    value: Any, arg: str, *, optional: bool = False, max_bytes: int | None = None
) -> None:
    """A non-empty string both dialects can store (and, with `max_bytes`, index)."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        raise ValueError(f"{arg} must be a non-empty string, got {shown(value)}")
    check_text(value, arg, max_bytes=max_bytes)


def check_text(value: str, arg: str, *, max_bytes: int | None = None) -> None:
    """Text Postgres can store: no NUL, no lone surrogate, at most `max_bytes`."""
    if value.isascii():
        size = len(value)
    else:
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError(
                f"{arg} contains a lone UTF-16 surrogate, which is not valid Unicode text"
            ) from None
    if "\x00" in value:
        raise ValueError(f"{arg} must not contain a NUL character (\\x00)")
    if max_bytes is not None and size > max_bytes:
        raise ValueError(f"{arg} is {size} bytes in UTF-8; the limit is {max_bytes}")


def require_int(
    value: Any, arg: str, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{arg} must be an integer, got {shown(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{arg} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{arg} must be <= {maximum}, got {value}")
    return value


def require_duration(value: Any, arg: str, *, minimum: int = 0) -> int:
    """Milliseconds, from `minimum` up to 100 years."""
    return require_int(value, arg, minimum=minimum, maximum=MAX_DURATION_MS)


def require_bigint(value: Any, arg: str, *, optional: bool = False) -> None:
    """An integer a bigint column compares with (an epoch-milliseconds bound): past it,
    SQLite's driver overflowed and Postgres refused the statement."""
    if value is None and optional:
        return
    require_int(value, arg, minimum=INT8_MIN, maximum=INT8_MAX)


def check_after_id(value: Any, arg: str = "after_id") -> None:
    """A page's "after this id" cursor: text both dialects compare, "" before the first."""
    if not isinstance(value, str):
        raise ValueError(f"{arg} must be a string, got {shown(value)}")
    check_text(value, arg)


def require_number(
    value: Any, arg: str, *, minimum: float, maximum: float, what: str = "a number"
) -> float:
    """A real number from `minimum` to `maximum`. NaN is refused too: it fails every
    comparison, so a check written `value < 0` let it through."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not minimum <= value <= maximum  # False for NaN
    ):
        raise ValueError(f"{arg} must be {what} from {minimum} to {maximum}, got {shown(value)}")
    return float(value)


def shown(value: Any) -> str:
    """How an error message quotes a value: its repr, but never megabytes of it."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def check_status_filter(status: Any) -> None:
    """`list`'s status filter: any status, or None for all."""
    if status is not None and (not isinstance(status, str) or status not in STATUSES):
        raise ValueError(f"unknown status filter: {shown(status)}")


def check_terminal_status(status: Any) -> None:
    """A purge's status filter: purge deletes finished tasks only, so a live status
    would be a filter that silently matches nothing."""
    # A str first: a list is unhashable, and the set lookup raised TypeError for it.
    if status is not None and (not isinstance(status, str) or status not in TERMINAL_STATUSES):
        raise ValueError(f"status must be terminal, got {shown(status)}")


def check_page(limit: Any, offset: Any) -> None:
    """`list`'s page: two integers, neither negative."""
    require_int(limit, "limit", maximum=INT8_MAX)
    require_int(offset, "offset", maximum=INT8_MAX)
    if limit < 0 or offset < 0:
        raise ValueError(f"limit/offset must be >= 0, got limit={limit} offset={offset}")


def optional_filters(params: Mapping[str, Any], names: Sequence[str]) -> frozenset[str]:
    """The optional filters a call actually set, for `_protocol.specialize`."""
    return frozenset(n for n in names if params.get(n) is not None)


def _check_conflict(value: Any) -> None:
    if value not in CONFLICTS:
        raise ValueError(f"unknown conflict strategy: {value!r}")


def _text_check(arg: str, *, optional: bool) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        # Most text is short ASCII: passed here in one call (submit_many checks
        # thousands); anything else takes the full check and its error messages.
        if (
            type(value) is str
            and value.isascii()
            and 0 < len(value) <= MAX_TEXT_BYTES
            and "\x00" not in value
        ):
            return
        require_str(value, arg, optional=optional, max_bytes=MAX_TEXT_BYTES)

    return check


#: Each submit argument's check, in the order a request with several bad arguments
#: reports them (the first one fails).
_CHECKS: dict[str, Callable[[Any], object]] = {
    "conflict": _check_conflict,
    "max_attempts": lambda v: require_int(v, "max_attempts", minimum=1, maximum=INT4_MAX),
    "delay_ms": lambda v: require_duration(v, "delay_ms"),
    "priority": lambda v: require_int(v, "priority", minimum=INT4_MIN, maximum=INT4_MAX),
    "name": _text_check("name", optional=False),
    "queue": _text_check("queue", optional=False),
    **{arg: _text_check(arg, optional=True) for arg in TEXT_IDS},
}


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """One task to submit: `TaskStore.submit`'s arguments and their defaults, checked
    when the request is made so a bad one never reaches the database."""

    name: str
    payload: Any = None
    queue: str = "default"
    key: str | None = None
    conflict: str = "reuse"
    max_attempts: int = 3
    priority: int = 0
    metadata: Any = None
    parent_id: str | None = None
    root_id: str | None = None
    correlation_id: str | None = None
    delay_ms: int = 0

    def __post_init__(self) -> None:
        for arg, check in _CHECKS.items():
            check(getattr(self, arg))

    @classmethod
    def from_mapping(cls, item: Mapping[str, Any]) -> SubmitRequest:
        """A request from a mapping of submit arguments (`submit_many`'s items); `name`
        may be a TaskDef. Unknown or missing arguments raise TypeError."""
        _check_keys(item)
        return cls(**{**item, "name": task_name(item["name"])})

    def insert_params(self) -> Params:
        """The insert statements' parameters, under a new task id. JSON is encoded
        here, so a value JSON cannot carry fails before anything is written."""
        values = {arg: getattr(self, arg) for arg in _ARGUMENT_ORDER}
        return _insert_params(values, new_task_id())


def submit_params(values: Mapping[str, Any]) -> Params:
    """`SubmitRequest(**values).insert_params()` without the request object, for `submit`
    (one call per task, so its few microseconds count): `values` holds every argument,
    and one that is still its default (that very object) is valid, so only the others
    are checked, in the same order, with the same errors."""
    for arg, check in _CHECKS.items():
        value = values[arg]
        if value is not _DEFAULTS.get(arg, _NO_DEFAULT):
            check(value)
    return _insert_params(values, new_task_id())


def insert_params_for(item: Mapping[str, Any], task_id: str) -> Params:
    """`SubmitRequest.from_mapping(item).insert_params()` without the request object,
    for `submit_many`'s thousands of items (whose ids it makes in one go, hence
    `task_id`): only the arguments the item sets are checked (the defaults are valid),
    in the same order, with the same errors."""
    _check_keys(item)
    values = {**_DEFAULTS, **item, "name": task_name(item["name"])}
    try:
        for arg in item:  # usually two or three, where _CHECKS has ten
            check = _CHECKS.get(arg)
            if check is not None:
                check(values[arg])
    except ValueError:
        # Several may be bad: report the one a SubmitRequest would, the first in
        # _CHECKS order.
        for arg, check in _CHECKS.items():
            if arg in item:
                check(values[arg])
        raise
    return _insert_params(values, task_id)


def _check_keys(item: Mapping[str, Any]) -> None:
    if not _ARGUMENTS.issuperset(item):  # no set built for the common, valid item
        unknown = item.keys() - _ARGUMENTS
        raise TypeError(f"unknown submit argument(s): {', '.join(sorted(map(str, unknown)))}")
    if "name" not in item:
        raise TypeError("missing 'name'")


def _insert_params(values: Mapping[str, Any], task_id: str) -> Params:
    payload, metadata, root_id = values["payload"], values["metadata"], values["root_id"]
    payload_json = dump_json_or_empty(payload, what="payload")
    metadata_json = dump_json_or_empty(metadata, what="metadata")
    return {
        "id": task_id,
        "name": values["name"],
        "queue": values["queue"],
        "payload": payload_json,
        "metadata": metadata_json,
        # The values as stored, for tasks built without reading the row back.
        "payload_value": stored_value(payload, payload_json),
        "metadata_value": stored_value(metadata, metadata_json),
        "max_attempts": values["max_attempts"],
        "priority": values["priority"],
        "parent_id": values["parent_id"],
        "root_id": root_id if root_id is not None else task_id,
        "correlation_id": values["correlation_id"],
        "delay_ms": values["delay_ms"],
        "key": values["key"],
        "conflict": values["conflict"],
    }


# The types JSON reads back as themselves (a subclass, such as an IntEnum, is not).
_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})


def stored_value(value: Any, text: str) -> Any:
    """`value` as reading back `text`, its JSON, gives it: what a task built without
    reading its row back must hold. Most values already are (a scalar, a flat object
    of scalars under string keys, a flat array) and are kept; any other is decoded from
    `text`, since a tuple reads back as an array, a key 1 as "1" and an IntEnum as an
    int: kept as given, a submit handed back what neither `get` nor a keyed submit (nor
    the public SDK) does."""
    kind = type(value)
    if kind in _JSON_SCALARS:
        return {} if value is None else value
    if kind is dict:
        if all(type(k) is str and type(v) in _JSON_SCALARS for k, v in value.items()):
            return value
    elif kind is list and all(type(v) in _JSON_SCALARS for v in value):
        return value
    return load_json(text)


_ARGUMENT_ORDER = tuple(f.name for f in fields(SubmitRequest))
_ARGUMENTS = frozenset(_ARGUMENT_ORDER)
# What an argument a mapping leaves out means (`name` has no default).
_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in fields(SubmitRequest) if f.default is not MISSING
}
_NO_DEFAULT = object()

__all__ = [
    "INT4_MAX",
    "INT4_MIN",
    "INT8_MAX",
    "INT8_MIN",
    "MAX_DURATION_MS",
    "MAX_TEXT_BYTES",
    "MAX_WORKER_COUNT",
    "SubmitRequest",
    "check_after_id",
    "check_page",
    "check_status_filter",
    "check_terminal_status",
    "check_text",
    "insert_params_for",
    "optional_filters",
    "require_bigint",
    "require_duration",
    "require_int",
    "require_number",
    "require_str",
    "shown",
    "submit_params",
]
