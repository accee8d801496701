"""docs/protocol.md §8.3-8.4: registering handlers and the calling convention."""

from __future__ import annotations

import asyncio
import functools
import threading
from pathlib import Path
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.models import TaskDef
from cairnqd.store.base import TaskStore
from cairnqd.store.sqlite import SQLiteStore
from cairnqd.worker import Worker
from tests.support.worker import SQLITE_ONLY, running, wait_all, wait_status

pytestmark = pytest.mark.timeout(60)


def idle_worker(tmp_path: Path, **kw: Any) -> Worker:
    """A worker on a store that is never connected: registration needs no database."""
    return Worker(SQLiteStore(str(tmp_path / "unused.db")), ["default"], **kw)


# -- calling convention ----------------------------------------------------------------


@SQLITE_ONLY
async def test_payload_is_passed_by_signature(store: TaskStore, client: CairnQ) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=50, concurrency=4)
    seen: dict[str, tuple[Any, ...]] = {}

    @worker.task
    async def two(ctx: TaskContext, payload: Any) -> str:
        assert isinstance(ctx, TaskContext)
        seen["two"] = (payload,)
        return "two"

    @worker.task
    async def one(ctx: TaskContext) -> Any:
        seen["one"] = ()
        return ctx.payload

    @worker.task
    async def star(ctx: TaskContext, *args: Any) -> str:
        seen["star"] = args
        return "star"

    @worker.task
    async def kwonly(ctx: TaskContext, *, extra: Any = "default") -> Any:
        # A keyword-only parameter is not a payload slot.
        seen["kwonly"] = (extra,)
        return extra

    @worker.task
    async def optional_second(ctx: TaskContext, payload: Any = None) -> Any:
        seen["optional_second"] = (payload,)
        return payload

    payload = {"x": 1, "nested": [1, "a", None]}
    names = ["two", "one", "star", "kwonly", "optional_second"]
    tasks = [await client.submit(n, payload) for n in names]
    async with running(worker):
        done = await wait_all(store, [t.id for t in tasks])
    assert [t.status for t in done] == ["succeeded"] * 5
    assert seen["two"] == (payload,)
    assert seen["one"] == ()
    assert seen["star"] == (payload,)
    assert seen["kwonly"] == ("default",)
    assert seen["optional_second"] == (payload,)
    results = {t.name: t.result for t in done}
    assert results["one"] == payload
    assert results["kwonly"] == "default"


@SQLITE_ONLY
async def test_sync_handler_runs_off_the_loop_thread(store: TaskStore, client: CairnQ) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=50)
    loop_thread = threading.current_thread()
    threads: list[threading.Thread] = []

    @worker.task
    def blocking(ctx: TaskContext, payload: Any) -> int:
        threads.append(threading.current_thread())
        return int(payload["n"]) * 2

    @worker.task
    async def on_loop(ctx: TaskContext) -> str:
        threads.append(threading.current_thread())
        return "async"

    a = await client.submit("blocking", {"n": 21})
    async with running(worker):
        done = await wait_status(store, a.id)
        b = await client.submit("on_loop")
        done_b = await wait_status(store, b.id)
    assert (done.status, done.result) == ("succeeded", 42)
    assert (done_b.status, done_b.result) == ("succeeded", "async")
    assert threads[0] is not loop_thread, "a sync handler must not run on the event loop"
    assert threads[1] is loop_thread, "an async handler runs on the loop"


@SQLITE_ONLY
async def test_callable_objects_use_their_call_method(store: TaskStore, client: CairnQ) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=50)
    loop_thread = threading.current_thread()
    threads: dict[str, threading.Thread] = {}

    class AsyncHandler:
        def __init__(self, factor: int) -> None:
            self.factor = factor

        async def __call__(self, ctx: TaskContext, payload: Any) -> int:
            threads["async_obj"] = threading.current_thread()
            await asyncio.sleep(0)
            return int(payload["n"]) * self.factor

    class SyncHandler:
        def __call__(self, ctx: TaskContext) -> str:
            threads["sync_obj"] = threading.current_thread()
            return f"sync:{ctx.name}"

    worker.register("async_obj", AsyncHandler(3))
    worker.register("sync_obj", SyncHandler())
    a = await client.submit("async_obj", {"n": 5})
    b = await client.submit("sync_obj")
    async with running(worker):
        done_a, done_b = await wait_all(store, [a.id, b.id])
    assert (done_a.status, done_a.result) == ("succeeded", 15)
    assert (done_b.status, done_b.result) == ("succeeded", "sync:sync_obj")
    assert threads["async_obj"] is loop_thread
    assert threads["sync_obj"] is not loop_thread


@SQLITE_ONLY
async def test_sync_handler_returning_an_awaitable_is_awaited_on_the_loop(
    store: TaskStore, client: CairnQ
) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=50)
    loop_thread = threading.current_thread()
    where: list[threading.Thread] = []

    async def finish(value: int) -> dict[str, int]:
        where.append(threading.current_thread())
        await asyncio.sleep(0)
        return {"value": value}

    def starts_async(ctx: TaskContext, payload: Any) -> Any:
        where.append(threading.current_thread())
        return finish(payload["v"])

    async def partial_target(ctx: TaskContext, payload: Any, *, bonus: int) -> int:
        return int(payload["v"]) + bonus

    worker.register("starts_async", starts_async)
    worker.register("partial", functools.partial(partial_target, bonus=100))
    a = await client.submit("starts_async", {"v": 7})
    b = await client.submit("partial", {"v": 1})
    async with running(worker):
        done_a, done_b = await wait_all(store, [a.id, b.id])
    assert (done_a.status, done_a.result) == ("succeeded", {"value": 7})
    assert (done_b.status, done_b.result) == ("succeeded", 101)
    assert where[0] is not loop_thread
    assert where[1] is loop_thread


# -- registration ----------------------------------------------------------------------


@SQLITE_ONLY
async def test_task_decorator_forms(store: TaskStore, client: CairnQ) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=50, concurrency=4)
    summary: TaskDef[dict[str, Any], str] = TaskDef("summary.create")

    @worker.task
    async def bare(ctx: TaskContext) -> str:
        return "bare"

    @worker.task()
    async def called_empty(ctx: TaskContext) -> str:
        return "called_empty"

    @worker.task("report.render")
    async def explicit(ctx: TaskContext) -> str:
        return "explicit"

    @worker.task(summary)
    async def from_def(ctx: TaskContext) -> str:
        return "from_def"

    # The decorators hand back the function itself.
    assert bare.__name__ == "bare" and explicit.__name__ == "explicit"
    assert set(worker.handlers) == {"bare", "called_empty", "report.render", "summary.create"}

    ids = [
        (await client.submit("bare")).id,
        (await client.submit("called_empty")).id,
        (await client.submit("report.render")).id,
        (await client.submit(summary)).id,
    ]
    async with running(worker):
        done = await wait_all(store, ids)
    assert [(t.name, t.status, t.result) for t in done] == [
        ("bare", "succeeded", "bare"),
        ("called_empty", "succeeded", "called_empty"),
        ("report.render", "succeeded", "explicit"),
        ("summary.create", "succeeded", "from_def"),
    ]


@SQLITE_ONLY
async def test_reregistering_a_name_replaces_its_handler(store: TaskStore, client: CairnQ) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=50)
    worker.register("job", lambda ctx: "old")
    worker.register("job", lambda ctx: "new")
    task = await client.submit("job")
    async with running(worker):
        done = await wait_status(store, task.id)
    assert (done.status, done.result) == ("succeeded", "new")


def test_register_rejects_an_undeclared_resource(tmp_path: Path) -> None:
    worker = idle_worker(tmp_path, resources={"gpu": 1})
    with pytest.raises(ValueError, match="tpu"):
        worker.register("embed", lambda ctx: None, resource="tpu")
    with pytest.raises(ValueError):

        @worker.task(resource="cpu")
        async def render(ctx: TaskContext) -> None: ...

    assert not worker.handlers
    worker.register("embed", lambda ctx: None, resource="gpu")  # declared: fine
    no_resources = idle_worker(tmp_path)
    with pytest.raises(ValueError):
        no_resources.register("embed", lambda ctx: None, resource="gpu")


@pytest.mark.parametrize("batch", [0, -1])
def test_register_rejects_a_batch_below_one(tmp_path: Path, batch: int) -> None:
    worker = idle_worker(tmp_path)
    with pytest.raises(ValueError):
        worker.register("job", lambda ctxs: None, batch=batch)
    with pytest.raises(ValueError):
        worker.task("job", batch=batch)(lambda ctxs: None)
    assert not worker.handlers


def test_a_lambda_cannot_name_its_own_task(tmp_path: Path) -> None:
    worker = idle_worker(tmp_path)
    with pytest.raises(ValueError):
        worker.task(lambda ctx: None)
    with pytest.raises(ValueError):
        worker.task()(lambda ctx: None)
    with pytest.raises(ValueError):
        worker.task(batch=2)(lambda ctxs: None)
    assert not worker.handlers
    # Named explicitly, a lambda is an ordinary handler.
    worker.register("named", lambda ctx: None)
    worker.task("also.named")(lambda ctx: None)
    assert set(worker.handlers) == {"named", "also.named"}


def test_constructor_validation(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "unused.db"))
    for bad in (0, -5):
        with pytest.raises(ValueError):
            Worker(store, ["default"], max_run_ms=bad)
    with pytest.raises(ValueError):
        Worker(store, ["default"], resources={"gpu": 0})
    worker = Worker(store, ["default"], max_run_ms=1, resources={"gpu": 1, "io": 8})
    assert worker.worker_id.startswith("worker_")
    assert worker.worker_id == worker.worker_id
    assert Worker(store, ["default"]).worker_id != worker.worker_id
