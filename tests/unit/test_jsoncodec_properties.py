"""cairnqd._jsoncodec, property-based: what we write is what we read, in both SDKs' terms.

Payloads, results, metadata and errors cross the database as JSON text. Any value JSON
can hold must come back equal and of the same type (an int must not come back a float,
a bool must not come back an int), the text must be ASCII and compact like the public
Python SDK's, and a value JSON cannot hold (NaN, infinity) must be refused by name.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cairnqd._jsoncodec import dump_json, dump_json_or_empty, load_json
from cairnqd.errors import SerializationError

# Text Postgres can store: no NUL, no lone surrogates (the codec refuses both).
storable_text = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)))
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    storable_text,
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(storable_text, inner)),
    max_leaves=25,
)
not_finite = st.sampled_from([math.nan, math.inf, -math.inf])


def same_json(a: Any, b: Any) -> bool:
    """Equal and of the same JSON type all the way down (`1 == 1.0 == True` is not enough)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    return bool(a == b)


@given(json_values)
def test_every_json_value_round_trips_with_its_types(value: Any) -> None:
    text = dump_json(value)
    assert same_json(load_json(text), value), text


@given(json_values)
def test_bytes_from_the_driver_read_like_text(value: Any) -> None:
    # psycopg hands the loader bytes; SQLite hands it str.
    text = dump_json(value)
    raw = text.encode()
    for form in (raw, bytearray(raw), memoryview(raw)):
        assert same_json(load_json(form), value)


@given(json_values)
def test_text_is_ascii_compact_and_stable(value: Any) -> None:
    text = dump_json(value)
    assert text.isascii()
    # Compact: the stdlib's own compact ASCII spelling, byte for byte.
    assert text == json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    assert dump_json(load_json(text)) == text


@given(json_values, not_finite, st.sampled_from(["list", "dict", "alone"]))
def test_non_finite_floats_are_refused_by_name(value: Any, bad: float, where: str) -> None:
    wrapped = {"list": [value, bad], "dict": {"ok": value, "bad": bad}, "alone": bad}[where]
    with pytest.raises(SerializationError, match=r"^result is not JSON-serializable"):
        dump_json(wrapped, what="result")


@given(json_values.filter(lambda value: value is not None))
def test_absent_payload_is_stored_as_an_empty_object(value: Any) -> None:
    # None means "no payload" (both public SDKs store `{}`); every other value is kept.
    assert load_json(dump_json_or_empty(None, what="payload")) == {}
    assert same_json(load_json(dump_json_or_empty(value, what="payload")), value)


@given(st.text(), st.text())
def test_text_with_a_nul_is_refused_anywhere(before: str, after: str) -> None:
    with pytest.raises(SerializationError, match="NUL"):
        dump_json({"k": [before + "\x00" + after]})


_STDLIB = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))


@given(json_values)
def test_the_prebuilt_encoder_writes_the_stdlib_bytes(value: Any) -> None:
    # dump_json builds its C encoder once; the text must stay the public SDK's.
    assert dump_json(value) == _STDLIB.encode(value)


def test_a_cycle_is_named_and_the_next_call_is_unharmed() -> None:
    # The prebuilt encoder has no cycle memo; a cycle must still be refused by name,
    # and an encode after it must not see a stale memo.
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(SerializationError, match="Circular reference"):
        dump_json(loop, what="payload")
    shared = [1]
    assert dump_json({"a": shared, "b": shared}) == '{"a":[1],"b":[1]}'
    with pytest.raises(SerializationError, match=r"payload is not JSON-serializable: .*set"):
        dump_json({"x": {1}}, what="payload")
    assert dump_json({"after": "error"}) == '{"after":"error"}'
