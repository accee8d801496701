"""The start table: a real memfd shared with a real child process that is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from cairnqd.daemon.starts import FREE, NO_SLOT, RETURNED, STARTED, StartTable
from tests.support.waiting import wait_for

CHILD = textwrap.dedent(
    """
    import sys, time
    from cairnqd.daemon.starts import StartTable
    table = StartTable.attach(int(sys.argv[1]))
    slots = [table.held(f"task_{i}", 1) for i in range(5)]
    table.started(slots[1])
    table.started(slots[3])
    table.released(slots[3])   # started and finished
    table.released(slots[4])   # lease lost before it started
    table.held("task_1", 2)    # the same task again, a later attempt, not started
    print("ready", flush=True)
    time.sleep(60)
    """
)


def test_the_parent_reads_what_a_killed_child_left() -> None:
    table = StartTable.create(capacity=16)
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(table.fd)],
            pass_fds=(table.fd,),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGKILL)
        wait_for("the child to die", lambda: child.poll() is not None)
        child.stdout.close()
        assert sorted(table.unstarted()) == [
            ("task_0", 1),
            ("task_1", 2),
            ("task_2", 1),
        ]
        assert not table.overflowed
    finally:
        table.close()


def test_a_full_table_says_so_and_counts_the_rest_as_started() -> None:
    table = StartTable.create(capacity=2)
    try:
        slots = [table.held(f"t{i}", 1) for i in range(3)]
        assert slots[2] == NO_SLOT
        assert table.overflowed
        assert sorted(table.unstarted()) == [("t0", 1), ("t1", 1)]
        table.released(slots[0])
        table.released(slots[2])  # no slot: nothing to free
        assert table.held("t3", 1) == slots[0]  # a freed slot is reused
        assert table.held("t4", 1) == NO_SLOT
        assert sorted(table.unstarted()) == [("t1", 1), ("t3", 1)]
    finally:
        table.close()


def test_attach_refuses_a_foreign_file() -> None:
    fd = os.memfd_create("other")
    try:
        os.ftruncate(fd, 4096)
        with pytest.raises(ValueError, match="not a cairnqd start table"):
            StartTable.attach(fd)
    finally:
        os.close(fd)


def test_ids_up_to_the_slot_size_round_trip_and_a_reused_slot_reads_its_new_id() -> None:
    table = StartTable.create(capacity=1)
    try:
        longest = "x" * 88  # the most a 96-byte slot holds
        slot = table.held(longest, 7)
        assert table.unstarted() == [(longest, 7)]
        table.released(slot)
        # The same slot, a shorter id, the largest attempt.
        table.held("short", 2**32 - 1)
        assert table.unstarted() == [("short", 2**32 - 1)]
        # Too long for a slot: counted as started, and said.
        assert table.held("y" * 89, 1) == NO_SLOT
        assert table.overflowed
    finally:
        table.close()


def test_states_written_through_no_slot_change_nothing_the_parent_reads() -> None:
    """The child's hooks write a task's state at its slot without testing for NO_SLOT
    (a spare header byte): such writes must leave the table, its flag and its header
    as they were."""
    table = StartTable.create(capacity=2)
    try:
        slots = table.held_many([("a", 1), ("b", 2), ("c", 3)])
        assert slots[2] == NO_SLOT
        table.started(slots[1])
        before = (sorted(table.unstarted()), table.returned_unwritten(), table.overflowed)
        for state in (STARTED, RETURNED, FREE):
            table.marks[NO_SLOT] = state
        table.released(NO_SLOT)
        assert (sorted(table.unstarted()), table.returned_unwritten(), table.overflowed) == before
        assert before == ([("a", 1)], [], True)
        StartTable.attach(table.fd).close()  # the header still reads as a start table
        # NO_SLOT never enters the free list: the next task finds the table full.
        assert table.held("d", 1) == NO_SLOT
    finally:
        table.close()


def test_held_many_records_a_claim_as_held_would_task_by_task() -> None:
    one, many = StartTable.create(capacity=8), StartTable.create(capacity=8)
    try:
        claim = [(f"task_{i}", i + 1) for i in range(5)]
        assert [one.held(*item) for item in claim] == many.held_many(claim)
        assert sorted(one.unstarted()) == sorted(many.unstarted()) == sorted(claim)
    finally:
        one.close()
        many.close()


def test_a_private_table_takes_the_same_calls() -> None:
    table = StartTable.private(capacity=1)
    try:
        slot = table.held("a", 1)
        table.marks[slot] = STARTED
        table.released(slot)
        assert table.held("b", 1) == slot
        assert table.unstarted() == [("b", 1)]
    finally:
        table.close()


RETURNING_CHILD = textwrap.dedent(
    """
    import sys, time
    from cairnqd.daemon.starts import StartTable
    table = StartTable.attach(int(sys.argv[1]))
    slots = [table.held(f"task_{i}", 1) for i in range(3)]
    for slot in slots:
        table.started(slot)
    table.returned(slots[0])   # result queued, not written
    table.returned(slots[1])
    table.released(slots[1])   # result written
    table.held("task_3", 1)    # claimed ahead, never started
    print("ready", flush=True)
    time.sleep(60)
    """
)


def test_returned_but_unwritten_tasks_are_told_apart_from_running_and_unstarted() -> None:
    table = StartTable.create(capacity=8)
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", RETURNING_CHILD, str(table.fd)],
            pass_fds=(table.fd,), stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGKILL)
        wait_for("the child to die", lambda: child.poll() is not None)
        child.stdout.close()
        assert table.returned_unwritten() == [("task_0", 1)]
        assert table.unstarted() == [("task_3", 1)]  # task_2 was running: neither
    finally:
        table.close()


def test_a_task_gets_its_attempt_back_for_an_unwritten_result_a_bounded_number_of_times() -> None:
    from cairnqd.daemon.parent.exits import ReturnedRestores

    restores = ReturnedRestores(limit=2)
    assert restores.allow([("a", 1), ("b", 1)]) == [("a", 1), ("b", 1)]
    assert restores.allow([("a", 1)]) == [("a", 1)]
    # A result whose writing kills the child every time: the third death charges it.
    assert restores.allow([("a", 1)]) == []
    assert restores.allow([("b", 1)]) == [("b", 1)]
