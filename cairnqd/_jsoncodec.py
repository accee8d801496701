"""JSON at the database boundary.

Both SDKs must be able to read what we write, so values are held to what JSON can
represent without loss: NaN/Infinity are refused (Python would write bare `NaN`, which
JavaScript cannot parse), and so are bytes, sets, datetimes and other objects the
stdlib would reject. Tuples become arrays and non-string keys become strings, as the
stdlib does. Text is compact and ASCII-escaped, the bytes the public Python SDK writes.
"""

from __future__ import annotations

import json
from typing import Any

from cairnqd.errors import SerializationError

_encoder = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))
_decoder = json.JSONDecoder()


def dump_json(value: Any, *, what: str = "value") -> str:
    """Encode `value`; `what` names the argument in the error ("payload", "result")."""
    try:
        return _encoder.encode(value)
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"{what} is not JSON-serializable: {exc}") from exc


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
