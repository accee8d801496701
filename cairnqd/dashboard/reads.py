"""Where the dashboard's task list goes on from, after a row another client wrote.

The store's readers keep each value as it was stored (`TaskSummary.from_row`): on SQLite
a column declared integer can hold a real (1.5) or text, which the pages show as it is,
marked (values.py). A page's cursor holds integers, so it needs a rule for such a row.
"""

from __future__ import annotations

from cairnqd.store.arguments import INT8_MAX


def next_cursor(value: object, task_id: str) -> tuple[int, str] | None:
    """Where the next page of the list goes on from, after a row whose sort column
    holds `value`: (value, id). SQLite keeps a real (1.5) in a column declared integer,
    which the list's bounds compare as a number; a cursor holds integers, so after such
    a row the next page starts at every row of the integer below it (the id "", which
    the cursor reads as above every id). It may pass over another real between the two,
    never an integer's row, and never shows a row twice or goes round in a loop. Text
    or a blob compares above every number there and is never listed; None for such a
    value all the same."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value, task_id
    if isinstance(value, float) and abs(value) < float(INT8_MAX):  # NaN is not
        if value.is_integer():
            return int(value), task_id
        return int(value // 1), ""
    return None


__all__ = ["next_cursor"]
