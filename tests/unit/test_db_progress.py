"""`Progress`: how long a worker's needed database calls have gone without a success."""

from __future__ import annotations

from cairnqd._inflight import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_call_that_has_not_answered_counts_from_its_start() -> None:
    clock = Clock()
    progress = Progress(clock)
    assert progress.stalled_s() == 0.0
    progress.begin()
    clock.now += 12
    assert progress.stalled_s() == 12
    progress.succeeded()
    assert progress.stalled_s() == 0.0


def test_failures_are_no_progress_until_a_call_succeeds() -> None:
    clock = Clock()
    progress = Progress(clock)
    for _ in range(3):
        progress.begin()
        clock.now += 5
        progress.failed()
    assert progress.stalled_s() == 15  # no call out right now, still no progress
    progress.begin()
    progress.succeeded()
    assert progress.stalled_s() == 0.0


def test_a_success_while_another_call_hangs_restarts_the_count() -> None:
    clock = Clock()
    progress = Progress(clock)
    progress.begin()  # a claim that hangs
    clock.now += 3
    progress.begin()  # a renewal that gets through
    progress.succeeded()
    assert progress.stalled_s() == 0.0  # the database answers
    clock.now += 11
    assert progress.stalled_s() == 11  # but the claim is still out
    progress.failed()
    clock.now += 1
    assert progress.stalled_s() == 12
