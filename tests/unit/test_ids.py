"""Task ids: `task_` + a ULID that python-ulid parses back to the same text, with the
current millisecond as its timestamp and fresh random bits every time."""

from __future__ import annotations

import re
import time

from ulid import ULID

from cairnqd._ids import _timestamp_chars, new_task_id, new_task_ids, new_ulid, new_worker_id

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


def test_a_batch_of_ids_shares_the_millisecond_and_nothing_else() -> None:
    before = time.time_ns() // 1_000_000
    ids = new_task_ids(5000)
    after = time.time_ns() // 1_000_000
    assert len(ids) == 5000 and len(set(ids)) == 5000
    assert ids == sorted(ids)  # handed out in order: a batch appends to the id indexes
    stamps = {ULID.from_str(task_id.removeprefix("task_")).milliseconds for task_id in ids}
    assert len(stamps) == 1 and before <= stamps.pop() <= after
    for task_id in ids:
        assert CROCKFORD_ULID.fullmatch(task_id.removeprefix("task_")), task_id
    assert new_task_ids(0) == []


def test_every_random_character_is_uniform() -> None:
    # 80,000 characters over 32 values: each value's count is ~2,500 (sd ~49). A table
    # that favoured some characters (a modulo other than 32, say) lands far outside.
    counts: dict[str, int] = {}
    for task_id in new_task_ids(5000):
        for char in task_id[-16:]:
            counts[char] = counts.get(char, 0) + 1
    assert len(counts) == 32
    assert all(2000 < n < 3000 for n in counts.values()), counts


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
