"""A stateful property test of task dependencies on a real SQLite file: whatever the
interleaving of submits after earlier tasks, claims, successes, failures, cancels,
retries and crashes of the worker running a task (the daemon's hand-back of a dead
child, which spends the attempt), no task starts before all its parents succeeded, a
task whose ancestor has failed or was canceled never starts, and a queued task is due
exactly when every parent has succeeded. At the end every task left is run to its end:
each one succeeded if and only if all its ancestors did, and one with an ancestor that
did not was never claimed (docs/workflows.md).

The store's clock stands still, so a released task is due at once and every claim
sees the same now; the triggers alone move tasks between waiting, due and canceled.
The same model runs on Postgres, whose trigger is a different program (one plpgsql
function, which the statements it runs fire again).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from cairnqd.models import Task
from cairnqd.store.base import TaskStore
from cairnqd.store.dependencies import WAITING_RUN_AT
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite import SQLiteStore
from tests.support.models import examples

NOW_MS = 1_800_000_000_000
BOOM = {"type": "E", "code": "boom", "message": "no", "retryable": False, "details": {}}


class DependencyModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.folder = Path(tempfile.mkdtemp(prefix="cairnqd-deps-model-"))
        self.store = self.new_store()
        self.parents: dict[str, list[str]] = {}
        self.running: list[str] = []
        self.worker_of: dict[str, str] = {}
        self.claimed: set[str] = set()
        self.claims = 0

    def new_store(self) -> TaskStore:
        return SQLiteStore(str(self.folder / "model.db"), clock=lambda: NOW_MS)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    store_open = False

    @initialize()
    def open(self) -> None:
        self.run(self.store.connect())
        self.store_open = True

    def drain_and_check(self) -> None:
        """Settle what runs, then run everything that becomes due to success."""
        for task_id in list(self.running):
            self.complete(task_id)
        while claimed := self.run(self.store.claim(queues=["default"], worker_id="end", limit=50)):
            for task in claimed:
                self.claimed.add(task.id)
                self.run(self.store.complete(task_id=task.id, worker_id="end", result=None))
        tasks = self.tasks()
        for task_id, task in tasks.items():
            ancestors = self.ancestors(task_id)
            all_ok = all(tasks[a].status == "succeeded" for a in ancestors)
            if task.status == "succeeded":
                assert all_ok and task_id in self.claimed, task_id
            elif not all_ok:
                assert task_id not in self.claimed, ("ran below a failed ancestor", task_id)
            else:  # every ancestor succeeded: it ended on its own, by a failure or cancel
                assert task.status in ("failed", "canceled"), (task_id, task.status)
                assert task.error is None or task.error.get("code") != "dependency_failed"

    def teardown(self) -> None:
        try:
            if self.store_open:
                self.drain_and_check()
        finally:
            self.close()

    def close(self) -> None:
        if self.store_open:
            self.run(self.store.close())
        self.loop.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def tasks(self) -> dict[str, Task]:
        return {t.id: t for t in self.run(self.store.list(limit=1000))}

    def ancestors(self, task_id: str) -> set[str]:
        seen: set[str] = set()
        stack = list(self.parents[task_id])
        while stack:
            parent = stack.pop()
            if parent not in seen:
                seen.add(parent)
                stack += self.parents[parent]
        return seen

    def pick(self, data: st.DataObject, ids: list[str]) -> str | None:
        return data.draw(st.sampled_from(sorted(ids))) if ids else None

    # -- rules ---------------------------------------------------------------------------

    @rule(data=st.data(), n=st.integers(0, 3))
    def submit(self, data: st.DataObject, n: int) -> None:
        if len(self.parents) >= 14:
            return
        known = sorted(self.parents)
        after = (
            data.draw(st.lists(st.sampled_from(known), max_size=n, unique=True)) if known else []
        )
        attempts = data.draw(st.integers(1, 2))
        task = self.run(self.store.submit(name="n", max_attempts=attempts, after=after))
        self.parents[task.id] = after

    @rule(data=st.data())
    def submit_pair(self, data: st.DataObject) -> None:
        """A parent and its child in one submit_many, the child naming it by index."""
        if len(self.parents) >= 13:
            return
        known = sorted(self.parents)
        outer = data.draw(st.lists(st.sampled_from(known), max_size=1)) if known else []
        made = self.run(
            self.store.submit_many(
                [{"name": "n", "max_attempts": 1, "after": outer},
                 {"name": "n", "max_attempts": 1, "after": [0]}]
            )
        )  # fmt: skip
        self.parents[made[0].id] = outer
        self.parents[made[1].id] = [made[0].id]

    @rule(n=st.integers(1, 3))
    def claim(self, n: int) -> None:
        """One worker (a child of its own) claims up to n tasks."""
        before = self.tasks()
        self.claims += 1
        worker = f"w{self.claims}"
        claimed = self.run(self.store.claim(queues=["default"], worker_id=worker, limit=n))
        for task in claimed:
            for ancestor in self.ancestors(task.id):
                assert before[ancestor].status == "succeeded", (task.id, ancestor)
            self.running.append(task.id)
            self.worker_of[task.id] = worker
            self.claimed.add(task.id)

    def complete(self, task_id: str) -> None:
        self.running.remove(task_id)
        worker = self.worker_of.pop(task_id)
        self.run(self.store.complete(task_id=task_id, worker_id=worker, result={"id": task_id}))

    @rule(data=st.data(), outcome=st.sampled_from(["succeed", "fail"]))
    def settle(self, data: st.DataObject, outcome: str) -> None:
        task_id = self.pick(data, self.running)
        if task_id is None:
            return
        if outcome == "succeed":
            self.complete(task_id)
            return
        self.running.remove(task_id)
        worker = self.worker_of.pop(task_id)
        self.run(self.store.fail(task_id=task_id, worker_id=worker, error=BOOM, retryable=False))

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """The child running a task dies: the daemon hands back everything its worker
        held, each attempt spent (queued again if one is left, else failed)."""
        task_id = self.pick(data, self.running)
        if task_id is None:
            return
        worker = self.worker_of[task_id]
        self.run(self.store.release_worker(worker, message="killed by the model"))
        for held in [t for t, w in self.worker_of.items() if w == worker]:
            self.running.remove(held)
            del self.worker_of[held]

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        live = [i for i, t in self.tasks().items() if t.status == "queued"]
        task_id = self.pick(data, live)
        if task_id is not None:
            self.run(self.store.cancel(task_id))

    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        """A retry of a task that ended on its own, not of one an ancestor's failure
        canceled (retried by hand, that one would wait for the ancestor's retry)."""
        tasks = self.tasks()
        ended = [
            i
            for i, t in tasks.items()
            if t.status in ("failed", "canceled")
            and not any(tasks[a].status in ("failed", "canceled") for a in self.ancestors(i))
        ]
        task_id = self.pick(data, ended)
        if task_id is not None:
            self.run(self.store.retry(task_id))

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def queued_is_due_exactly_when_its_parents_succeeded(self) -> None:
        tasks = self.tasks()
        for task_id, task in tasks.items():
            if task.status != "queued":
                continue
            ready = all(tasks[p].status == "succeeded" for p in self.parents[task_id])
            assert (task.run_at_ms != WAITING_RUN_AT) == ready, (task_id, self.parents[task_id])

    @invariant()
    def a_failed_ancestor_leaves_nothing_queued_below_it(self) -> None:
        tasks = self.tasks()
        for task_id, task in tasks.items():
            if task.status == "queued":
                for ancestor in self.ancestors(task_id):
                    assert tasks[ancestor].status not in ("failed", "canceled"), (
                        task_id,
                        ancestor,
                    )

    @invariant()
    def only_a_failed_ancestor_keeps_a_dependent_canceled(self) -> None:
        """A retry brought back every task the failure canceled, unless another
        failed ancestor still holds it."""
        tasks = self.tasks()
        for task_id, task in tasks.items():
            if task.status == "canceled" and task.error is not None:
                assert task.error["code"] == "dependency_failed"
                blamed = task.error["details"]["dependency"]
                assert blamed in self.ancestors(task_id)
                assert tasks[blamed].status in ("failed", "canceled"), (task_id, blamed)

    @invariant()
    def nothing_runs_before_every_ancestor_succeeded(self) -> None:
        tasks = self.tasks()
        for task_id, task in tasks.items():
            if task.status == "running":
                for ancestor in self.ancestors(task_id):
                    assert tasks[ancestor].status == "succeeded", (task_id, ancestor)


def test_dependency_graph_invariants() -> None:
    DependencyModel.TestCase.settings = settings(
        max_examples=examples(40),
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    DependencyModel.TestCase().runTest()


class PostgresDependencyModel(DependencyModel):
    dsn = ""

    def new_store(self) -> TaskStore:
        return PostgresStore(self.dsn)

    @initialize()
    def open(self) -> None:
        super().open()
        # One database serves every example: each starts from empty tables.
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(
                "truncate cairnq_tasks, cairnq_task_keys, cairnqd_task_deps, "
                "cairnqd_task_ancestors, cairnqd_task_waits, cairnqd_attempts"
            )


def test_dependency_graph_invariants_on_postgres(pg_dsn: str) -> None:
    PostgresDependencyModel.dsn = pg_dsn
    PostgresDependencyModel.TestCase.settings = settings(
        max_examples=examples(25),
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    PostgresDependencyModel.TestCase().runTest()
