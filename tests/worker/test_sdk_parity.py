"""The public API pinned against the public cairnq SDK itself, on both dialects: the
same call raises the same exception with the same words, or behaves the same way.

Each scenario runs twice, once on our client and once on the SDK's, each on a fresh
database of the dialect under test; ids and the milliseconds left to a delayed run are
the only parts of a message allowed to differ. docs/protocol.md, "8.13 Messages", lists the
deliberate differences that are left.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import cairnq
import pytest

import cairnqd
from cairnqd.store.sqlite import SQLiteStore
from tests.support.databases import PgDatabases, make_store
from tests.support.store import connect_upstream, pg_url

Scenario = Callable[[Any], Awaitable[object]]
ENVELOPE = {"type": "E", "code": "boom", "message": "it broke", "retryable": True, "details": {}}


def _normalized(text: str) -> str:
    text = re.sub(r"task_[0-9A-Z]{26}", "<id>", text)
    text = re.sub(r"after \d+ms", "after <n>ms", text)  # how long a full queue was waited on
    return re.sub(r"~-?\d+ms", "~<n>ms", text)


async def _outcome(client: Any, scenario: Scenario) -> tuple[str, str]:
    try:
        value = await scenario(client)
    except Exception as exc:
        return type(exc).__name__, _normalized(str(exc))
    return "returned", _normalized(repr(value))


class Targets:
    """Fresh databases of one dialect: ours and the SDK's never share one."""

    def __init__(self, dialect: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.dialect = dialect
        self._tmp = tmp_path
        self._request = request
        self._n = 0

    def _target(self) -> str:
        self._n += 1
        if self.dialect == "sqlite":
            return str(self._tmp / f"db{self._n}.db")
        databases: PgDatabases = self._request.getfixturevalue("pg_databases")
        return databases.new()

    @asynccontextmanager
    async def ours(self, **client_kw: Any) -> AsyncIterator[cairnqd.CairnQ]:
        client = cairnqd.CairnQ(make_store(self.dialect, self._target()), **client_kw)
        try:
            yield client
        finally:
            await client.close()

    @asynccontextmanager
    async def theirs(self, **client_kw: Any) -> AsyncIterator[Any]:
        target = self._target()
        if self.dialect == "sqlite":
            client = cairnq.CairnQ.sqlite(target, **client_kw)
        else:
            client = cairnq.CairnQ.postgres(pg_url(target), max_size=4, **client_kw)
        await connect_upstream(client)
        try:
            yield client
        finally:
            await client.close()

    async def both(self, scenario: Scenario, **client_kw: Any) -> tuple[tuple[str, str], ...]:
        async with self.ours(**client_kw) as ours:
            mine = await _outcome(ours, scenario)
        async with self.theirs(**client_kw) as theirs:
            sdk = await _outcome(theirs, scenario)
        return mine, sdk


@pytest.fixture
def targets(dialect: str, tmp_path: Path, request: pytest.FixtureRequest) -> Targets:
    return Targets(dialect, tmp_path, request)


# -- the client's calls, with bad arguments or in a state worth explaining --------------


async def _claimed(client: Any, **submit_kw: Any) -> Any:
    task = await client.submit("t", {}, **submit_kw)
    [claimed] = await client.store.claim(queues=["default"], worker_id="w1", lease_ms=60_000)
    assert claimed.id == task.id
    return task


async def _queued_again(client: Any) -> None:
    task = await _claimed(client)
    await client.store.fail(task_id=task.id, worker_id="w1", error=ENVELOPE, delay_ms=60_000)
    await client.wait(task.id, timeout_ms=50)


async def _running(client: Any) -> None:
    task = await _claimed(client)
    await client.wait(task.id, timeout_ms=50)


async def _cancel_requested(client: Any) -> None:
    task = await _claimed(client)
    await client.cancel(task.id)
    await client.wait(task.id, timeout_ms=50)


async def _never_claimed(client: Any) -> None:
    task = await client.submit("mail.send", {}, queue="email")
    await client.wait(task.id, timeout_ms=50)


async def _never_claimed_by_key(client: Any) -> None:
    await client.submit("mail.send", {}, queue="email", key="order-7")
    await client.wait_by_key("order-7", timeout_ms=50)


async def _delayed(client: Any) -> None:
    task = await client.submit("t", {}, delay_ms=600_000)
    await client.wait(task.id, timeout_ms=50)


async def _rejected(client: Any) -> None:
    await client.submit("t", {}, key="k", conflict="reject")
    await client.submit("t", {}, key="k", conflict="reject")


async def _lease_taken(client: Any) -> None:
    task = await _claimed(client)
    await client.store.heartbeat(task_id=task.id, worker_id="someone-else", lease_ms=1000)


async def _queue_full(client: Any) -> None:
    await client.submit("t", {})
    await client.submit("t", {})


SCENARIOS: dict[str, Scenario] = {
    "max_attempts of 0": lambda c: c.submit("t", {}, max_attempts=0),
    "max_attempts below 0": lambda c: c.submit("t", {}, max_attempts=-2),
    "a negative delay": lambda c: c.submit("t", {}, delay_ms=-1),
    "an unknown conflict": lambda c: c.submit("t", {}, key="k", conflict="ignore"),
    "an unknown status filter": lambda c: c.list(status="done"),
    "a negative list limit": lambda c: c.list(limit=-1),
    "a negative list offset": lambda c: c.list(offset=-5),
    "a negative purge age": lambda c: c.purge(older_than_ms=-1),
    "a purge limit of 0": lambda c: c.purge(limit=0),
    "a purge of live tasks": lambda c: c.purge(status="running"),
    "a purge of an unknown status": lambda c: c.purge(status="done"),
    "a negative queue depth": lambda c: c.queue_depth("default", -1),
    "a second submit under a rejecting key": _rejected,
    "a wait on a key that names nothing": lambda c: c.wait_by_key("order-7", timeout_ms=50),
    "a wait on an id that names nothing": lambda c: c.wait("task_nothing", timeout_ms=50),
    "a wait on a task never claimed": _never_claimed,
    "a wait by key on a task never claimed": _never_claimed_by_key,
    "a wait on a delayed task": _delayed,
    "a wait on a task queued again after a failure": _queued_again,
    "a wait on a running task": _running,
    "a wait on a task asked to cancel": _cancel_requested,
    "a heartbeat on a lease someone else holds": _lease_taken,
}


@pytest.mark.parametrize("scenario", list(SCENARIOS), ids=list(SCENARIOS))
async def test_the_same_call_ends_the_same_way(targets: Targets, scenario: str) -> None:
    mine, sdk = await targets.both(SCENARIOS[scenario])
    assert mine == sdk
    assert mine[0] != "returned"  # each scenario is one the SDK refuses or gives up on


async def test_a_queue_at_its_depth_limit(targets: Targets) -> None:
    mine, sdk = await targets.both(_queue_full, max_queue_depth=1, max_queue_wait_ms=50)
    assert (
        mine
        == sdk
        == (
            "QueueFull",
            "queue 'default' still holds 1 or more queued tasks after <n>ms; "
            "refusing to enqueue more",
        )
    )


async def test_the_diagnosis_of_a_task_never_claimed_word_for_word(targets: Targets) -> None:
    mine, _ = await targets.both(_never_claimed_by_key)
    assert mine == (
        "TaskTimeout",
        "key order-7 did not finish within 50ms: never claimed by a worker — is a worker "
        "running with a handler for 'mail.send' on queue 'email', against this same database?",
    )


# -- close: a barrier, then a reopen ------------------------------------------------------


async def _close_while_submitting(client: Any) -> tuple[set[str], set[str], int]:
    """Fifty submits under way when close() begins, five that arrive after it began,
    then one more once it has returned."""
    await client.submit("t", {})
    accepted = [asyncio.ensure_future(client.submit("t", {"i": i})) for i in range(50)]
    await asyncio.sleep(0)  # each takes its first step: admitted
    closing = asyncio.ensure_future(client.close())
    await asyncio.sleep(0)
    late = [asyncio.ensure_future(client.submit("t", {"late": i})) for i in range(5)]
    before = await asyncio.gather(*accepted, return_exceptions=True)
    after = await asyncio.gather(*late, return_exceptions=True)
    await closing
    await client.submit("t", {"reopened": True})  # the next use opens the store again
    written = len(await client.list(limit=1000))
    return {type(r).__name__ for r in before}, {type(r).__name__ for r in after}, written


async def test_close_is_a_barrier_and_the_store_reopens(targets: Targets) -> None:
    async with targets.ours() as ours:
        mine = await _close_while_submitting(ours)
    assert mine == ({"Task"}, {"StoreClosed"}, 52)
    if targets.dialect == "sqlite":  # the SDK's Postgres store has no barrier to compare
        async with targets.theirs() as theirs:
            assert await _close_while_submitting(theirs) == mine


async def test_the_refusal_while_closing_names_the_store(targets: Targets) -> None:
    async with targets.ours() as ours:
        await ours.submit_many([{"name": "t"}] * 200)
        reading = asyncio.ensure_future(ours.list(limit=200))  # admitted: close waits for it
        await asyncio.sleep(0)
        closing = asyncio.ensure_future(ours.close())
        # One loop turn at a time: the window is as short as the read still under way.
        async with asyncio.timeout(30):
            while not ours.store.closing:  # noqa: ASYNC110
                await asyncio.sleep(0)
        with pytest.raises(cairnqd.StoreClosed, match=r"store .* is closing"):
            await ours.get("task_x")
        assert len(await reading) == 200
        await closing


@pytest.mark.parametrize("operation", ["submit", "get"])
async def test_a_closed_in_memory_store_refuses_to_reopen(operation: str) -> None:
    async def closed_then(client: Any) -> object:
        await client.submit("t", {})
        await client.close()
        if operation == "submit":
            return await client.submit("t", {})
        return await client.get("task_x")

    mine = await _outcome(cairnqd.CairnQ.sqlite(":memory:"), closed_then)
    sdk = await _outcome(cairnq.CairnQ.sqlite(":memory:"), closed_then)
    assert mine == sdk
    assert mine[0] == "StoreClosed" and "reopening would silently start from empty" in mine[1]


# -- values and constructors: no database involved ----------------------------------------


def _raised(call: Callable[[], Any]) -> tuple[str, str]:
    try:
        value = call()
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "returned", str(value)


def _ours_worker(tmp_path: Path, **kw: Any) -> cairnqd.Worker:
    return cairnqd.Worker(SQLiteStore(str(tmp_path / "ours.db")), ["default"], **kw)


def _their_worker(tmp_path: Path, **kw: Any) -> Any:
    return cairnq.Worker(cairnq.SQLiteStore(str(tmp_path / "theirs.db")), ["default"], **kw)


async def noop(ctx: Any) -> None:
    return None


def _constructions(lib: Any, worker: Callable[..., Any]) -> dict[str, Callable[[], Any]]:
    """Every constructor check the SDK makes, spelt once for either library."""
    return {
        "batch 0": lambda: worker().task("t", batch=0)(noop),
        "batch -3": lambda: worker().task("t", batch=-3)(noop),
        "resource ceiling 0": lambda: worker(resources={"gpu": 0}),
        "resource ceiling -1": lambda: worker(resources={"gpu": -1}),
        "max_run_ms 0": lambda: worker(max_run_ms=0),
        "max_run_ms -5": lambda: worker(max_run_ms=-5),
        "undeclared resource": lambda: worker(resources={"gpu": 1}).task("t", resource="cpu")(noop),
        "a lambda without a name": lambda: worker().task()(lambda ctx: None),
        "a worker's depth limit of 0": lambda: worker(max_queue_depth=0),
        "a depth limit of 0": lambda: lib.CairnQ.sqlite(":memory:", max_queue_depth=0),
        "a depth limit of True": lambda: lib.CairnQ.sqlite(":memory:", max_queue_depth=True),
        "a queue's depth limit of 0": lambda: lib.CairnQ.sqlite(
            ":memory:", max_queue_depth={"email": 0}
        ),
        "retention without rules": lambda: lib.Retention(older_than_ms={}),
        "retention every 0 ms": lambda: lib.Retention(older_than_ms=1000, interval_ms=0),
        "retention limit 0": lambda: lib.Retention(older_than_ms=1000, limit=0),
        "retention of negative age": lambda: lib.Retention(older_than_ms=-1),
        "retention of queued tasks": lambda: lib.Retention(older_than_ms={"queued": 1000}),
        "TaskFailed": lambda: lib.TaskFailed(ENVELOPE),
        "TaskFailed of nothing": lambda: lib.TaskFailed(None),
        "TaskFailed of nothing, its type": lambda: lib.TaskFailed(None).type,
        "TaskCanceled": lambda: lib.TaskCanceled("task_1"),
        "LostLease": lambda: lib.LostLease("task_1"),
        "QueueFull": lambda: lib.QueueFull("email", 5, 100),
        "AlreadyExists": lambda: lib.AlreadyExists("order-7"),
        "TaskTimeout without a limit": lambda: lib.TaskTimeout("task_1"),
        "TaskTimeout of a key": lambda: lib.TaskTimeout("k", timeout_ms=5, key="k"),
    }


def test_every_constructor_check_and_error_reads_as_the_sdks(tmp_path: Path) -> None:
    mine = _constructions(cairnqd, lambda **kw: _ours_worker(tmp_path, **kw))
    sdk = _constructions(cairnq, lambda **kw: _their_worker(tmp_path, **kw))
    differences = {
        case: (_raised(mine[case]), _raised(sdk[case]))
        for case in mine
        if _raised(mine[case]) != _raised(sdk[case])
    }
    assert differences == {}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda w: w.task("t", batch=0)(noop), "batch must be >= 1, got 0"),
        (lambda w: w.task("t", resource="cpu")(noop), "task 't' declares resource 'cpu'"),
    ],
)
def test_the_pinned_words(tmp_path: Path, call: Callable[[Any], Any], message: str) -> None:
    """A change to the SDK's wording shows here as well as in the comparison above."""
    with pytest.raises(ValueError, match=re.escape(message)):
        call(_ours_worker(tmp_path, resources={"gpu": 1}))
    assert _raised(lambda: cairnqd.Worker(SQLiteStore(":memory:"), ["q"], resources={"gpu": 0}))[
        1
    ] == ("resources['gpu'] must be >= 1, got 0")
