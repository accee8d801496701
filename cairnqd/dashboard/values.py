"""How the pages show a stored value, whatever another client stored in its column: the
shared rules (`cairnqd.storedvalues`: a value its column's readers cannot take, as its text
marked "(unreadable)") and what only the pages need (their time format, JSON blocks cut
at `SHOWN_MAX`, an error envelope's fields). Postgres can hold such values too: jsonb
keeps `1e999`, and its bigint columns take times past the year 9999.
"""

from __future__ import annotations

import math
from typing import Any

from cairnqd._jsoncodec import Undecodable, on_fresh_stack, shown_json
from cairnqd.schedules import from_ms
from cairnqd.storedvalues import (
    RAW_SHOWN,
    UNREADABLE,
    attempts_text,
    fraction,
    is_int,
    number_text,
    raw_text,
    unreadable,
)

#: The most of one JSON value a task's page shows.
SHOWN_MAX = 100_000
_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


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


def pair_text(attempt: object, max_attempts: object) -> str:
    """`2/3` as the graph writes it (`4/3` past the budget), each value marked when it
    is not an integer."""
    return f"{number_text(attempt)}/{number_text(max_attempts)}"


def json_text(value: Any, *, indent: int | None = 2) -> str:
    """`value` as JSON text to show, always valid JSON (`shown_json`: a value that
    cannot be decoded, or a number such as `1e999` that Python reads as infinite, as a
    marker object; docs/protocol.md#no-nan)."""
    return shown_json(value, indent=indent)


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
