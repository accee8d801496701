"""The child's non-blocking outbox over a real pipe whose reader stops reading."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from cairnqd.daemon.child.outbox import Outbox


def _line(kind: str, **fields: object) -> bytes:
    return (json.dumps({"t": kind, **fields}) + "\n").encode()


def _read_all(fd: int) -> list[dict[str, object]]:
    os.set_blocking(fd, False)
    data = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return [json.loads(line) for line in data.splitlines()]


@pytest.mark.timing
def test_a_full_pipe_never_blocks_and_newest_state_wins() -> None:
    read_fd, write_fd = os.pipe()
    try:
        outbox = Outbox(write_fd)
        filler = _line("task", pad="x" * 3000)
        started = time.monotonic()
        for i in range(200):  # ~600 KiB: far more than the pipe holds
            outbox.send(filler.replace(b'"task"', b'"t%d"' % i))
            outbox.send(_line("hb", n=i), latest="hb")
        assert time.monotonic() - started < 2.0, "send() must never wait for the reader"
        assert outbox.pending > 0
        # Only the newest heartbeat is still queued, behind the messages kept in order.
        messages: list[dict[str, object]] = []
        while True:
            messages += _read_all(read_fd)
            if outbox.flush():
                messages += _read_all(read_fd)
                break
        beats = [m["n"] for m in messages if m["t"] == "hb"]
        assert beats[-1] == 199
        assert len(beats) < 200, "queued heartbeats were replaced by newer ones"
        kinds = [m["t"] for m in messages if m["t"] != "hb"]
        assert kinds == [f"t{i}" for i in range(200)], "other messages keep their order"
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_a_partly_written_message_is_finished_before_the_next() -> None:
    read_fd, write_fd = os.pipe()
    try:
        outbox = Outbox(write_fd)
        big = _line("big", pad="y" * 200_000)  # larger than the pipe: written in parts
        outbox.send(big, latest="state")
        outbox.send(_line("state", n=2), latest="state")  # must not replace the head
        got = b""
        os.set_blocking(read_fd, False)
        while True:
            outbox.flush()
            try:
                chunk = os.read(read_fd, 1 << 16)
            except BlockingIOError:
                if not outbox.pending:
                    break
                continue
            got += chunk
        lines = got.splitlines()
        assert json.loads(lines[0])["t"] == "big" and len(lines[0]) + 1 == len(big)
        assert json.loads(lines[1]) == {"t": "state", "n": 2}
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_two_threads_never_interleave_lines() -> None:
    read_fd, write_fd = os.pipe()
    outbox = Outbox(write_fd)
    received = bytearray()
    done = threading.Event()

    def reader() -> None:
        while True:
            try:
                received.extend(os.read(read_fd, 4096))
            except BlockingIOError:
                if done.is_set():
                    return  # everything was written before `done`, and all of it read
                time.sleep(0.001)

    os.set_blocking(read_fd, False)
    thread = threading.Thread(target=reader)
    thread.start()

    def writer(tag: str) -> None:
        for i in range(2000):
            outbox.send(_line(tag, i=i, pad="z" * (i % 700)))

    writers = [threading.Thread(target=writer, args=(t,)) for t in ("a", "b")]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    while not outbox.flush():
        time.sleep(0.001)
    done.set()
    thread.join(10)
    os.close(read_fd)
    os.close(write_fd)
    messages = [json.loads(line) for line in bytes(received).splitlines()]
    for tag in ("a", "b"):
        assert [m["i"] for m in messages if m["t"] == tag] == list(range(2000))


def test_a_closed_reader_breaks_the_outbox() -> None:
    read_fd, write_fd = os.pipe()
    outbox = Outbox(write_fd)
    os.close(read_fd)
    assert outbox.send(_line("hb")) is False
    assert outbox.broken
    os.close(write_fd)
