"""The child's observer hooks count in place (inlined histograms, a start-table byte per
state): whatever a claim brings, they must count exactly what the plain `TaskTally`
API counts, and leave in the start table what the parent must read after a crash."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cairnqd.context import TaskContext
from cairnqd.daemon.child.outbox import Outbox
from cairnqd.daemon.child.reporter import RUNNING_LISTED, ChildReporter
from cairnqd.daemon.child.tally import TaskTally
from cairnqd.daemon.starts import NO_SLOT, StartTable
from cairnqd.daemon.wire.messages import PIPE_BUF, Heartbeat, encode
from cairnqd.models import Task

# Bounds that values land on exactly, below, between and above.
BUCKETS = (0.005, 0.1, 1.0)
VALUES = st.sampled_from([-0.5, 0.0, 0.004, 0.005, 0.0051, 0.1, 0.5, 1.0, 7.0])
OUTCOMES = ("succeeded", "retried", "failed", "canceled", "lease_lost")


class _Host:
    worker_id = "w"


@contextmanager
def reporter(capacity: int) -> Iterator[tuple[ChildReporter, StartTable]]:
    table = StartTable.create(capacity=capacity)
    fd = os.open(os.devnull, os.O_WRONLY)
    try:
        yield ChildReporter(Outbox(fd), table, (BUCKETS, BUCKETS), None, list), table
    finally:
        os.close(fd)
        table.close()


def _context(i: int, queue: str, name: str, wait_s: float) -> TaskContext:
    wait_ms = round(wait_s * 1000)
    task = Task(
        id=f"task_{i:026d}", name=name, queue=queue, status="running", attempt=1,
        run_at_ms=10_000, updated_at_ms=10_000 + wait_ms,
    )  # fmt: skip
    return TaskContext(_Host(), task)  # type: ignore[arg-type]


TASK = st.tuples(
    st.sampled_from(["q1", "q2"]),
    st.sampled_from(["a", "b"]),
    VALUES,  # queue wait
    st.booleans(),  # started
    st.sampled_from(OUTCOMES),
    VALUES,  # duration
)


@given(st.lists(st.lists(TASK, min_size=1, max_size=12), max_size=6), st.integers(2, 40))
def test_hooks_count_what_the_tally_api_counts(claims: list[list[Any]], capacity: int) -> None:
    expected = TaskTally(BUCKETS, BUCKETS)
    with reporter(capacity) as (observer, table):
        held: list[tuple[TaskContext, tuple[Any, ...]]] = []
        for n, claim in enumerate(claims):
            contexts = [
                _context(n * 100 + i, queue, name, wait)
                for i, (queue, name, wait, *_) in enumerate(claim)
            ]
            observer.tasks_held(contexts)
            held += zip(contexts, claim, strict=True)
            for ctx, (queue, name, wait, started, *_) in zip(contexts, claim, strict=True):
                # The wait is counted at the claim, a start only when it happens.
                expected.counts(queue, name).waits.observe(round(wait * 1000) / 1000)
                if started:
                    ctx.started_at = 1.0
                    observer.task_started(ctx)
                    expected.counts(queue, name).started += 1
            # While they are held: the first `capacity` found a slot, the rest count as
            # started; the parent reads exactly the unstarted ones that have a slot.
            slotted = [c for c, _ in held if c.observer_slot != NO_SLOT]
            assert len(slotted) == min(len(held), capacity)
            unstarted = {c.identity for c in slotted if c.started_at is None}
            assert set(table.unstarted()) == unstarted
            assert table.returned_unwritten() == []  # started, none has returned yet
            assert table.overflowed == (len(held) > capacity)
        for ctx, (queue, name, _, started, outcome, duration) in held:
            observer.task_ended(ctx, outcome, "", duration)
            if started or outcome != "lease_lost":
                expected.ended(queue, name, outcome, "", duration)
        snapshot = observer._tally.snapshot()
        # Every slot is free again, and reusable.
        assert table.unstarted() == [] and table.returned_unwritten() == []
        assert NO_SLOT not in table.held_many([(f"again_{i}", 1) for i in range(capacity)])
    want = expected.snapshot()
    assert set(snapshot.counts) == set(want.counts)
    for which in ("durations", "waits"):
        got, exp = getattr(snapshot, which), getattr(want, which)
        assert got.keys() == exp.keys()
        for queue in got:
            *got_buckets, got_total = got[queue]
            *exp_buckets, exp_total = exp[queue]
            assert got_buckets == exp_buckets
            assert abs(got_total - exp_total) < 1e-9


def test_the_wait_counts_from_the_creation_when_run_at_is_earlier() -> None:
    """A run_at before the task existed (another client's row, even negative) is not
    a wait of decades: the task waited from its creation."""
    task = Task(
        id="task_" + "1" * 26, name="a", queue="q", status="running", attempt=1,
        created_at_ms=9_000, run_at_ms=-1_000, updated_at_ms=10_000,
    )  # fmt: skip
    with reporter(4) as (observer, _):
        observer.tasks_held([TaskContext(_Host(), task)])  # type: ignore[arg-type]
        *_, total = observer._tally.snapshot().waits["q"]
    assert total == 1.0


def test_a_returned_task_reads_as_returned_until_it_ends() -> None:
    with reporter(4) as (observer, table):
        ctx = _context(1, "q", "a", 0.0)
        observer.tasks_held([ctx])
        ctx.started_at = 1.0
        observer.task_started(ctx)
        assert table.unstarted() == []
        observer.task_returned(ctx)
        assert table.returned_unwritten() == [ctx.identity]
        observer.task_ended(ctx, "succeeded", "", 0.001)
        assert table.returned_unwritten() == []


def test_the_running_list_is_oldest_first_and_fits_one_heartbeat() -> None:
    # Many tasks with the longest names a heartbeat meets: the list stops at its budget,
    # and the whole heartbeat (with a full paused list) stays one atomic pipe write.
    contexts = [_context(i, "q", "n" * 200, 0.0) for i in range(40)]
    with reporter(64) as (observer, table):
        observer._held = lambda: list(contexts)
        observer.tasks_held(contexts)
        for i, ctx in enumerate(contexts):
            ctx.started_at = time.monotonic() - 100 + i  # task 0 started first
            observer.task_started(ctx)
        report = observer.running_report(None)
        assert report.executing == 40
        assert report.longest is not None and report.longest.id == contexts[0].task_id
        listed = [t.id for t in report.running]
        assert 0 < len(listed) < RUNNING_LISTED
        assert listed == [c.task_id for c in contexts[: len(listed)]]
        beat = Heartbeat(
            rss=1 << 40, state="draining", executing=40, held=4096, lag_s=1.5,
            overdue=(), longest=report.longest, running=report.running,
            paused=tuple("p" * 100 for _ in range(10)),
        )  # fmt: skip
        assert len(encode(beat)) <= PIPE_BUF
        # What the parent reads after the child died: the tasks still running.
        assert sorted(table.started_unfinished()) == sorted(c.identity for c in contexts)
