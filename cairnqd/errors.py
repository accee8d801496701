"""Errors raised by cairnqd, and the stored failure envelope.

The class names follow the public cairnq SDK exactly: code written against it and the
conformance runner match on them (docs/architecture.md, "Errors").
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cairnqd.attempts import attempts_shown

if TYPE_CHECKING:
    from cairnqd.models import Task


@dataclass(frozen=True)
class ErrorEnvelope:
    """Why a task attempt failed, as stored in its `error` column."""

    type: str
    code: str
    message: str
    retryable: bool = False
    details: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        """The stored form: exactly the five keys, details as a plain dict."""
        return {
            "type": self.type,
            "code": self.code,
            "message": self.message,
            "retryable": self.retryable,
            "details": dict(self.details),
        }

    @classmethod
    def from_exception(
        cls, exc: BaseException, *, retryable: bool, code: str = "handler_error"
    ) -> ErrorEnvelope:
        """The envelope of an exception a handler raised: a `TaskError` keeps its own
        fields (and its own `retryable`); anything else is named by its class."""
        if isinstance(exc, TaskError):
            return exc.to_envelope()
        return cls(
            type=type(exc).__name__, code=code, message=exception_text(exc), retryable=retryable
        )

    @classmethod
    def from_stored(cls, error: object) -> ErrorEnvelope:
        """Read a stored envelope, which another SDK (or an older one) may have written
        with fields missing or of other types: each falls back to a neutral default."""
        stored: Mapping[str, Any] = error if isinstance(error, Mapping) else {}
        details = stored.get("details")

        def text(key: str, default: str) -> str:
            # A JSON null is a field left empty, not the text "None".
            value = stored.get(key)
            return default if value is None else str(value)

        return cls(
            type=text("type", "TaskError"),
            code=text("code", "task_error"),
            message=text("message", "task failed"),
            retryable=bool(stored.get("retryable", False)),
            details=details if isinstance(details, dict) else {},
        )


def exception_text(exc: BaseException) -> str:
    """`str(exc)`, never raising: an exception's own `__str__` is the handler author's
    code, and may raise or return something other than text. Then, as `traceback` does
    (`<exception str() failed>`), a placeholder, which here also says why:
    `<exception str() failed: RuntimeError: x>`."""
    try:
        text = str(exc)
    except BaseException as problem:  # whatever it raised, say so instead
        return f"<exception str() failed: {_named(problem)}>"
    # A str subclass may carry its own behaviour into what is stored and logged.
    return text if type(text) is str else str.__str__(text)


def _named(problem: BaseException) -> str:
    """`Type: text` of an exception that `__str__` raised, or just its type when its
    own text fails too (no further: that could go on for ever)."""
    name = type(problem).__name__
    try:
        text = str(problem)
    except BaseException:  # the type alone is what is left to show
        return name
    return f"{name}: {text}" if text else name


class CairnQError(Exception):
    """Base class of every error cairnqd raises on purpose."""


# The messages below are the public SDK's, word for word: code written against it
# matches on them in logs and tests (docs/protocol.md, "8.13 Messages").


class AlreadyExists(CairnQError):
    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"task with key {key!r} already exists")


class QueueFull(CairnQError):
    def __init__(self, queue: str, max_depth: int, waited_ms: int) -> None:
        self.queue = queue
        self.max_depth = max_depth
        self.waited_ms = waited_ms
        super().__init__(
            f"queue {queue!r} still holds {max_depth} or more queued tasks after "
            f"{waited_ms}ms; refusing to enqueue more"
        )


def _describe_stuck(task: Task | None, key: str | None) -> str:
    """Why a wait gave up, from the last snapshot it read. A task nobody claims is
    the first-run failure (no worker, no handler, another queue or file), so that
    case names its likely causes."""
    if task is None:
        if key is not None:
            return "no task under this key — never submitted, or already purged?"
        return "task not found — wrong database file, or already purged?"
    if task.status == "queued":
        due_in_ms = task.run_at_ms - int(time.time() * 1000)
        if task.attempt == 0 and due_in_ms <= 0:
            return (
                "never claimed by a worker — is a worker running with a handler for "
                f"'{task.name}' on queue '{task.queue}', against this same database?"
            )
        when = f", next run in ~{due_in_ms}ms" if due_in_ms > 0 else ""
        return f"still queued (attempt {attempts_shown(task.attempt, task.max_attempts)}){when}"
    if task.cancel_requested:
        return "cancel requested, waiting for the handler to observe it"
    return f"still running (attempt {attempts_shown(task.attempt, task.max_attempts)})"


class TaskTimeout(CairnQError):
    """wait()/call() gave up; the task itself keeps going. Resume with
    `wait(err.task_id)` or `wait_by_key(err.key)`. `task` is the last snapshot read
    (None when nothing was found); `task_id` is the key itself when a key pointed
    at nothing."""

    def __init__(
        self,
        task_id: str,
        *,
        timeout_ms: int | None = None,
        task: Task | None = None,
        key: str | None = None,
    ) -> None:
        self.task_id = task_id
        self.timeout_ms = timeout_ms
        self.task = task
        self.key = key
        subject = f"task {task_id}" if key is None else f"key {key}"
        if timeout_ms is None:
            message = f"{subject} did not finish in time"
        else:
            message = (
                f"{subject} did not finish within {timeout_ms}ms: {_describe_stuck(task, key)}"
            )
        super().__init__(message)


class TaskFailed(CairnQError):
    """The task ended `failed`; the envelope's fields are unpacked, and the message
    is the envelope's own."""

    def __init__(self, error: dict[str, Any] | None) -> None:
        envelope = ErrorEnvelope.from_stored(error)
        self.error = error
        self.type: str = envelope.type
        self.code: str = envelope.code
        self.message: str = envelope.message
        self.retryable: bool = envelope.retryable
        self.details: dict[str, Any] = dict(envelope.details)
        super().__init__(self.message)


class TaskCanceled(CairnQError):
    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(f"task {task_id} was canceled")


class LostLease(CairnQError):
    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(f"lost lease on task {task_id}")


class ProtocolVersionMismatch(CairnQError):
    pass


class SchemaMismatch(CairnQError):
    pass


class UnsupportedBackend(CairnQError):
    pass


class StoreClosed(CairnQError):
    pass


class SerializationError(CairnQError):
    pass


class ListenUnavailable(CairnQError):
    pass


class NotACairnqDatabase(CairnQError):
    """The target exists but is not (and cannot become) a cairnq database."""


class MigrationsPending(CairnQError):
    """The database lacks migrations and this process may not apply them."""

    def __init__(self, where: str, names: list[str]) -> None:
        self.names = names
        super().__init__(
            f"{where}: {len(names)} migration(s) pending ({', '.join(names)}); "
            "run `cairnqd migrate` (or set database.auto_migrate: true)"
        )


class DatabaseUnavailable(CairnQError):
    """The database server could not be reached or refused the connection."""


class UndecodableRow(CairnQError):
    """A stored row holds a value this runtime cannot decode (another client wrote it):
    text that is not UTF-8, JSON nested deeper than it reads, a number it refuses.
    A claim fails such a task at once, with `envelope()` as its error; reads show the
    value as a marker instead (see `cairnqd._jsoncodec.Undecodable`)."""

    #: The error envelope's `type` and `code`.
    TYPE = "UndecodableRow"
    CODE = "undecodable_row"

    def __init__(self, column: str, reason: str, raw: str = "") -> None:
        self.column = column
        self.reason = reason
        #: The value's text (bad bytes escaped), cut short to be readable.
        self.raw = raw
        super().__init__(f"column {column} cannot be decoded: {reason}")

    def envelope(self) -> ErrorEnvelope:
        """The error a claim fails the task with: never retried, since every attempt
        would read the same row."""
        return ErrorEnvelope(
            type=self.TYPE,
            code=self.CODE,
            message=f"{self}; the task was failed without running",
            retryable=False,
            details={"column": self.column, "reason": self.reason, "raw": self.raw},
        )


class TaskError(CairnQError):
    """Raise from a handler to fail the task with a chosen envelope.

    Not retryable unless asked: a handler that names its error usually knows
    another attempt will not help."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "task_error",
        retryable: bool = False,
        type: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        # Refused here, where the handler builds its error, as a result JSON cannot
        # carry is refused by `ctx.succeed`: raised later, the envelope would lose
        # these parts without a word (docs/protocol.md §4.5).
        _require_text(message, "message")
        _require_text(code, "code")
        if type is not None:
            _require_text(type, "type")
        if details is not None and not isinstance(details, Mapping):
            raise ValueError(f"TaskError details must be a mapping, got {_kind(details)}")
        self.message = message
        self.code = code
        # The stored `retryable` is a JSON bool whatever was passed, as the store's is.
        self.retryable = bool(retryable)
        self.type = type or "TaskError"
        self.details = dict(details) if details else {}
        if self.details:
            # Here, not at the top: cairnqd._jsoncodec imports this module.
            from cairnqd._jsoncodec import dump_json

            # NUL and lone surrogates pass: the worker escapes them when it writes.
            dump_json(self.details, what="TaskError details", check=False)
        super().__init__(message)

    def to_envelope(self) -> ErrorEnvelope:
        return ErrorEnvelope(
            type=self.type,
            code=self.code,
            message=self.message,
            retryable=self.retryable,
            details=self.details,
        )

    def envelope(self) -> dict[str, Any]:
        """The stored form of `to_envelope()`."""
        return self.to_envelope().to_dict()


def _require_text(value: object, arg: str) -> None:
    if not isinstance(value, str):
        raise ValueError(f"TaskError {arg} must be a str, got {_kind(value)}")


def _kind(value: object) -> str:
    return type(value).__name__
