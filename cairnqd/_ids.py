"""Identifier formats shared with the public SDKs: `task_<ULID>`, `worker_<ULID>`.

A ULID is a 48-bit millisecond timestamp then 80 random bits (from `os.urandom`, not
monotonic within a millisecond, as docs/protocol.md §4.3 says), in Crockford base32. Task ids are
made on every submit (thousands per `submit_many`), so they are encoded here, about
3x cheaper than through `ulid.ULID`: the random part is read ten bits (two
characters) at a time from a lookup table, and the timestamp's ten characters are
reused within a millisecond. Tests check the result against python-ulid's parser.
"""

from __future__ import annotations

import os
import time

from ulid import ULID

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Every 10-bit value as its two base32 characters.
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]

# (ms, its characters), replaced as one object so threads never pair one millisecond
# with another's characters.
_last: tuple[int, str] = (-1, "")


def _timestamp_chars(ms: int) -> str:
    """48 bits as 10 characters (50 bits: the first character holds the top 3)."""
    global _last
    last_ms, chars = _last
    if ms != last_ms:
        chars = "".join(_CROCKFORD[(ms >> shift) & 31] for shift in range(45, -5, -5))
        _last = (ms, chars)
    return chars


def new_ulid() -> str:
    n = int.from_bytes(os.urandom(10), "big")
    p = _PAIRS
    return (
        _timestamp_chars(time.time_ns() // 1_000_000)
        + p[n >> 70]
        + p[(n >> 60) & 1023]
        + p[(n >> 50) & 1023]
        + p[(n >> 40) & 1023]
        + p[(n >> 30) & 1023]
        + p[(n >> 20) & 1023]
        + p[(n >> 10) & 1023]
        + p[n & 1023]
    )


def new_task_id() -> str:
    return f"task_{new_ulid()}"


def new_worker_id(prefix: str = "worker") -> str:
    return f"{prefix}_{ULID()}"
