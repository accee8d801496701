"""How a stored value is shown to people, whatever another client stored in its column.

The database is shared with other clients (the public SDKs, hand-written SQL). SQLite is
loosely typed: a column declared integer can hold text (`'soon'`), a real or a blob, and
a JSON column can hold a number no 64-bit float holds (`1e999`). The readers keep such a
value as it was stored (`Task.from_row`, `TaskSummary.from_row`), so one row never fails
a command or a page for everyone. The command line (cairnqd/cli/listing.py) and the
dashboard (cairnqd/dashboard/values.py) show a good value as always and any other as its
text marked "(unreadable)", with these helpers; JSON output goes through
`_jsoncodec.shown_json`, which marks a number JSON cannot carry.
"""

from __future__ import annotations

import math
from typing import TypeGuard

from cairnqd.attempts import attempts_shown

#: What follows a value shown as it was stored, its column's readers unable to take it.
UNREADABLE = "(unreadable)"
#: How much of an unreadable value's text is shown (a column may hold megabytes).
RAW_SHOWN = 80


def is_int(value: object) -> TypeGuard[int]:
    """An integer as its column's readers expect one (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def raw_text(value: object) -> str:
    """A stored value as printable text: a blob's bytes and control characters escaped
    (`\\x01`), a real as Python writes it, a long value cut short."""
    if isinstance(value, bytes | bytearray | memoryview):
        text = bytes(value).decode("utf-8", "backslashreplace")
    elif isinstance(value, float):
        text = repr(value)
    else:
        text = str(value)
    text = printable(text)
    if len(text) <= RAW_SHOWN:
        return text
    return f"{text[:RAW_SHOWN]}\u2026 ({len(text):,} characters)"


def printable(text: str, *, keep: str = "") -> str:
    """`text` as a terminal may be sent it: each character that is not printable (an
    escape sequence's ESC, a tab, a carriage return, a newline) escaped as `\\x1b`,
    except those in `keep`. Another client may store any text in a name, queue or
    message, and printed as it was, `\\x1b[2J` cleared the operator's screen and a
    newline broke a table's row in two."""
    if text.isprintable():  # nearly always: one scan in C
        return text
    return "".join(c if c.isprintable() or c in keep else ascii(c)[1:-1] for c in text)


def unreadable(value: object) -> str:
    """A value its column's readers cannot take, shown as what it is, marked."""
    return f"{raw_text(value)} {UNREADABLE}"


def number_text(value: object) -> str:
    """An integer column's value (attempt, priority): the number, or its text marked."""
    return str(value) if is_int(value) else unreadable(value)


def attempts_text(attempt: object, max_attempts: object) -> str:
    """`2/3` as `attempts_shown` says it, or each value as it is, marked, when either
    is not an integer."""
    if is_int(attempt) and is_int(max_attempts):
        return attempts_shown(attempt, max_attempts)
    return f"{number_text(attempt)}/{number_text(max_attempts)}"


def fraction(value: object) -> float | None:
    """A progress value as a float; None when it is none, or not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


__all__ = [
    "RAW_SHOWN",
    "UNREADABLE",
    "attempts_text",
    "fraction",
    "is_int",
    "number_text",
    "printable",
    "raw_text",
    "unreadable",
]
