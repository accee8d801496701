"""argparse `type=` functions for the command line's values, each bounded as the store
bounds what it is given.

A value the store would refuse is refused here, while the arguments are parsed: argparse
then names the option ("argument --queue: not valid UTF-8: 'x\\xff'") and exits 64, where
the store's own check would fail inside the command with the argument's internal name,
as an internal error (docs/architecture.md, "The command line"). It raises argparse's
own error, not CliError, and imports nothing else of `cairnqd.cli`, so every command
module (`cli.admin` included) may use it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import timedelta

from cairnqd.config import format_duration, parse_duration
from cairnqd.store.arguments import MAX_DURATION_MS

__all__ = ["MAX_DURATION", "bounded_duration", "bounded_text", "duration", "integer", "text"]

#: The longest duration the store takes (100 years): a longer `--delay` or `--older-than`
#: fails every submit or purge.
MAX_DURATION = timedelta(milliseconds=MAX_DURATION_MS)
# How much of a bad value an error message quotes.
_SHOWN_CHARS = 60


def _quoted(value: str) -> str:
    """`value` quoted for an error message, cut short, each byte that was not UTF-8 as
    `\\xff`: what the operator typed, never a lone surrogate (which stderr prints as
    `\\udcff`, or not at all)."""
    inner = "".join(
        # surrogateescape turned byte 0xXY into U+DCXY.
        f"\\x{ord(char) - 0xDC00:02x}" if "\udc80" <= char <= "\udcff" else repr(char)[1:-1]
        for char in value[:_SHOWN_CHARS]
    )
    return f"'{inner}...'" if len(value) > _SHOWN_CHARS else f"'{inner}'"


def text(value: str) -> str:
    """Any non-empty UTF-8 text. Python hands over argument bytes that are not UTF-8
    as lone surrogates ("surrogateescape"), which neither database can store or
    compare: a filter holding one failed the query instead of matching nothing."""
    if not value:
        raise argparse.ArgumentTypeError("must not be empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"not valid UTF-8: {_quoted(value)}") from None
    return value


def integer(minimum: int, maximum: int) -> Callable[[str], int]:
    """An integer from `minimum` to `maximum`, both included: the range of the column
    (or setting) it ends up in."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:  # also a number of more digits than int() will read
            raise argparse.ArgumentTypeError(f"not an integer: {_quoted(value)}") from None
        if not minimum <= number <= maximum:
            raise argparse.ArgumentTypeError(f"must be {minimum} to {maximum}, got {number}")
        return number

    return parse


def duration(value: str) -> timedelta:
    """The config's duration syntax, so `--delay 30s` reads like YAML."""
    try:
        return parse_duration(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a duration: {_quoted(value)} (e.g. 30s, 5m, 7d)"
        ) from None


def bounded_duration(maximum: timedelta = MAX_DURATION) -> Callable[[str], timedelta]:
    """A duration of at most `maximum`: by default the longest the store takes."""

    def parse(value: str) -> timedelta:
        parsed = duration(value)
        if parsed > maximum:
            raise argparse.ArgumentTypeError(
                f"must be at most {format_duration(maximum)}, got {format_duration(parsed)}"
            )
        return parsed

    return parse


def bounded_text(max_bytes: int) -> Callable[[str], str]:
    """`text` of at most `max_bytes` in UTF-8: what the store indexes (a task's name,
    queue and key)."""

    def parse(value: str) -> str:
        size = len(text(value).encode("utf-8"))
        if size > max_bytes:
            raise argparse.ArgumentTypeError(
                f"{size} bytes in UTF-8, at most {max_bytes}: {_quoted(value)}"
            )
        return value

    return parse
