"""`cairnqd inspect`'s text: the error envelope with its traceback as text, which attempt
left the error on the task's row, and the attempts as a table with each one's error
below it (docs/operations.md, "Reading attempt history")."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cairnqd import attempts
from cairnqd._jsoncodec import shown_json
from cairnqd.attempts import AttemptRecord, duration_shown, error_traceback
from cairnqd.models import Task
from cairnqd.storedvalues import printable

_ENVELOPE_KEYS = ("type", "code", "message", "retryable")
_INDENT = "    "


def error_attempt(task: Task, records: Sequence[AttemptRecord]) -> int | None:
    """The attempt whose error the task's row holds, or None."""
    return attempts.error_attempt(task.error, records)


def error_heading(task: Task, records: Sequence[AttemptRecord]) -> str:
    """`error:`, labelled when the row's error is not this task's outcome: a task that
    succeeded (or runs again) keeps the envelope of an earlier attempt."""
    label = attempts.error_label(task.status, error_attempt(task, records))
    return "error:" if label is None else f"error: {label}"


def envelope_lines(
    error: Mapping[str, Any] | Any, indent: str = "  ", *, traceback: bool = True
) -> list[str]:
    """An envelope field by field; its traceback (unless `traceback` is False) as lines
    of text, not a JSON string."""
    if not isinstance(error, Mapping):
        return [f"{indent}{_text(error)}"]
    lines = [f"{indent}{k}: {_text(error[k])}" for k in _ENVELOPE_KEYS if k in error]
    details = error.get("details")
    rest = (
        {k: v for k, v in details.items() if k != "traceback"}
        if isinstance(details, Mapping)
        else details
    )
    others = {k: v for k, v in error.items() if k not in (*_ENVELOPE_KEYS, "details")}
    if rest:
        lines.append(f"{indent}details: {_text(rest)}")
    for key, value in others.items():
        lines.append(f"{indent}{key}: {_text(value)}")
    trace = error_traceback(error)
    if trace is not None and not traceback:
        lines.append(f"{indent}traceback: under its attempt below")
    elif trace is not None:
        lines.append(f"{indent}traceback:")
        lines += [f"{indent}{_INDENT}{line}" for line in trace.rstrip("\n").splitlines()]
    return lines


def attempt_lines(
    records: Sequence[AttemptRecord],
    now_ms: int,
    when: Callable[[int | None], str],
    table: Callable[[Sequence[str], Sequence[Sequence[Any]]], str],
) -> list[str]:
    """The attempts as a table, oldest first, then the error of each that has one."""
    if not records:
        return [
            "attempts: none recorded (not run yet, or it ran before attempt history "
            "was kept: migration cairnqd_0010_attempts.sql)"
        ]
    rows = [
        [r.attempt, r.outcome_shown, r.worker_id or "-", r.host or "unknown",
         when(r.started_at_ms), duration_shown(r.duration_ms(now_ms)),
         _one_line(r.error) if r.error else "-"]
        for r in records
    ]  # fmt: skip
    headers = ["#", "outcome", "worker", "host", "started", "took", "error"]
    lines = ["attempts:"] + ["  " + line for line in table(headers, rows).splitlines()]
    for r in records:
        if r.error:
            lines.append(f"attempt {r.attempt} error:")
            lines += envelope_lines(r.error)
    return lines


def _one_line(error: Mapping[str, Any]) -> str:
    text = " ".join(str(error.get("message", "")).split())
    kind = str(error.get("type") or error.get("code") or "")
    text = f"{kind}: {text}" if kind else text
    return text if len(text) <= 60 else text[:59] + "\u2026"


def _text(value: Any) -> str:
    if isinstance(value, str):
        # Lines stay lines (a message may span several); an escape sequence another
        # client stored is shown, not sent to the terminal.
        return printable(value, keep="\n\t")
    # Compact JSON; a number no float holds (another client's `1e999`) as a marker, not
    # a bare Infinity.
    return shown_json(value, indent=None)


__all__ = ["attempt_lines", "envelope_lines", "error_attempt", "error_heading"]
