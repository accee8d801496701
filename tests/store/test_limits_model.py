"""A stateful property test of flow-control limits on a real SQLite database: whatever
the interleaving of submits, claims by two workers, settlements, crashes, lease expiry
and a limit lowered or raised, no claim ever starts a task past a limit.

Two stores (two workers) share one database file and one simulated clock, which every
statement reads (leases, recovery, rate windows). Hypothesis interleaves:

- submits of tasks covered by a partitioned concurrency limit (a budget per tenant,
  tasks without a tenant share "(none)"), by a rate limit, by both, or by neither;
- claims of any size by either worker;
- settlements (success, a failure that retries), a worker crashing (its tasks stay
  running until their leases run out and a claim recovers them), time passing;
- the concurrency limit changed on both workers at once.

The invariants, checked at every claim:
- concurrency: a task starts only while fewer than the limit's tasks of its partition
  are running under a live lease (a lowered limit starts nothing until below it);
- rate: no window of the rate's length holds more starts than its count.
Time never runs backwards, and the Postgres half of the guarantee (two claims racing
for the last slot) is tests/store/test_limits.py's race test.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from cairnqd.errors import LostLease
from cairnqd.limits import Limit, parse_limits
from cairnqd.models import Task
from cairnqd.store.base import TaskStore
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite import SQLiteStore
from tests.support.models import examples as model_examples

LEASE_MS = 5_000
WINDOW_MS = 1_000
RATE = 3
WORKERS = ("w0", "w1")
TENANTS = ("a", "b", None)


def limits(concurrency: int) -> tuple[Limit, ...]:
    return parse_limits(
        {
            "conc": {"queues": ["q"], "concurrency": concurrency, "partition_by": "payload.t"},
            "api": {"names": ["api*"], "rate": f"{RATE}/{WINDOW_MS}ms"},
        }
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000_000

    def __call__(self) -> int:
        return self.now


class LimitsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # Claims recover expired leases when they come up short, and also once a real
        # second has passed: that one would make a replayed example claim differently,
        # so here recovery is short claims and the `recovery` rule only.
        self.loop = asyncio.new_event_loop()
        self.clock = Clock()
        self.cap = 2
        self.held: dict[str, list[Task]] = {w: [] for w in WORKERS}
        self.api_starts: list[int] = []
        self.stores: dict[str, TaskStore] = {}

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def limits(self, concurrency: int) -> tuple[Limit, ...]:
        return limits(concurrency)

    def partition(self, task: Task) -> str | None:
        """The concurrency budget `task` takes from; None: it takes from none."""
        return _tenant(task) if task.queue == "q" else None

    def rated(self, task: Task) -> bool:
        return task.name.startswith("api")

    def new_store(self) -> TaskStore:
        if not hasattr(self, "folder"):
            self.folder = Path(self.run(asyncio.to_thread(_tempdir)))
        return SQLiteStore(str(self.folder / "model.db"), clock=self.clock)

    @initialize(path=st.just(None))
    def open(self, path: None) -> None:
        for w in WORKERS:
            store = self.new_store()
            store.claim_recovery_every_s = math.inf
            self.run(store.connect())
            store.use_limits(self.limits(self.cap))
            self.stores[w] = store

    def teardown(self) -> None:
        for store in self.stores.values():
            self.run(store.close())
        self.loop.close()
        if hasattr(self, "folder"):
            _remove(self.folder)

    # -- rules ---------------------------------------------------------------------------

    @rule(
        name=st.sampled_from(["plain", "api"]),
        queue=st.sampled_from(["q", "other"]),
        tenant=st.sampled_from(TENANTS),
    )
    def submit(self, name: str, queue: str, tenant: str | None) -> None:
        payload = {} if tenant is None else {"t": tenant}
        self.run(self.stores["w0"].submit(name=name, queue=queue, payload=payload))

    @rule(worker=st.sampled_from(WORKERS), n=st.integers(1, 4))
    def claim(self, worker: str, n: int) -> None:
        self.claim_from(worker, n, ["q", "other"])

    def claim_from(self, worker: str, n: int, queues: list[str]) -> None:
        store = self.stores[worker]
        claimed = self.run(store.claim(queues=queues, worker_id=worker, limit=n, lease_ms=LEASE_MS))
        self.held[worker] += claimed
        for task in claimed:
            if self.rated(task):
                self.api_starts.append(self.clock.now)
        self.check_concurrency(claimed)
        self.check_rate()

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data(), succeed=st.booleans())
    def settle(self, data: st.DataObject, succeed: bool) -> None:
        worker = data.draw(st.sampled_from([w for w in WORKERS if self.held[w]]))
        task = data.draw(st.sampled_from(self.held[worker]))
        self.held[worker].remove(task)
        store = self.stores[worker]
        try:
            if succeed:
                self.run(store.complete(task_id=task.id, worker_id=worker, result=None))
            else:
                error = {"message": "boom"}
                self.run(store.fail(task_id=task.id, worker_id=worker, error=error))
        except LostLease:
            pass  # its lease ran out and another claim recovered it

    @rule(worker=st.sampled_from(WORKERS))
    def crash(self, worker: str) -> None:
        self.held[worker] = []  # its tasks stay running until their leases run out

    @rule(worker=st.sampled_from(WORKERS))
    def recovery(self, worker: str) -> None:
        self.run(self.stores[worker].recover_leases())

    @rule(ms=st.sampled_from([1, 200, 999, 1_000, 2_500, LEASE_MS + 1]))
    def time_passes(self, ms: int) -> None:
        self.clock.now += ms

    @rule(cap=st.integers(1, 3))
    def change_the_limit(self, cap: int) -> None:
        self.cap = cap
        for store in self.stores.values():
            store.use_limits(self.limits(cap))

    # -- invariants ----------------------------------------------------------------------

    def check_concurrency(self, claimed: list[Task]) -> None:
        started = {self.partition(t) for t in claimed} - {None}
        if not started:
            return
        rows = self.run(self.stores["w0"].list(status="running", queue="q", limit=1000))
        live = [t for t in rows if (t.lease_until_ms or 0) > self.clock.now]
        for tenant in started:
            count = sum(1 for t in live if self.partition(t) == tenant)
            assert count <= self.cap, (
                f"{count} tasks of partition {tenant} run under live leases after a start "
                f"with the limit at {self.cap}"
            )

    def check_rate(self) -> None:
        for start in self.api_starts:
            window = [s for s in self.api_starts if start - WINDOW_MS < s <= start]
            assert len(window) <= RATE, f"{len(window)} starts in {WINDOW_MS} ms"


def _tenant(task: Task) -> str:
    payload = task.payload if isinstance(task.payload, dict) else {}
    value = payload.get("t")
    return "(none)" if value is None else str(value)


def _tempdir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="cairnqd-limits-model-")


def _remove(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


def model_settings(examples: int) -> settings:
    """`examples` runs of up to 40 steps each, however long a step takes."""
    return settings(
        max_examples=model_examples(examples),
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


LimitsModel.TestCase.settings = model_settings(60)
test_limits_hold_under_any_interleaving = LimitsModel.TestCase


class OneBudgetModel(LimitsModel):
    """The same model with limits that each cover a queue whole with one kind of room:
    a claim of one queue then takes its room in one statement on Postgres
    (protocol/extensions/sql/postgres/limit_claim_room.sql), and on SQLite counts the
    running tasks and claims with the protocol's claim statement, while a claim of both
    queues goes the general way, on the same room. On SQLite here; on Postgres below."""

    def limits(self, concurrency: int) -> tuple[Limit, ...]:
        return parse_limits(
            {
                "conc": {"queues": ["q"], "concurrency": concurrency},
                "api": {"queues": ["other"], "rate": f"{RATE}/{WINDOW_MS}ms"},
            }
        )

    def partition(self, task: Task) -> str | None:
        return "(none)" if task.queue == "q" else None

    def rated(self, task: Task) -> bool:
        return task.queue == "other"

    @rule(
        worker=st.sampled_from(WORKERS), n=st.integers(1, 4), queue=st.sampled_from(["q", "other"])
    )
    def claim_one_queue(self, worker: str, n: int, queue: str) -> None:
        self.claim_from(worker, n, [queue])


OneBudgetModel.TestCase.settings = model_settings(40)
test_one_budget_limits_hold_on_sqlite = OneBudgetModel.TestCase


class OneBudgetPostgresModel(OneBudgetModel):
    dsn = ""

    def new_store(self) -> TaskStore:
        return PostgresStore(self.dsn, clock=self.clock)

    @initialize(path=st.just(None))
    def open(self, path: None) -> None:
        super().open(path)
        # One database serves every example: each starts from empty tables.
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(_EMPTY_TABLES)


_EMPTY_TABLES = (
    "truncate cairnq_tasks, cairnq_task_keys, cairnqd_limit_slots, cairnqd_limit_overrides"
)


def test_one_budget_limits_hold_on_postgres(pg_dsn: str) -> None:
    OneBudgetPostgresModel.dsn = pg_dsn
    run_state_machine_as_test(
        OneBudgetPostgresModel,
        settings=model_settings(40),
    )
