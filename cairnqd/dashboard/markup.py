"""Server-side HTML with every value escaped unless it is already markup.

Design note. Payloads, results, errors, task names, queue names and pause reasons are
user data, and the dashboard shows all of them. Nothing is ever pasted into a page as
text: `render(template, **values)` escapes each value with `html.escape` (quotes
included, so a value inside an attribute cannot end it) unless the value is `Markup`,
which only this module's functions make. Forgetting to escape therefore needs an
explicit `Markup(...)`, which is the one thing to look for in review.
"""

from __future__ import annotations

import html
import string
from collections.abc import Iterable
from typing import Any


class Markup(str):
    """Text that is already HTML: inserted as it is."""

    __slots__ = ()


def esc(value: Any) -> Markup:
    """`value` as HTML text: markup stays, anything else is escaped (None is empty)."""
    if isinstance(value, Markup):
        return value
    if value is None:
        return Markup("")
    return Markup(html.escape(str(value), quote=True))


class _Escaping(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        if isinstance(value, Markup) and not format_spec:
            return value
        return esc(format(value, format_spec))

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion is None:
            return value
        # !r / !s / !a make plain text of a value, markup included: escaped after.
        return str(super().convert_field(value, conversion))


_FORMATTER = _Escaping()


def render(template: str, /, **values: Any) -> Markup:
    """`template` (trusted HTML with `{name}` fields) with each value escaped."""
    return Markup(_FORMATTER.vformat(template, (), values))


def join(parts: Iterable[Any], sep: str = "") -> Markup:
    """Values joined, each escaped unless it is markup; `sep` is trusted HTML."""
    return Markup(sep.join(esc(p) for p in parts))


__all__ = ["Markup", "esc", "join", "render"]
