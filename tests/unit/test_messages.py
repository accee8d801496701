"""The pipe messages: every kind round-trips, and anything else is a MessageError."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cairnqd.daemon.messages import (
    PIPE_BUF,
    DatabaseTrouble,
    Fatal,
    Goodbye,
    Heartbeat,
    MessageError,
    Ready,
    ReopenLogs,
    SetLogging,
    TaskEnded,
    TaskRan,
    TaskStarted,
    decode_child,
    decode_control,
    encode,
    encode_atomic,
)

CHILD_MESSAGES: list[Any] = [
    Ready(v=1, pid=42, worker_id="h:g.0:01", gen=3, rss=1 << 20),
    Heartbeat(busy=2, rss=123, state="run"),
    TaskStarted("t1", "q", "n", 1, 0.25),
    TaskEnded("t1", "q", "n", "succeeded", "", 1.5),
    TaskRan("t2", "q", "n", 2, 0.0, "retried", "boom", 0.01),
    DatabaseTrouble("busy", "claim"),
    Goodbye("max_tasks"),
    Fatal("ImportError: no module named x"),
]


@pytest.mark.parametrize("message", CHILD_MESSAGES, ids=lambda m: m.kind)
def test_child_messages_round_trip(message: Any) -> None:
    line = encode_atomic(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_child(line.rstrip(b"\n")) == message


def test_wire_names_are_the_protocol_s() -> None:
    # `kind` is the Python class tag; on the wire dberr's field keeps its name.
    assert json.loads(encode(DatabaseTrouble("timeout"))) == {
        "t": "dberr",
        "kind": "timeout",
        "phase": "",
    }
    assert json.loads(encode(Heartbeat(busy=0, rss=1, state="run")))["t"] == "hb"


def test_control_messages_round_trip() -> None:
    settings = {"level": "DEBUG", "format": "json", "file": None, "loggers": {"x": "INFO"}}
    assert decode_control(encode(SetLogging(settings))) == SetLogging(settings)
    assert decode_control(encode(ReopenLogs())) == ReopenLogs()
    with pytest.raises(MessageError, match="unknown message kind 'hb'"):
        decode_control(encode(Heartbeat(busy=0, rss=1, state="run")))


def test_unknown_fields_are_ignored_and_ints_read_as_floats() -> None:
    line = b'{"t":"start","id":"a","queue":"q","name":"n","attempt":1,"wait_s":2,"new":true}'
    message = decode_child(line)
    assert message == TaskStarted("a", "q", "n", 1, 2.0)
    assert isinstance(message, TaskStarted) and isinstance(message.wait_s, float)


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b'{"t":"hb","busy":0,"rss":"x","state":"run"}', "hb.rss: expected integer, got str"),
        (b'{"t":"hb","busy":0,"rss":true,"state":"run"}', "hb.rss: expected integer, got a bool"),
        (b'{"t":"hb","busy":0,"rss":1e400,"state":"run"}', "hb.rss: expected integer, got float"),
        (b'{"t":"hb","busy":0,"rss":' + b"9" * 30 + b',"state":"run"}', "out of range"),
        (b'{"t":"hb","busy":0,"state":"run"}', "hb message without 'rss'"),
        (b'{"t":"bye","reason":null}', "bye.reason: expected string, got NoneType"),
        (b'{"t":"nope"}', "unknown message kind 'nope'"),
        (b'{"kind":"hb"}', "unknown message kind None"),
        (b"[1, 2]", "not a JSON object but list"),
        (b"\xff\xfe", "not JSON"),
        (b"{", "not JSON"),
    ],
)
def test_anything_else_is_a_message_error(line: bytes, error: str) -> None:
    with pytest.raises(MessageError, match=error.replace("(", r"\(")):
        decode_child(line)


def test_a_long_message_is_shortened_to_one_atomic_write() -> None:
    long = Fatal("ImportError: " + "é" * 5000)
    line = encode_atomic(long)
    assert len(line) <= PIPE_BUF
    message = decode_child(line)
    assert isinstance(message, Fatal)
    assert message.error.startswith("ImportError: é") and message.error.endswith("\u2026")
