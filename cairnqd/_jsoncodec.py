"""JSON at the database boundary.

What is written must be readable by both SDKs, storable by both dialects (Postgres
jsonb's rules) and readable back (at most `MAX_JSON_DEPTH` levels, redone on a fresh
thread's stack when the caller's is too deep); what cannot be read is an `Undecodable`
marker, not an error (docs/architecture.md, "JSON at the database boundary").
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from cairnqd.errors import SerializationError

T = TypeVar("T")

#: How deep a JSON value may nest: what this runtime writes and always reads back.
MAX_JSON_DEPTH = 512

_encoder = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))
_decoder = json.JSONDecoder()


def _one_shot_encoder() -> Callable[[Any], str]:
    """`_encoder.encode`, minus the C encoder it builds on every call (about 1 us of a
    small payload's 1.4 us; `submit_many` encodes thousands). Built once here, without
    the circular-reference check, whose memo a failed call could leave dirty: a cycle
    ends in RecursionError instead, and `dump_json` asks `_encoder` what it was."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # an interpreter without the C accelerator
        return _encoder.encode
    encode_ascii = json.encoder.encode_basestring_ascii
    chunks = make(None, _encoder.default, encode_ascii, None, ":", ",", False, False, False)

    def encode(value: Any) -> str:
        if isinstance(value, str):  # the C encoder wants a container or a scalar
            return str(encode_ascii(value))
        return "".join(chunks(value, 0))

    return encode


_encode = _one_shot_encoder()

#: A str as a JSON string literal, ASCII-escaped as `dump_json` writes it (C, no checks:
#: for text already checked, such as a submit's name and ids).
json_string: Callable[[str], str] = json.encoder.encode_basestring_ascii

# One escape of ASCII-escaped JSON text: a backslash and what it escapes. Backslashes
# occur nowhere else in JSON, so scanning these left to right pairs them correctly.
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)")


def dump_json(value: Any, *, what: str = "value", check: bool = True) -> str:
    """Encode `value`; `what` names the argument in the error ("payload", "result").

    `check=False` skips the storage rules, for documents built from values already
    encoded and checked (the batch statements' arrays)."""
    try:
        text = _encode(value)
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"{what} is not JSON-serializable: {exc}") from exc
    except RecursionError:
        # A cycle, a value too deep for the caller's stack, or too deep at all: the
        # checking encoder, on a fresh stack, tells which.
        try:
            text = on_fresh_stack(_encoder.encode, value)
        except ValueError as exc:
            raise SerializationError(f"{what} is not JSON-serializable: {exc}") from None
        except RecursionError:
            raise SerializationError(
                f"{what} nests more than {MAX_JSON_DEPTH} levels deep; JSON values may nest "
                f"at most {MAX_JSON_DEPTH} levels"
            ) from None
    if check:
        check_storable(text, what=what)
        # Cheap for every payload: nesting N levels deep takes N opening brackets.
        if text.count("[") + text.count("{") > MAX_JSON_DEPTH:
            depth = json_depth(text)
            if depth > MAX_JSON_DEPTH:
                raise SerializationError(
                    f"{what} nests {depth} levels deep; JSON values may nest at most "
                    f"{MAX_JSON_DEPTH} levels"
                )
    return text


# A JSON string literal (escapes included), and what is not a bracket once they are gone.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\[\]|\{\}")
# Passes of `_INNERMOST` before counting the rest one character at a time.
_PASSES = 8


def json_depth(text: str) -> int:
    """How many levels valid JSON text nests (0 for a scalar).

    A value that is wide rather than deep (a long array of small objects) has many
    brackets and few levels: each pass of a regular expression removes every innermost
    pair, one level, so a few passes in C settle it. Only what is still left after
    them is counted in Python, once, in time linear in its length."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    passes = 0
    while brackets and passes < _PASSES:
        brackets = _INNERMOST.sub("", brackets)
        passes += 1
    depth = deepest = 0
    for char in brackets:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return passes + deepest


def on_fresh_stack(work: Callable[[Any], T], arg: Any) -> T:
    """`work(arg)` on a new thread, whose recursion depth starts near zero: for the
    rare value that recursed out of the caller's stack. Blocks until it is done."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, work(arg)))
        except BaseException as exc:  # handed to the caller below
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="cairnqd-json-deep", daemon=True)
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    result: T = value
    return result


def check_storable(text: str, *, what: str) -> None:
    """Refuse JSON text (as `dump_json` writes it) that Postgres jsonb cannot hold."""
    # Both escapes are rare, so one substring search each keeps the common case cheap.
    if "\\u0000" in text or "\\ud" in text or "\\uD" in text:
        _check_escapes(text, what)


def _check_escapes(text: str, what: str) -> None:
    high_ends_at = -1  # where an unpaired high surrogate escape ended
    for match in _ESCAPE.finditer(text):
        code = match.group(1)
        unit = int(code[1:], 16) if code[0] == "u" else -1
        if high_ends_at >= 0 and not (0xDC00 <= unit <= 0xDFFF and match.start() == high_ends_at):
            raise _lone_surrogate(what)
        if unit == 0:
            raise SerializationError(
                f"{what} contains a NUL character (\\u0000), which Postgres cannot store"
            )
        if 0xD800 <= unit <= 0xDBFF:
            high_ends_at = match.end()
        elif 0xDC00 <= unit <= 0xDFFF and high_ends_at < 0:
            raise _lone_surrogate(what)
        else:
            high_ends_at = -1
    if high_ends_at >= 0:
        raise _lone_surrogate(what)


def _lone_surrogate(what: str) -> SerializationError:
    return SerializationError(
        f"{what} contains a lone UTF-16 surrogate, which is not valid Unicode text "
        "(Postgres refuses it)"
    )


def dump_json_or_empty(value: Any, *, what: str) -> str:
    """payload/metadata: None is stored as `{}`, as both public SDKs do."""
    if value is None:
        return "{}"
    return dump_json(value, what=what)


def load_json(text: str | bytes | bytearray | memoryview) -> Any:
    """Decode JSON text or UTF-8 bytes (psycopg hands its loader bytes).

    `{}` (the stored form of an absent payload or metadata) skips the parser; a new
    dict each time, since the caller may mutate it. Raises ValueError (or
    RecursionError for a value too deep even for a fresh stack) when it cannot.
    """
    if not isinstance(text, str):
        text = bytes(text).decode()
    elif type(text) is not str:
        raise_undecodable_text(text)
    if text == "{}":
        return {}
    try:
        return _decoder.decode(text)
    except RecursionError:
        return on_fresh_stack(_decoder.decode, text)


# -- values another client stored that this runtime cannot decode ----------------------

#: How much of an undecodable value's text a marker shows.
PREVIEW_CHARS = 200


class Undecodable:
    """Where a read found a stored JSON value it cannot decode: the value's text (each
    byte that is not UTF-8 escaped as `\\xff`) and why. Reads show it in place of the
    value; a claim fails the task that holds one (store/base.py, `_quarantine`)."""

    __slots__ = ("raw", "reason")

    def __init__(self, raw: str, reason: str) -> None:
        self.raw = raw
        self.reason = reason

    @property
    def preview(self) -> str:
        """The text, cut to `PREVIEW_CHARS` with a note of how much was left out."""
        return preview(self.raw)

    def to_json(self) -> dict[str, str]:
        """How JSON output (`cairnqd inspect --json`, the dashboard) shows it."""
        return {"undecodable": self.reason, "raw": self.preview}

    def __str__(self) -> str:
        return f"<undecodable: {self.reason}> {self.preview}"

    def __repr__(self) -> str:
        return f"Undecodable({self.reason!r}, {self.preview!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Undecodable):
            return NotImplemented
        return (self.raw, self.reason) == (other.raw, other.reason)

    def __hash__(self) -> int:
        return hash((self.raw, self.reason))


class UndecodableText(str):
    """Text a column held that is not valid UTF-8, as a str with each bad byte escaped
    (`\\xff`, readable and printable); `raw` keeps the bytes. Only reads that met such
    text make these (see `tolerant_text`)."""

    raw: bytes

    def __new__(cls, raw: bytes) -> UndecodableText:
        self = super().__new__(cls, raw.decode("utf-8", "backslashreplace"))
        self.raw = raw
        return self

    def __reduce__(self) -> tuple[type[UndecodableText], tuple[bytes]]:
        return (UndecodableText, (self.raw,))

    @property
    def reason(self) -> str:
        try:
            self.raw.decode()
        except UnicodeDecodeError as exc:
            return f"not valid UTF-8 (byte 0x{self.raw[exc.start]:02x} at offset {exc.start})"
        return "not valid UTF-8"


def shown(value: Any) -> Any:
    """`json.dumps`'s `default` for output meant for people (`cairnqd inspect`, the
    dashboard): an `Undecodable` marker shows as `{"undecodable": why, "raw": text}`."""
    if isinstance(value, Undecodable):
        return value.to_json()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


#: What a JSON output shows in place of a number JSON cannot carry: another client stored
#: `1e999` (valid JSON, which SQLite's json_valid and Postgres jsonb accept) and Python
#: read it as infinite. Bare `Infinity` or `NaN` is not JSON (docs/protocol.md#no-nan).
_NONFINITE_MARKERS = {
    "Infinity": '{"undecodable": "a number too large for a 64-bit float", "raw": "Infinity"}',
    "-Infinity": '{"undecodable": "a number too large for a 64-bit float", "raw": "-Infinity"}',
    "NaN": '{"undecodable": "not a number", "raw": "NaN"}',
}
# A JSON string literal (escapes included), or a token `json.dumps` writes for a float
# JSON cannot carry; scanned left to right, a token inside a string is never taken.
_NONFINITE = re.compile(r'"(?:[^"\\]|\\.)*"|-?Infinity|NaN')


def _mark_nonfinite(match: re.Match[str]) -> str:
    token = match.group(0)
    return _NONFINITE_MARKERS.get(token, token)


def shown_json(value: Any, *, indent: int | None = 2, default: Callable[[Any], Any] = shown) -> str:
    """`value` as JSON text for output meant for people and scripts (`cairnqd list
    --json`, `inspect`): an `Undecodable` marker as its object (`shown`), and a float
    JSON cannot carry (infinite or NaN: a number such as `1e999` another client stored)
    as a marker object too, `{"undecodable": why, "raw": "Infinity"}`, so the text is
    always valid JSON. Not for what is stored: `dump_json` refuses such floats."""
    text = json.dumps(value, indent=indent, ensure_ascii=False, default=default)
    if "Infinity" in text or "NaN" in text:  # rare: only then a scan for the tokens
        text = _NONFINITE.sub(_mark_nonfinite, text)
    return text


def tolerant_text(data: bytes) -> str:
    """A `sqlite3` text factory that never fails: UTF-8 text as a str, anything else as
    `UndecodableText`. Slower than the default; only for reading again what failed."""
    global _marked
    try:
        return data.decode()
    except UnicodeDecodeError:
        _marked += 1
        return UndecodableText(data)


def raise_undecodable_text(text: str) -> None:
    raise ValueError(getattr(text, "reason", "not valid UTF-8"))


def preview(text: str) -> str:
    if len(text) <= PREVIEW_CHARS:
        return text
    return f"{text[:PREVIEW_CHARS]}\u2026 ({len(text) - PREVIEW_CHARS} more characters)"


def undecodable_reason(exc: BaseException) -> str:
    """Why a value could not be decoded, in a line."""
    if isinstance(exc, RecursionError):
        return f"nests deeper than this runtime reads (at most {MAX_JSON_DEPTH} levels)"
    if isinstance(exc, UnicodeDecodeError):
        return f"not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
    return " ".join(str(exc).split()) or type(exc).__name__


_marked = 0


def markers_made() -> int:
    """How many markers of values the drivers could not decode (`Undecodable` from
    `load_json_or_marker`, `UndecodableText` from `tolerant_text`) this process has
    made: a claim compares it before and after, and looks for markers only when it
    moved."""
    return _marked


def load_json_or_marker(data: str | bytes | bytearray | memoryview) -> Any:
    """`load_json` for psycopg's JSON loaders: a value it cannot decode becomes an
    `Undecodable` marker instead of an error, which would fail the whole fetch, every
    row of it. (`load_json`'s body, not a call of it: this runs once per value.)"""
    global _marked
    try:
        text = data if isinstance(data, str) else bytes(data).decode()
        if text == "{}":
            return {}
        try:
            return _decoder.decode(text)
        except RecursionError:
            return on_fresh_stack(_decoder.decode, text)
    except (ValueError, RecursionError) as exc:
        _marked += 1
        raw = data if isinstance(data, str) else bytes(data).decode("utf-8", "backslashreplace")
        return Undecodable(raw, undecodable_reason(exc))
