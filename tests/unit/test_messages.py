"""The pipe messages: every kind round-trips, and anything else is a MessageError."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cairnqd.daemon.wire.messages import (
    PIPE_BUF,
    CancelStuck,
    DatabaseTrouble,
    Fatal,
    Goodbye,
    Heartbeat,
    LongestTask,
    MessageError,
    Overrun,
    Ready,
    ReopenLogs,
    SetCancelGrace,
    SetLogging,
    Tally,
    TallyCount,
    decode_child,
    decode_control,
    encode,
    encode_atomic,
)

HEARTBEAT = Heartbeat(rss=1, state="run", executing=0, held=0, lag_s=0.0, overdue=(), longest=None)
_HB = b'"executing":0,"held":0,"lag_s":0,"overdue":[],"longest":null'

CHILD_MESSAGES: list[Any] = [
    Ready(v=1, pid=42, worker_id="h:g.0:01", gen=3, rss=1 << 20),
    Heartbeat(
        rss=123,
        state="run",
        executing=2,
        held=5,
        lag_s=0.25,
        overdue=(Overrun("t1", 2, 31.5),),
        longest=LongestTask("t1", "n", 31.5),
        running=(LongestTask("t1", "n", 31.5), LongestTask("t2", "m", 0.5)),
    ),
    Tally(
        (TallyCount("q", "n", "started", "", 3), TallyCount("q", "n", "failed", "error", 1)),
        {"q": (1.0, 2.0, 0.0, 0.75)},
        {"q": (3.0, 0.0, 0.0, 0.1)},
    ),
    DatabaseTrouble("busy", "claim"),
    Goodbye("max_tasks"),
    Fatal("ImportError: no module named x"),
    CancelStuck(("t1 attempt 2", "t2 attempt 1")),
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
    assert json.loads(encode(HEARTBEAT))["t"] == "hb"


def test_control_messages_round_trip() -> None:
    settings = {"level": "DEBUG", "format": "json", "file": None, "loggers": {"x": "INFO"}}
    assert decode_control(encode(SetLogging(settings))) == SetLogging(settings)
    assert decode_control(encode(ReopenLogs())) == ReopenLogs()
    assert decode_control(encode(SetCancelGrace(0.5))) == SetCancelGrace(0.5)
    with pytest.raises(MessageError, match="unknown message kind 'hb'"):
        decode_control(encode(HEARTBEAT))


def test_unknown_fields_are_ignored_and_ints_read_as_floats() -> None:
    line = (
        b'{"t":"hb","rss":1,"state":"run","executing":0,"held":0,"lag_s":2,'
        b'"overdue":[],"longest":null,"new":true}'
    )
    message = decode_child(line)
    assert message == Heartbeat(1, "run", 0, 0, 2.0, (), None)
    assert isinstance(message, Heartbeat) and isinstance(message.lag_s, float)


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b'{"t":"hb","rss":"x","state":"run",' + _HB + b"}", "hb.rss: expected integer, got str"),
        (
            b'{"t":"hb","rss":true,"state":"run",' + _HB + b"}",
            "hb.rss: expected integer, got a bool",
        ),
        (
            b'{"t":"hb","rss":1e400,"state":"run",' + _HB + b"}",
            "hb.rss: expected integer, got float",
        ),
        (b'{"t":"hb","rss":' + b"9" * 30 + b',"state":"run",' + _HB + b"}", "out of range"),
        (b'{"t":"hb","state":"run",' + _HB + b"}", "hb message without 'rss'"),
        (b'{"t":"hb","rss":1,"state":"run","executing":0}', "hb message without 'held'"),
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
