"""Which held tasks a child has started, in memory the parent can read after it dies.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections.abc import Sequence

_MAGIC = b"CQST"
_VERSION = 1
_HEADER = 64
_SLOT = 96
_ID_MAX = _SLOT - 8
#: Slots per child: enough for `concurrency` + a full prefetch backlog + results waiting
#: to be written, for any sane config; past it the extra tasks count as started.
CAPACITY = 4096

#: A slot's state byte. The child writes STARTED and RETURNED straight into `marks`.
FREE, HELD, STARTED, RETURNED = 0, 1, 2, 3
_OVERFLOW_AT = 5
#: What `StartTable.held` returns for a task it could not record: a spare header byte
#: that no reader looks at, so a state written there needs no test on the hot path.
NO_SLOT = 6
_ATTEMPT = struct.Struct("<I")
#: A slot after its state byte: id length, attempt, two spare bytes, the id. One
#: layout per id length (ids are mostly of one length), so packing writes only the
#: id's bytes (the reader takes `length` of them): a padded form cleared 88 bytes per
#: task for nothing.
_BODIES = [struct.Struct(f"<BI2x{n}s") for n in range(_ID_MAX + 1)]


class StartTable:
    """One child's table of held tasks. The parent `create`s it before spawning and
    `unstarted()` reads it after the child is gone; the child `attach`es to the fd.

    The child's side works by slot: `held` returns the slot it wrote (or NO_SLOT), and
    the holder keeps it with the task (the worker's context), so marking a start is one
    byte written into `marks`, with no lookup or call on the way to the handler."""

    def __init__(self, fd: int, memory: mmap.mmap, capacity: int) -> None:
        self.fd = fd
        self._memory = memory
        self._capacity = capacity
        #: Child side, for the hot path: a slot's state byte is `marks[slot]`; marking
        #: a start is `marks[slot] = STARTED` (NO_SLOT included: its byte is spare).
        self.marks = memory
        # Child side only: the slots free for reuse (offsets into the memory).
        self._free = [_HEADER + i * _SLOT for i in range(capacity - 1, -1, -1)]
        #: Child side: give a released slot back for reuse (never NO_SLOT).
        self.reuse = self._free.append

    @classmethod
    def create(cls, capacity: int = CAPACITY) -> StartTable:
        fd = os.memfd_create("cairnqd-starts", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, _HEADER + capacity * _SLOT)
            memory = mmap.mmap(fd, _HEADER + capacity * _SLOT)
        except BaseException:
            os.close(fd)
            raise
        memory[0:4] = _MAGIC
        memory[4] = _VERSION
        return cls(fd, memory, capacity)

    @classmethod
    def private(cls, capacity: int = CAPACITY) -> StartTable:
        """A table in this process's memory only, for a child given none: the same
        code path, read by nobody."""
        memory = mmap.mmap(-1, _HEADER + capacity * _SLOT)
        memory[0:4] = _MAGIC
        memory[4] = _VERSION
        return cls(-1, memory, capacity)

    @classmethod
    def attach(cls, fd: int) -> StartTable:
        size = os.fstat(fd).st_size
        memory = mmap.mmap(fd, size)
        if memory[0:4] != _MAGIC or memory[4] != _VERSION:
            memory.close()
            raise ValueError("not a cairnqd start table (or another version)")
        return cls(fd, memory, (size - _HEADER) // _SLOT)

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self._memory.close()
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)

    # -- the child's side ------------------------------------------------------------

    def held(self, task_id: str, attempt: int) -> int:
        """Record a task claimed into this child (not started yet); its slot, for the
        calls below, or NO_SLOT when it is in none (it then counts as started)."""
        return self.held_many(((task_id, attempt),))[0]

    def held_many(self, identities: Sequence[tuple[str, int]]) -> list[int]:
        """`held` for a claim's tasks at once, (task id, attempt) each: their slots."""
        memory, free, bodies = self._memory, self._free, _BODIES
        slots = []
        for task_id, attempt in identities:
            raw = task_id.encode()
            length = len(raw)
            if length > _ID_MAX or not free:
                memory[_OVERFLOW_AT] = 1  # said once; the task counts as started
                slots.append(NO_SLOT)
                continue
            at = free.pop()
            bodies[length].pack_into(memory, at + 1, length, attempt, raw)
            memory[at] = HELD  # last: the slot counts only once it is whole
            slots.append(at)
        return slots

    def started(self, slot: int) -> None:
        """Mark a held task started; call right before its handler is called."""
        self._memory[slot] = STARTED

    def returned(self, slot: int) -> None:
        """Mark a started task whose handler returned: its result is queued, not yet
        written. Call right after the handler returns."""
        self._memory[slot] = RETURNED

    def released(self, slot: int) -> None:
        """The child let go of the task (settled, or its lease lost). Once per slot."""
        if slot != NO_SLOT:
            self._memory[slot] = FREE
            self._free.append(slot)

    # -- the parent's side -----------------------------------------------------------

    @property
    def overflowed(self) -> bool:
        return bool(self._memory[_OVERFLOW_AT])

    def unstarted(self) -> list[tuple[str, int]]:
        """(task id, attempt) of every task the child held and never started."""
        return self._in_state(HELD)

    def started_unfinished(self) -> list[tuple[str, int]]:
        """(task id, attempt) of every task whose handler was running when the child
        died (its result not returned yet)."""
        return self._in_state(STARTED)

    def returned_unwritten(self) -> list[tuple[str, int]]:
        """(task id, attempt) of every task whose handler returned and whose result the
        child had not written when it died."""
        return self._in_state(RETURNED)

    def _in_state(self, state: int) -> list[tuple[str, int]]:
        memory, found = self._memory, []
        for slot in range(self._capacity):
            at = _HEADER + slot * _SLOT
            if memory[at] != state:
                continue
            length = memory[at + 1]
            try:
                task_id = memory[at + 8 : at + 8 + length].decode()
            except UnicodeDecodeError:
                continue  # cannot happen short of memory corruption: counts as started
            (attempt,) = _ATTEMPT.unpack(memory[at + 2 : at + 6])
            found.append((task_id, attempt))
        return found
