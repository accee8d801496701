"""Logging for the parent and every child: one format, one destination, reopenable.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

from cairnqd import tasklog

if TYPE_CHECKING:
    from cairnqd.config import LoggingConfig

__all__ = [
    "LoggingSetupError",
    "configure_logging",
    "logging_settings",
    "reopen_logs",
]

log = logging.getLogger("cairnqd.logs")

# The Postgres driver warns on every retry of an outage (a failed cancel, a discarded
# connection, a failed reconnect); the daemon says it once itself ("database
# unreachable"). `logging.loggers` can still turn them back on.
_DRIVER_LEVELS = {"psycopg": "ERROR"}

#: Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",  # 3.12+ adds it to every record
}

#: Record attributes that are not `extra=` fields: private ones, and the task's (written
#: under their short names) and the text prefix made of them.
_OURS = ("_", "cairnq_")

# Serialises (re)configuration against reopen: the supervisor calls both from its
# loop, but a child's reopen and a reload's re-apply must never interleave either.
_lock = threading.Lock()
_configured_loggers: set[str] = set()


class LoggingSetupError(Exception):
    """`logging.file` cannot be opened; the message says what to fix."""


@dataclass(frozen=True)
class _Settings:
    level: str
    format: str
    file: str | None
    loggers: Mapping[str, str]


def logging_settings(config: LoggingConfig) -> dict[str, Any]:
    """`config` as the plain JSON-ready dict a child's boot message carries."""
    return {
        "level": config.level.upper(),
        "format": config.format,
        "file": config.file,
        "loggers": {name: level.upper() for name, level in config.loggers.items()},
    }


def _normalize(settings: LoggingConfig | Mapping[str, Any]) -> _Settings:
    if not isinstance(settings, Mapping):  # a LoggingConfig (the parent) or its dict (a child)
        settings = logging_settings(settings)
    fmt = str(settings.get("format") or "text")
    if fmt not in ("text", "json"):
        raise LoggingSetupError(f"logging.format must be text or json, not {fmt!r}")
    file = settings.get("file")
    loggers = settings.get("loggers") or {}
    return _Settings(
        level=str(settings.get("level") or "INFO").upper(),
        format=fmt,
        file=None if file is None else str(file),
        loggers={str(k): str(v).upper() for k, v in loggers.items()},
    )


# -- formatters -----------------------------------------------------------------------------


class TextFormatter(logging.Formatter):
    """`<asctime> cairnqd[<pid>] <label> <LEVEL> <logger> <message>`; a record made inside
    a handler has `[task <id> <name>#<attempt> @<queue>] ` before its message."""

    def __init__(self, process_label: str) -> None:
        label = process_label.replace("%", "%%")  # it becomes part of a %-style format
        super().__init__(
            f"%(asctime)s cairnqd[%(process)d] {label} %(levelname)s %(name)s "
            "%(cairnq_prefix)s%(message)s"
        )

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.cairnq_prefix = tasklog.prefix(record)
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (ISO 8601, UTC), level, logger, pid, process (the
    label), message, exc_info and stack_info when present, the task's fields (task_id,
    task_name, queue, attempt, and trace_id and span_id when traced) for a record made
    inside a handler, then any `extra=` fields.

    The fixed keys win over an `extra=` field of the same name, so a log shipper can
    rely on them. Values JSON cannot encode are written as their `str()`.
    """

    def __init__(self, process_label: str) -> None:
        super().__init__()
        self.process_label = process_label

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC)
        entry: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "process": self.process_label,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        for key, value in tasklog.fields(record).items():
            entry.setdefault(key, value)
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and key not in entry and not key.startswith(_OURS):
                entry[key] = value
        # ensure_ascii=False: a UTF-8 line is shorter and still one JSON value per line
        # (json escapes the newlines a message or traceback contains).
        return json.dumps(entry, ensure_ascii=False, default=str)


def _formatter(fmt: str, process_label: str) -> logging.Formatter:
    return JsonFormatter(process_label) if fmt == "json" else TextFormatter(process_label)


# -- handlers ---------------------------------------------------------------------------------


class _StderrHandler(logging.StreamHandler[IO[str]]):
    """Our stderr handler; the subclass only tells it apart from anyone else's."""

    def reopen(self) -> None:
        """Nothing to reopen on a stream we did not open."""


class _FileHandler(logging.StreamHandler[IO[str]]):
    """Appends to a path and can reopen it after logrotate renamed the file."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        super().__init__(_open_log_file(self.path))

    def reopen(self) -> None:
        """Open the path anew (creating the file) and switch to it. When that fails,
        keep the old stream: lines in a renamed file beat lines in no file."""
        try:
            fresh = _open_log_file(self.path)
        except LoggingSetupError as exc:
            log.error("cannot reopen the log file, still writing to the old one: %s", exc)
            return
        old = self.setStream(fresh)  # under the handler's lock, after a flush
        if old is not None:
            old.close()

    def close(self) -> None:
        self.acquire()
        try:
            stream, self.stream = self.stream, None  # type: ignore[assignment]
            if stream is not None:
                stream.close()
        finally:
            self.release()
            super().close()

    def emit(self, record: logging.LogRecord) -> None:
        if self.stream is None:
            return  # closed by a reconfigure racing this record: drop it rather than raise
        super().emit(record)


def _open_log_file(path: str) -> IO[str]:
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        # Not created for the operator: a typo would otherwise scatter logs in a
        # directory nobody rotates or watches.
        raise LoggingSetupError(
            f"logging.file {path}: directory {directory} does not exist; create it first"
        )
    try:
        # StreamHandler flushes after each record, so a record (under the 8 KiB
        # buffer) goes out in one write(); "a" is O_APPEND, which keeps the
        # processes sharing the file from overwriting each other.
        # backslashreplace: a record holding text that is not UTF-8 (a lone surrogate
        # in a handler's message) is written with it escaped, not dropped with an error.
        return open(path, "a", encoding="utf-8", errors="backslashreplace")
    except OSError as exc:
        raise LoggingSetupError(f"logging.file {path}: cannot open: {exc.strerror or exc}") from exc


def _our_handlers(logger: logging.Logger) -> list[logging.Handler]:
    return [h for h in logger.handlers if isinstance(h, _StderrHandler | _FileHandler)]


# -- the public calls -------------------------------------------------------------------------


def configure_logging(settings: LoggingConfig | Mapping[str, Any], *, process_label: str) -> None:
    """Point the root logger at stderr or `settings.file`, in the text or json format,
    at `settings.level`, with `settings.loggers` as per-logger levels.

    Raises `LoggingSetupError` (with nothing changed) when the file cannot be opened
    or a setting is invalid. Safe to call again: it replaces what it set before.
    """
    wanted = _normalize(settings)
    # Validate the levels before touching anything: a bad one raises ValueError.
    for level in (wanted.level, *wanted.loggers.values()):
        if not isinstance(logging.getLevelName(level), int):
            raise LoggingSetupError(f"unknown log level {level!r}")
    handler: logging.Handler = (
        _StderrHandler(sys.stderr) if wanted.file is None else _FileHandler(wanted.file)
    )
    handler.setFormatter(_formatter(wanted.format, process_label))
    root = logging.getLogger()
    with _lock:
        old = _our_handlers(root)
        root.addHandler(handler)  # add before removing, so no record finds no handler
        for previous in old:
            root.removeHandler(previous)
            previous.close()
        root.setLevel(wanted.level)
        loggers = {**_DRIVER_LEVELS, **wanted.loggers}
        for name in _configured_loggers - set(loggers):
            logging.getLogger(name).setLevel(logging.NOTSET)
        for name, level in loggers.items():
            logging.getLogger(name).setLevel(level)
        _configured_loggers.clear()
        _configured_loggers.update(loggers)


def reopen_logs() -> None:
    """Reopen `logging.file` (SIGUSR1 after logrotate renamed it); a no-op on stderr."""
    with _lock:
        handlers = _our_handlers(logging.getLogger())
        for handler in handlers:
            if isinstance(handler, _FileHandler):
                handler.reopen()
    if any(isinstance(h, _FileHandler) for h in handlers):
        # The first line of the new file: says who reopened, and proves it works.
        log.info("log file reopened")
