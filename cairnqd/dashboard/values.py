"""How the pages show a stored value, whatever another client stored in its column.

The database is shared with other clients (the public SDKs, hand-written SQL). SQLite is
loosely typed: a column declared integer can hold text (`'soon'`), a real or a blob, and
a JSON column can hold a number no 64-bit float holds (`1e999`, which Python reads as
infinite; Postgres jsonb keeps it too, and its bigint columns take times past the year
9999). The dashboard's reads keep such a value as it was stored (reads.py), so one row
never fails a list for everyone; these helpers show a good value as the pages always
did and any other as its text marked "(unreadable)", on the row of the task that holds it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, TypeGuard

from cairnqd._jsoncodec import Undecodable, on_fresh_stack, shown
from cairnqd.attempts import attempts_shown
from cairnqd.schedules import from_ms

#: What follows the text of a value the page cannot read as its column's type.
UNREADABLE = "(unreadable)"
#: How much of an unreadable value's text a page shows (a column may hold megabytes).
RAW_SHOWN = 80
#: The most of one JSON value a task's page shows.
SHOWN_MAX = 100_000
_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def is_int(value: object) -> TypeGuard[int]:
    """An integer as the column's readers expect one (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def raw_text(value: object) -> str:
    """A stored value as text: a blob's bytes escaped (`\\x01`), a long one cut short."""
    if isinstance(value, bytes | bytearray | memoryview):
        text = bytes(value).decode("utf-8", "backslashreplace")
        # Printable either way: control bytes as escapes, as for text that is not UTF-8.
        text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
    elif isinstance(value, float):
        text = repr(value)
    else:
        text = str(value)
    if len(text) <= RAW_SHOWN:
        return text
    return f"{text[:RAW_SHOWN]}… ({len(text):,} characters)"


def unreadable(value: object) -> str:
    """A value its column's readers cannot take, as what it is, marked."""
    return f"{raw_text(value)} {UNREADABLE}"


def time_text(ms: object) -> str:
    """Epoch milliseconds as a UTC time; `-` for none. A real is a time too (SQLite
    keeps 1.5 in an integer column as a real); text, or a time no date holds (before
    year 1 or after 9999), is shown as it is, marked."""
    if ms is None:
        return "-"
    if is_int(ms) or (isinstance(ms, float) and math.isfinite(ms)):
        try:
            return from_ms(int(ms)).strftime(_TIME_FORMAT)
        except OverflowError:
            pass
    return unreadable(ms)


def number_text(value: object) -> str:
    """An integer column's value (attempt, priority): the number, or its text marked."""
    return str(value) if is_int(value) else unreadable(value)


def attempts_text(attempt: object, max_attempts: object) -> str:
    """`2/3` as `attempts_shown` says it, or each value as it is when either is not
    an integer."""
    if is_int(attempt) and is_int(max_attempts):
        return attempts_shown(attempt, max_attempts)
    return f"{number_text(attempt)}/{number_text(max_attempts)}"


def pair_text(attempt: object, max_attempts: object) -> str:
    """`2/3` as the graph writes it (`4/3` past the budget), each value marked when it
    is not an integer."""
    return f"{number_text(attempt)}/{number_text(max_attempts)}"


def fraction(value: object) -> float | None:
    """A progress value as a float, or None when it is none (text, NaN, infinite)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


# A JSON string (escapes included), or a token Python writes for a float JSON cannot
# carry; scanned left to right, a token inside a string is never taken for one.
_NONFINITE = re.compile(r'"(?:[^"\\]|\\.)*"|-?Infinity|NaN')
_MARKERS = {
    "Infinity": '{"undecodable": "a number too large for a 64-bit float", "raw": "Infinity"}',
    "-Infinity": '{"undecodable": "a number too large for a 64-bit float", "raw": "-Infinity"}',
    "NaN": '{"undecodable": "not a number", "raw": "NaN"}',
}


def _mark_nonfinite(match: re.Match[str]) -> str:
    token = match.group(0)
    return _MARKERS.get(token, token)


def json_text(value: Any, *, indent: int | None = 2) -> str:
    """`value` as JSON text to show: a value that cannot be decoded as its marker's
    object (`shown`), and a number Python read as infinite or NaN (`1e999` stored by
    another client) as a marker object too, so what is shown is always valid JSON,
    never a bare `Infinity` (docs/protocol.md#no-nan)."""
    text = json.dumps(value, indent=indent, ensure_ascii=False, default=shown)
    if "Infinity" in text or "NaN" in text:  # rare: one scan for the tokens then
        text = _NONFINITE.sub(_mark_nonfinite, text)
    return text


def pretty(value: Any) -> str:
    """A JSON value of a task (payload, result, metadata), indented, cut at `SHOWN_MAX`."""
    try:
        text = json_text(value)
    except RecursionError:
        # Nested deeper than this thread's stack allows (another client wrote it; the
        # encoder recurses per level): the fresh stack the decoder used fits it too.
        text = on_fresh_stack(json_text, value)
    if len(text) > SHOWN_MAX:
        return f"{text[:SHOWN_MAX]}\n… ({len(text):,} characters; the rest is not shown)"
    return text


def field_text(value: object) -> str:
    """A field of an error envelope (type, code, message, retryable): text, a bool or
    an integer as Python writes it, null as nothing, a value that cannot be decoded as
    its marker's text (as the page always showed them); any other JSON value (a
    number read as infinite, an object) as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str | bool | int | Undecodable):
        return str(value)
    return json_text(value, indent=None)


__all__ = [
    "RAW_SHOWN",
    "SHOWN_MAX",
    "UNREADABLE",
    "attempts_text",
    "field_text",
    "fraction",
    "is_int",
    "json_text",
    "number_text",
    "pair_text",
    "pretty",
    "raw_text",
    "time_text",
    "unreadable",
]
