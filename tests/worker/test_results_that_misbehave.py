"""Returned values whose reading or encoding raises something of their own: the task
still ends at once, failed as `unserializable_result`, instead of staying `running`.

A value JSON cannot carry raises TypeError or ValueError in the encoder, which the
worker has always turned into a failure. Anything else the returned object's own code
raises while it is read (a dict subclass whose `items()` raises, a mapping a batch
handler returns whose `get` raises) ended the call with the task neither written nor
let go: the heartbeat renewed its lease for as long as the worker lived.

The workers hold leases far longer than the waits, so a task left `running` shows as a
timed-out wait, never as a lease that expired and was recovered meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.worker import ErrorLog, eventually, running, wait_all, wait_status

pytestmark = pytest.mark.timeout(120)

LEASE_MS = 120_000
SETTLED_WITHIN = 10.0


class ItemsRaise(dict[str, Any]):
    """A dict whose items cannot be read (what a mapping changed under the encoder,
    or a lazy one whose loader failed, raises)."""

    def items(self) -> Any:
        raise RuntimeError("mapping changed while it was read")


class GetRaises(Mapping[str, Any]):
    """A batch handler's results whose lookup raises."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("lookup failed")

    def get(self, key: str, default: Any = None) -> Any:
        raise RuntimeError("lookup failed")

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _worker(store: TaskStore, errors: ErrorLog) -> Worker:
    return Worker(store, lease_ms=LEASE_MS, poll_interval_ms=50, on_error=errors)


@pytest.mark.parametrize("how", ["async", "sync"])
async def test_a_result_whose_encoding_raises_fails_the_task(
    store: TaskStore, client: CairnQ, errors: ErrorLog, how: str
) -> None:
    worker = _worker(store, errors)
    if how == "sync":

        def odd(ctx: TaskContext, payload: Any) -> Any:
            return ItemsRaise(a=1)

        worker.task("odd")(odd)
    else:

        async def odd_async(ctx: TaskContext, payload: Any) -> Any:
            return ItemsRaise(a=1)

        worker.task("odd")(odd_async)
    task = await client.submit("odd", max_attempts=3)
    async with running(worker):
        done = await wait_status(store, task.id, "failed", within=SETTLED_WITHIN)
        # The row settles before the worker lets the context go, after its write returns.
        await eventually(lambda: len(worker.in_flight) == 0, what="the context released")
    assert done.error is not None
    assert (done.error["type"], done.error["code"]) == (
        "SerializationError",
        "unserializable_result",
    )
    assert "mapping changed while it was read" in done.error["message"]
    assert done.attempt == 1  # permanent: the same value would come back


async def test_a_batch_result_mapping_that_raises_fails_each_task(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = _worker(store, errors)

    @worker.task("batched", batch=3)
    async def batched(items: list[TaskContext]) -> Any:
        return GetRaises()

    tasks = [await client.submit("batched", {"n": n}, max_attempts=3) for n in range(3)]
    async with running(worker):
        done = await wait_all(store, [t.id for t in tasks], "failed", within=SETTLED_WITHIN)
        # The row settles before the worker lets the context go, after its write returns.
        await eventually(lambda: len(worker.in_flight) == 0, what="the context released")
    for task in done:
        assert task.error is not None
        assert task.error["code"] == "unserializable_result", task.error
        assert "lookup failed" in task.error["message"]
