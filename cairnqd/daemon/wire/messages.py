"""The messages parent and children exchange: one frozen dataclass per kind.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar, Union

#: The pipe protocol's version, carried by `boot` and `ready`. A parent spawns the code
#: installed on disk, which an upgrade may have replaced; a mismatch stops the child.
PROTOCOL_VERSION = 2
#: POSIX makes a pipe write of at most this many bytes atomic: a child's threads never
#: interleave half-lines, as long as each message fits.
PIPE_BUF = 4096

M = TypeVar("M")

#: A child whose claims and lease renewals have made no progress this long is stalled:
#: it says once what blocks it, and /healthz names its group.
STALL_WARN_S = 10.0


class MessageError(ValueError):
    """A line that is not a valid message: not JSON, an unknown kind, a field missing
    or of the wrong type."""


# -- child to parent -----------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """Boot is done: the child claims from now on."""

    kind: ClassVar[Literal["ready"]] = "ready"
    v: int
    pid: int
    worker_id: str
    gen: int
    rss: int


@dataclass(frozen=True)
class Overrun:
    """A task whose handler has run longer than the group's `max_run`."""

    id: str
    attempt: int
    age_s: float


@dataclass(frozen=True)
class LongestTask:
    """The task whose handler has been running longest, for status views."""

    id: str
    name: str
    age_s: float


@dataclass(frozen=True)
class Heartbeat:
    """Every `hb_interval_s`, from a thread of its own, whether or not the event loop
    runs: silence means the process is stuck; `lag_s` says whether its loop is."""

    kind: ClassVar[Literal["hb"]] = "hb"
    rss: int
    #: starting, run, db_wait, draining, quiet or orphaned.
    state: str
    #: Tasks whose handler is running (or whose result waits to be written).
    executing: int
    #: Tasks claimed ahead that wait for a free slot.
    held: int
    #: Seconds the event loop has gone without running (0 while it keeps up).
    lag_s: float
    overdue: tuple[Overrun, ...]
    longest: LongestTask | None
    #: Seconds its database calls have failed for want of an answer (0: it answers).
    db_down_s: float = 0.0
    #: Its queues it finds paused (`cairnqd pause`) and so does not claim from.
    paused: tuple[str, ...] = ()
    #: Its LISTEN was accepted but is deaf (store/postgres/listen.py): it polls instead.
    listen_deaf: bool = False
    #: Seconds its claims, lease renewals and result writes have gone without one
    #: succeeding while it needed them (a lock, a wedge, repeated errors); 0 if fine.
    stalled_s: float = 0.0
    #: Its longest-running tasks, oldest first, as many as fit (a roll or a stop
    #: past shutdown_timeout would cut these short). Optional on the wire: a parent
    #: ignores it, or finds it missing, across releases.
    running: tuple[LongestTask, ...] = ()
    #: Wake-ups since it started (a notification, or the poll) whose claim found
    #: nothing: another worker answered it first, or nothing was queued.
    empty_wakes: int = 0


#: What a tally counts; "failed" counts every failed attempt, "retried" the requeued
#: subset. The child counts these, the parent refuses any other.
TALLY_KINDS = ("started", "succeeded", "failed", "retried", "canceled")
#: A tally count's identity: queue, task name, kind, reason ("" unless failed).
CounterKey = tuple[str, str, str, str]


@dataclass(frozen=True)
class TallyCount:
    """One cumulative task counter (see `daemon.tally`)."""

    queue: str
    name: str
    #: started, succeeded, failed, retried or canceled.
    what: str
    #: A failure's bounded reason, else empty.
    reason: str
    n: int


@dataclass(frozen=True)
class Tally:
    """The child's task counts since it started, sent a few times a second while they
    change; cumulative, so one lost on the way loses nothing."""

    kind: ClassVar[Literal["tally"]] = "tally"
    counts: tuple[TallyCount, ...]
    #: Per queue: per-bucket counts of task durations (+Inf last), then their sum.
    durations: Mapping[str, tuple[float, ...]]
    #: Per queue: the same for queue waits.
    waits: Mapping[str, tuple[float, ...]]


@dataclass(frozen=True)
class DatabaseTrouble:
    """A database error the child survived."""

    kind: ClassVar[Literal["dberr"]] = "dberr"
    #: busy, timeout, connect, full or other (a metric label; others count as other).
    error_kind: str
    phase: str = ""


@dataclass(frozen=True)
class Goodbye:
    """Sent before a planned exit 0."""

    kind: ClassVar[Literal["bye"]] = "bye"
    #: drain, max_tasks, max_memory or orphaned.
    reason: str


@dataclass(frozen=True)
class Fatal:
    """Sent before exit 78: this child cannot boot, and neither will the next."""

    kind: ClassVar[Literal["fatal"]] = "fatal"
    error: str


@dataclass(frozen=True)
class CancelStuck:
    """A canceled handler did not stop within twice the group's `cancel_grace`: the
    child asks to be replaced (it cannot stop a thread), and has stopped claiming."""

    kind: ClassVar[Literal["cancel_stuck"]] = "cancel_stuck"
    #: The tasks of the handler, `id attempt N` each (for the log).
    tasks: tuple[str, ...]


@dataclass(frozen=True)
class Room:
    """Whether a task it claimed now would start at once (a free call slot, nothing
    claimed ahead waiting for one, claiming on): sent when that flips, and only by a
    child whose wake-ups the parent relays (daemon/parent/wakerouting.py routes them)."""

    kind: ClassVar[Literal["room"]] = "room"
    free: bool


ChildMessage = Ready | Heartbeat | Tally | DatabaseTrouble | Goodbye | Fatal | CancelStuck | Room

# -- parent to child -------------------------------------------------------------------------


@dataclass(frozen=True)
class SetLogging:
    """Reloaded logging settings, applied in place (`logs.logging_settings` shape)."""

    kind: ClassVar[Literal["log_level"]] = "log_level"
    logging: Mapping[str, Any]


@dataclass(frozen=True)
class ReopenLogs:
    """logrotate renamed `logging.file`; the parent got SIGUSR1."""

    kind: ClassVar[Literal["reopen_logs"]] = "reopen_logs"


@dataclass(frozen=True)
class Claiming:
    """Start or stop claiming: the parent ends a SIGTSTP quiet with `on=True` when a
    reload is applied."""

    kind: ClassVar[Literal["claiming"]] = "claiming"
    on: bool


@dataclass(frozen=True)
class Wake:
    """Work was queued on these queues: the parent's LISTEN on `direct_dsn` heard it
    (daemon/parent/wakerelay.py), and passes it on to the children that claim from them."""

    kind: ClassVar[Literal["wake"]] = "wake"
    queues: tuple[str, ...]


@dataclass(frozen=True)
class SetLimits:
    """Reloaded flow-control limits (`limits:`, as `Worker(limits=...)` takes them),
    kept from the next claim on without a restart (docs/limits.md)."""

    kind: ClassVar[Literal["limits"]] = "limits"
    limits: Mapping[str, Any]


@dataclass(frozen=True)
class SetCancelGrace:
    """A reloaded `groups.<g>.cancel_grace`, in seconds, kept from now on."""

    kind: ClassVar[Literal["cancel_grace"]] = "cancel_grace"
    grace_s: float


ControlMessage = SetLogging | ReopenLogs | Claiming | Wake | SetLimits | SetCancelGrace

_CHILD_KINDS: dict[str, type[Any]] = {
    cls.kind: cls
    for cls in (Ready, Heartbeat, Tally, DatabaseTrouble, Goodbye, Fatal, CancelStuck, Room)
}
_CONTROL_KINDS: dict[str, type[Any]] = {
    cls.kind: cls for cls in (SetLogging, ReopenLogs, Claiming, Wake, SetLimits, SetCancelGrace)
}
# Wire names that differ from the field's: `kind` is the class tag in Python.
_WIRE_NAMES = {(DatabaseTrouble, "error_kind"): "kind"}

# -- encoding --------------------------------------------------------------------------------


def _fields_of(message: Any) -> dict[str, Any]:
    names, flat = _layout(type(message))
    if flat:  # every task event: no nested values to convert
        return {wire: getattr(message, name) for name, wire in names}
    return {wire: _plain(getattr(message, name)) for name, wire in names}


_Layout = tuple[tuple[tuple[str, str], ...], bool]
_layouts: dict[type[Any], _Layout] = {}


def _layout(cls: type[Any]) -> _Layout:
    """(field name, wire name) pairs, and whether every field is a plain JSON value."""
    known = _layouts.get(cls)
    if known is not None:
        return known
    hints = typing.get_type_hints(cls)
    names = tuple((f.name, _WIRE_NAMES.get((cls, f.name), f.name)) for f in dataclasses.fields(cls))
    flat = all(hints[name] in (int, float, str, bool) for name, _ in names)
    _layouts[cls] = (names, flat)
    return names, flat


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _fields_of(value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def encode(message: Any) -> bytes:
    """One message as a line of JSON, whatever its size (the parent's `boot`)."""
    data = {"t": message.kind, **_fields_of(message)}
    return (json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def encode_atomic(message: Any) -> bytes:
    """One message as a line of at most PIPE_BUF bytes. A longer one (a long error
    text) has its longest text field shortened, never split across two writes."""
    line = encode(message)
    while len(line) > PIPE_BUF:
        texts = {
            f.name: value
            for f in dataclasses.fields(message)
            if isinstance(value := getattr(message, f.name), str)
        }
        if not texts:
            raise MessageError(f"{message.kind} message of {len(line)} bytes cannot be shortened")
        name = max(texts, key=lambda n: len(texts[n]))
        excess = len(line) - PIPE_BUF + 3  # three bytes for the ellipsis
        keep = max(0, len(texts[name].encode()) - excess)
        shortened = texts[name].encode()[:keep].decode(errors="ignore") + "\u2026"
        message = dataclasses.replace(message, **{name: shortened})
        line = encode(message)
    return line


# -- decoding --------------------------------------------------------------------------------


def decode_child(line: bytes) -> ChildMessage:
    """A line from a child's events pipe; MessageError unless it is a valid message."""
    return _decode(line, _CHILD_KINDS)  # type: ignore[no-any-return]


def decode_control(line: bytes) -> ControlMessage:
    """A line from the parent's control pipe (after `boot`)."""
    return _decode(line, _CONTROL_KINDS)  # type: ignore[no-any-return]


def parse_line(line: bytes) -> dict[str, Any]:
    """The JSON object on one line; MessageError if it is not one."""
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MessageError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise MessageError(f"not a JSON object but {type(data).__name__}")
    return data


def _decode(line: bytes, kinds: Mapping[str, type[Any]]) -> Any:
    data = parse_line(line)
    kind = data.get("t")
    cls = kinds.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise MessageError(f"unknown message kind {kind!r}")
    return decode_fields(cls, data)


def decode_fields(cls: type[M], data: Mapping[str, Any]) -> M:
    """Build dataclass `cls` from `data`, checking every field against its annotation."""
    values = {}
    for name, wire, check, required in _schema(cls):
        if wire in data:
            try:
                values[name] = check(data[wire])
            except MessageError as exc:
                raise MessageError(f"{_label(cls)}.{wire}: {exc}") from None
        elif required:
            raise MessageError(f"{_label(cls)} message without {wire!r}")
    return cls(**values)


def _label(cls: type[Any]) -> str:
    return str(getattr(cls, "kind", cls.__name__))


_Check = Callable[[Any], Any]


_Schema = tuple[tuple[str, str, _Check, bool], ...]
_schemas: dict[type[Any], _Schema] = {}


def _schema(cls: type[Any]) -> _Schema:
    """(field name, wire name, check, required) for each field of `cls`."""
    known = _schemas.get(cls)
    if known is not None:
        return known
    hints = typing.get_type_hints(cls)
    schema = tuple(
        (
            f.name,
            _WIRE_NAMES.get((cls, f.name), f.name),
            _checker(hints[f.name]),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
    )
    _schemas[cls] = schema
    return schema


def _checker(hint: Any) -> _Check:
    """A function that returns `value` as `hint` says, or raises MessageError."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return _union(tuple(_checker(a) for a in args))
    if origin is Literal:
        return lambda v: _one_of(v, args)
    if origin is tuple:
        item = _checker(args[0])
        return lambda v: tuple(item(x) for x in _expect(v, list))
    if origin in (Mapping, dict):
        value_check = _checker(args[1])
        return lambda v: {_expect(k, str): value_check(x) for k, x in _expect(v, dict).items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return lambda v: decode_fields(hint, _expect(v, dict))
    if hint is Any:
        return lambda v: v
    if hint is type(None):
        return lambda v: _expect(v, type(None))
    if hint is float:
        return lambda v: float(_bounded(_expect(v, (int, float))))
    if hint is int:
        return lambda v: _bounded(_expect(v, int))
    if hint in (str, bool):
        return lambda v: _expect(v, hint)
    raise TypeError(f"no message check for {hint!r}")


def _union(checks: tuple[_Check, ...]) -> _Check:
    def check(value: Any) -> Any:
        errors = []
        for one in checks:
            try:
                return one(value)
            except MessageError as exc:
                errors.append(str(exc))
        raise MessageError(" or ".join(errors))

    return check


def _expect(value: Any, kinds: type | tuple[type, ...]) -> Any:
    # bool is an int subclass, but `true` is no pid, count or size.
    if isinstance(value, bool) and kinds is not bool:
        raise MessageError(f"expected {_names(kinds)}, got a bool")
    if not isinstance(value, kinds):
        raise MessageError(f"expected {_names(kinds)}, got {type(value).__name__}")
    return value


def _one_of(value: Any, allowed: tuple[Any, ...]) -> Any:
    if isinstance(value, bool) or value not in allowed:
        raise MessageError(f"expected one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def _bounded(value: Any) -> Any:
    # A JSON integer has no size limit; one past 64 bits is no count, and would
    # overflow the float a metric stores.
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise MessageError("integer out of range")
    return value


def _names(kinds: type | tuple[type, ...]) -> str:
    names = {"NoneType": "null", "int": "integer", "float": "number", "str": "string"}
    listed = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(names.get(k.__name__, k.__name__) for k in listed)
