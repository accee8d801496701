"""Task ids: `task_` + a ULID that python-ulid parses back to the same text, with the
current millisecond as its timestamp and fresh random bits every time."""

from __future__ import annotations

import re
import time

from ulid import ULID

from cairnqd._ids import _timestamp_chars, new_task_id, new_ulid, new_worker_id

CROCKFORD_ULID = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")


def test_task_ids_are_ulids_of_now() -> None:
    before = time.time_ns() // 1_000_000
    ids = [new_task_id() for _ in range(2000)]
    after = time.time_ns() // 1_000_000
    for task_id in ids:
        assert task_id.startswith("task_")
        text = task_id.removeprefix("task_")
        assert CROCKFORD_ULID.fullmatch(text), text
        parsed = ULID.from_str(text)
        assert str(parsed) == text
        assert before <= parsed.milliseconds <= after
    assert len(set(ids)) == len(ids)


def test_random_bits_cover_the_alphabet_in_every_position() -> None:
    # 80 random bits: over many ids each of the 16 random characters takes many values.
    ids = [new_ulid() for _ in range(3000)]
    for position in range(10, 26):
        assert len({u[position] for u in ids}) == 32


def test_the_timestamp_round_trips_through_python_ulid() -> None:
    for ms in (0, 1, 1_700_000_000_123, 2**48 - 1):
        assert ULID.from_str(_timestamp_chars(ms) + "0" * 16).milliseconds == ms


def test_worker_ids() -> None:
    worker_id = new_worker_id()
    assert worker_id.startswith("worker_")
    ULID.from_str(worker_id.removeprefix("worker_"))
