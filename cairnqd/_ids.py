"""Identifier formats shared with the public SDKs: `task_<ULID>`, `worker_<ULID>`.

Encoded here rather than through python-ulid: one random byte per character through
`bytes.translate`, a list's random bytes in one `os.urandom` call, nothing buffered
across a fork (docs/architecture.md, "Task ids"; docs/protocol.md §4.3).
"""

from __future__ import annotations

import os
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Every byte value as the character of its low five bits: a random byte gives one
# uniformly random character (its top three bits are dropped), so 16 bytes give the
# 16 characters of a ULID's 80 random bits.
_CHAR_OF_BYTE = bytes(_CROCKFORD.encode()[b & 31] for b in range(256))
_RANDOM_CHARS = 16

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
    random_part = os.urandom(_RANDOM_CHARS).translate(_CHAR_OF_BYTE).decode("ascii")
    return _timestamp_chars(time.time_ns() // 1_000_000) + random_part


def new_task_ids(count: int) -> list[str]:
    """`count` task ids of the current millisecond, from one read of random bytes, in
    ascending order: a `submit_many` list's rows then land one after another at the
    right edge of every index that holds the id (the primary key, the claim indexes,
    the root index), where Postgres appends without searching the tree; drawn in random
    order they scattered across it, and the server spent 10-24% more CPU per row
    (bench/RESULTS.md, "Where a 1,000-item call's time goes"). The ids are as random as
    ever, only handed out sorted; nothing is monotonic from one call to the next."""
    prefix = "task_" + _timestamp_chars(time.time_ns() // 1_000_000)
    chars = os.urandom(_RANDOM_CHARS * count).translate(_CHAR_OF_BYTE).decode("ascii")
    randoms = [chars[at : at + _RANDOM_CHARS] for at in range(0, len(chars), _RANDOM_CHARS)]
    randoms.sort()
    return [prefix + random_part for random_part in randoms]


def new_task_id() -> str:
    return f"task_{new_ulid()}"


def task_id_floor(ms: int) -> str:
    """The smallest task id a submit at epoch millisecond `ms` can draw: ids compare as
    their ULIDs' times do, so `id >= task_id_floor(t)` reads the tasks submitted from
    `t` on through the primary key (a clock of a submitting host that runs behind moves
    its tasks back a little)."""
    chars = "".join(_CROCKFORD[(ms >> shift) & 31] for shift in range(45, -5, -5))
    return "task_" + chars + "0" * _RANDOM_CHARS


def new_worker_id(prefix: str = "worker") -> str:
    return f"{prefix}_{new_ulid()}"
