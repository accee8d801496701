"""JSON at the database boundary.

Both SDKs must be able to read what we write, so values are held to what JSON can
represent without loss: NaN/Infinity are refused (Python would write bare `NaN`, which
JavaScript cannot parse), and so are bytes, sets, datetimes and other objects the
stdlib would reject. Tuples become arrays and non-string keys become strings, as the
stdlib does. Text is compact and ASCII-escaped, the bytes the public Python SDK writes.

Both dialects must also be able to store it, so the rules are Postgres jsonb's, checked
here for SQLite too: no NUL character (`\u0000`) and no lone UTF-16 surrogate in any
string, keys included, and no nesting deeper than Python can encode (~1,000 levels).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from cairnqd.errors import SerializationError

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
        # A cycle or very deep nesting: the checking encoder tells which.
        try:
            _encoder.encode(value)
        except ValueError as exc:
            raise SerializationError(f"{what} is not JSON-serializable: {exc}") from None
        except RecursionError:
            pass
        raise SerializationError(f"{what} nests too deeply to encode as JSON") from None
    if check:
        check_storable(text, what=what)
    return text


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
    dict each time, since the caller may mutate it.
    """
    if not isinstance(text, str):
        text = bytes(text).decode()
    if text == "{}":
        return {}
    return _decoder.decode(text)
