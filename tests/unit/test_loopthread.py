"""`LoopThread.stop`: the thread ends within its bound even when a task on its loop
swallows the cancellation and waits on (psycopg_pool's workers do, caught mid-connect
to a silent server)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from cairnqd.daemon.parent.dbthread import CANCEL_WAIT_S, LoopThread


def test_a_task_that_swallows_its_cancel_does_not_hold_the_thread() -> None:
    thread = LoopThread("test-loop")
    thread.start()
    started = asyncio.Event()

    async def stubborn() -> None:
        started.set()
        while True:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    async def polite() -> None:
        await asyncio.sleep(3600)

    async def begin() -> None:
        asyncio.get_running_loop().create_task(stubborn(), name="stubborn")
        asyncio.get_running_loop().create_task(polite(), name="polite")
        await started.wait()

    thread.submit(begin()).result(timeout=10)
    began = time.monotonic()
    assert thread.stop(timeout_s=CANCEL_WAIT_S + 10)
    assert time.monotonic() - began < CANCEL_WAIT_S + 5
    assert not thread.running()
