"""Why a due task waits for a limit (`LimitTable.waiting_for`, behind `cairnqd inspect`
and the dashboard's task page) and which queues a full budget holds back
(`LimitTable.holding_back`, the dashboard's "throttled by" mark). A full budget makes the
reason appear; room, a task not due, or a partition of its own makes it go. Both
dialects, real databases."""

from __future__ import annotations

from typing import Any

from cairnqd.limits import NO_PARTITION, parse_limits
from cairnqd.models import Task
from cairnqd.store.base import TaskStore

SMTP = parse_limits({"smtp": {"queues": ["email"], "concurrency": 2}})
TENANT = parse_limits(
    {"tenant": {"queues": ["jobs"], "concurrency": 1, "partition_by": "payload.t"}}
)
API = parse_limits({"api": {"names": ["call.*"], "rate": "2/1m"}})


async def _claim(store: TaskStore, queues: list[str], worker: str = "w") -> list[Task]:
    return await store.claim(queues=queues, worker_id=worker, limit=10, lease_ms=600_000)


async def _submit(
    store: TaskStore, n: int, queue: str, name: str = "send", **kw: Any
) -> list[Task]:
    return [await store.submit(name=name, queue=queue, **kw) for _ in range(n)]


async def test_a_full_concurrency_budget_is_the_reason_until_room_comes_back(
    store: TaskStore,
) -> None:
    store.use_limits(SMTP)
    made = await _submit(store, 3, "email")
    running = await _claim(store, ["email"])
    assert len(running) == 2
    (waiting,) = [t for t in made if t.id not in {r.id for r in running}]
    table = store.limit_table

    (wait,) = await table.waiting_for(waiting, SMTP)
    assert wait.to_json() == {
        "limit": "smtp",
        "partition": NO_PARTITION,
        "kind": "concurrency",
        "in_use": 2,
        "capacity": 2,
        "opens_in_ms": None,
    }
    assert wait.describe() == "waiting for room in limit smtp: 2/2 running"
    # A running task waits for nothing; neither does one not yet due.
    assert await table.waiting_for(running[0], SMTP) == []
    (later,) = await _submit(store, 1, "email", delay_ms=600_000)
    assert await table.waiting_for(later, SMTP) == []

    (usage,) = await table.usage(SMTP)
    assert await table.holding_back([usage]) == {"email": ["smtp"]}

    await store.complete(task_id=running[0].id, worker_id="w", result=None)
    assert await table.waiting_for(waiting, SMTP) == []
    (usage,) = await table.usage(SMTP)
    assert await table.holding_back([usage]) == {}


async def test_an_operators_override_decides_the_room(store: TaskStore) -> None:
    store.use_limits(SMTP)
    await _submit(store, 3, "email")
    await _claim(store, ["email"])
    (waiting,) = await store.list(status="queued", queue="email")
    table = store.limit_table
    assert len(await table.waiting_for(waiting, SMTP)) == 1
    await table.set("smtp", concurrency=5, rate=None, set_by="ops")
    assert await table.waiting_for(waiting, SMTP) == []
    await table.set("smtp", concurrency=1, rate=None, set_by="ops")
    (wait,) = await table.waiting_for(waiting, SMTP)
    assert (wait.in_use, wait.capacity) == (2, 1)


async def test_each_partition_waits_for_its_own_room(store: TaskStore) -> None:
    store.use_limits(TENANT)
    for t in ("acme", "acme", "globex"):
        await store.submit(name="run", queue="jobs", payload={"t": t})
    await store.submit(name="run", queue="jobs", payload={"other": 1})
    running = await _claim(store, ["jobs"])
    assert len(running) == 3  # one each for acme, globex and the tasks without the field
    (acme,) = await store.list(status="queued", queue="jobs")
    table = store.limit_table

    (wait,) = await table.waiting_for(acme, TENANT)
    assert (wait.partition, wait.kind, wait.in_use, wait.capacity) == ("acme", "concurrency", 1, 1)
    assert wait.describe() == "waiting for room in limit tenant (partition acme): 1/1 running"
    # A payload without the field falls in the shared partition, which is full too.
    no_field = await store.submit(name="run", queue="jobs", payload={"x": 1})
    (shared,) = await table.waiting_for(no_field, TENANT)
    assert shared.partition == NO_PARTITION
    # A partition nobody has claimed in yet has all its room.
    fresh = await store.submit(name="run", queue="jobs", payload={"t": "initech"})
    assert await table.waiting_for(fresh, TENANT) == []

    (usage,) = await table.usage(TENANT)
    assert await table.holding_back([usage]) == {"jobs": ["tenant"]}
    acme_running = next(t for t in running if (t.payload or {}).get("t") == "acme")
    await store.complete(task_id=acme_running.id, worker_id="w", result=None)
    assert await table.waiting_for(acme, TENANT) == []
    # The shared partition is still full, and its task still waits on the queue.
    (usage,) = await table.usage(TENANT)
    assert await table.holding_back([usage]) == {"jobs": ["tenant"]}


async def test_a_full_rate_window_says_when_it_opens(store: TaskStore) -> None:
    store.use_limits(API)
    await _submit(store, 3, "api", name="call.partner")
    await _submit(store, 1, "other", name="call.partner")
    started = await _claim(store, ["api"])
    assert len(started) == 2
    for task in started:  # settling gives no rate back
        await store.complete(task_id=task.id, worker_id="w", result=None)
    waiting = await store.list(status="queued")
    table = store.limit_table
    for task in waiting:
        (wait,) = await table.waiting_for(task, API)
        assert (wait.kind, wait.in_use, wait.capacity) == ("rate", 2, 2)
        assert wait.opens_in_ms is not None and 0 < wait.opens_in_ms <= 60_000
        assert wait.describe().startswith("waiting for room in limit api: rate 2/1m full")
        assert "; opens in " in wait.describe()
    # The limit covers by name: every queue with its due tasks is held back.
    (usage,) = await table.usage(API)
    assert await table.holding_back([usage]) == {"api": ["api"], "other": ["api"]}


async def test_tasks_no_limit_covers_wait_for_nothing(store: TaskStore) -> None:
    store.use_limits(SMTP)
    await _submit(store, 2, "email")
    await _claim(store, ["email"])
    (other,) = await _submit(store, 1, "reports")
    assert await store.limit_table.waiting_for(other, SMTP) == []
    assert await store.limit_table.waiting_for(other, ()) == []
