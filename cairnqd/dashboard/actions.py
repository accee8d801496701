"""The dashboard's actions: what each does, checked and logged.

Design note. An action exists only when `dashboard.actions` is true (the config
refuses it without a token file); otherwise the server has no route for it at all.
Each takes its fields from a POST form, checks them as the CLI would, does its writes
through the same store operations as the CLI command it mirrors (`cairnqd retry`,
`cancel`, `pause`, `resume`, `schedules run`, `cancel` and `retry` by filter) and logs
one line on `cairnqd.dashboard`: who (the name given at login), from where, what, and
the outcome.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cairnqd.config import Config, format_duration
from cairnqd.dashboard.data import BULK_TIMEOUT_S, DashboardData, bulk_failed
from cairnqd.dashboard.pages import cancel_grace_of
from cairnqd.dashboard.params import (
    BULK_FILTERS,
    BULK_STATUSES,
    BadRequest,
    bulk_filter,
    selected_ids,
    task_id,
)
from cairnqd.store.base import TaskStore
from cairnqd.store.operator import QUEUE_MAX, REASON_MAX
from cairnqd.store.tables.schedules import run_now

log = logging.getLogger("cairnqd.dashboard")


@dataclass(frozen=True)
class Outcome:
    message: str


Action = Callable[[Config, DashboardData, Mapping[str, str], str], Outcome]

#: The form fields of each action (besides `csrf` and `next`).
FIELDS: dict[str, frozenset[str]] = {
    "task-retry": frozenset({"id"}),
    "task-cancel": frozenset({"id"}),
    "queue-pause": frozenset({"queue", "reason"}),
    "queue-resume": frozenset({"queue"}),
    "schedule-trigger": frozenset({"schedule"}),
    "failed-retry": frozenset({"name", "error_type"}),
    "failed-discard": frozenset({"name", "error_type"}),
    "tasks-selected": frozenset({"id", "op"}),
    "tasks-matching": BULK_FILTERS | {"count"},
}
#: The one field of an action's form that may be given many times (a checkbox per row).
MULTI: dict[str, str] = {"tasks-selected": "id"}


def _need(form: Mapping[str, str], name: str) -> str:
    value = form.get(name, "")
    if not value:
        raise BadRequest(f"form field {name!r} is missing")
    return value


def _queue(form: Mapping[str, str]) -> str:
    queue = _need(form, "queue")
    if len(queue) > QUEUE_MAX:
        raise BadRequest(f"queue: longer than {QUEUE_MAX} characters")
    return queue


def task_retry(config: Config, data: DashboardData, form: Mapping[str, str], who: str) -> Outcome:
    tid = task_id(_need(form, "id"))

    async def work(store: TaskStore) -> bool:
        return await store.retry(tid) is not None

    done = data.write(work, f"retry {tid}")
    return Outcome(f"{tid} queued again" if done else f"{tid} was not failed or canceled")


def task_cancel(config: Config, data: DashboardData, form: Mapping[str, str], who: str) -> Outcome:
    tid = task_id(_need(form, "id"))

    async def work(store: TaskStore) -> tuple[str, str] | None:
        task = await store.cancel(tid)
        return None if task is None else (task.status, task.queue)

    done = data.write(work, f"cancel {tid}")
    if done is None:
        return Outcome(f"{tid} was not queued or running: nothing to cancel")
    status, queue = done
    if status == "canceled":
        return Outcome(f"{tid} canceled")
    grace = cancel_grace_of(config, queue)
    wait = format_duration(grace) if grace is not None else "its group's cancel_grace"
    return Outcome(
        f"{tid} is running: its cancel is asked, and it ends as canceled; its handler is "
        f"cancelled if it has not returned {wait} from now, and its worker process is "
        f"replaced if it still runs {wait} after that"
    )


def queue_pause(config: Config, data: DashboardData, form: Mapping[str, str], who: str) -> Outcome:
    queue = _queue(form)
    reason = form.get("reason") or None
    if reason is not None and len(reason) > REASON_MAX:
        raise BadRequest(f"reason: longer than {REASON_MAX} characters")

    async def work(store: TaskStore) -> bool:
        made = await store.pauses.pause([queue], paused_by=f"dashboard:{who}", reason=reason)
        return bool(made)

    done = data.write(work, f"pause {queue}")
    return Outcome(f"queue {queue} paused" if done else f"queue {queue} was paused already")


def queue_resume(config: Config, data: DashboardData, form: Mapping[str, str], who: str) -> Outcome:
    queue = _queue(form)

    async def work(store: TaskStore) -> bool:
        return bool(await store.pauses.resume([queue]))

    done = data.write(work, f"resume {queue}")
    return Outcome(f"queue {queue} resumed" if done else f"queue {queue} was not paused")


def schedule_trigger(
    config: Config, data: DashboardData, form: Mapping[str, str], who: str
) -> Outcome:
    name = _need(form, "schedule")
    schedule = config.schedules.get(name)
    if schedule is None:
        raise BadRequest(f"schedule: no schedule {name[:80]!r} in the config")
    now_ms = int(time.time() * 1000)

    async def work(store: TaskStore) -> str:
        return await run_now(store, schedule, at_ms=now_ms, by=f"dashboard:{who}")

    tid = data.write(work, f"run schedule {name}")
    return Outcome(f"{tid} enqueued now for schedule {name}")


def _failed(discard: bool) -> Action:
    def act(config: Config, data: DashboardData, form: Mapping[str, str], who: str) -> Outcome:
        name = _need(form, "name")
        error_type = form.get("error_type", "")

        async def work(store: TaskStore) -> int:
            return await bulk_failed(store, name, error_type, discard=discard)

        verb = "discard" if discard else "retry"
        n = data.write(work, f"{verb} failed {name}")
        done = "deleted" if discard else "queued again"
        return Outcome(f"{n} failed {name} task(s) ({error_type or 'no type'}) {done}")

    return act


def _bulk_message(op: str, matched: int, changed: int, requested: int, what: str) -> str:
    verb = "Canceled" if op == "cancel" else "Retried"
    line = f"{verb} {changed:,} task(s) {what}"
    if requested:
        line += f" ({requested:,} running: cancel asked, they end as canceled)"
    if matched > changed:
        line += f"; {matched - changed:,} had changed status and were left alone"
    return line


def tasks_selected(
    config: Config, data: DashboardData, form: Mapping[str, str], who: str
) -> Outcome:
    """Cancel or retry the tasks ticked on the task list, in one transaction."""
    op = form.get("op", "")
    if op not in BULK_STATUSES:
        raise BadRequest(f"op: must be cancel or retry, got {op[:40]!r}")
    ids = selected_ids(form.get("id", ""))

    async def work(store: TaskStore) -> tuple[int, int]:
        if op == "cancel":
            tasks = await store.bulk.cancel(ids)
            return len(tasks), sum(1 for t in tasks if t.status == "running")
        return len(await store.bulk.retry(ids)), 0

    changed, requested = data.write(work, f"{op} {len(ids)} selected tasks")
    if len(ids) == 1 and changed == 1 and not requested:
        return Outcome(f"{'Canceled' if op == 'cancel' else 'Retried'} task {ids[0]}")
    return Outcome(_bulk_message(op, len(ids), changed, requested, "of the selected"))


def tasks_matching(
    config: Config, data: DashboardData, form: Mapping[str, str], who: str
) -> Outcome:
    """Cancel or retry every task matching the task list's filter, as `cairnqd cancel
    --queue ...` does, after the confirmation page showed how many."""
    op, where, described = bulk_filter({k: v for k, v in form.items() if k != "count"})

    async def work(store: TaskStore) -> tuple[int, int, int]:
        done = await store.bulk.apply(op, where)
        return done.matched, done.changed, done.requested

    matched, changed, requested = data.write(
        work, f"{op} all matching ({described})", timeout_s=BULK_TIMEOUT_S
    )
    return Outcome(_bulk_message(op, matched, changed, requested, f"matching {described}"))


ACTIONS: dict[str, Action] = {
    "task-retry": task_retry,
    "task-cancel": task_cancel,
    "queue-pause": queue_pause,
    "queue-resume": queue_resume,
    "schedule-trigger": schedule_trigger,
    "failed-retry": _failed(discard=False),
    "failed-discard": _failed(discard=True),
    "tasks-selected": tasks_selected,
    "tasks-matching": tasks_matching,
}


#: The most of one form value an audit line repeats (500 selected ids would be 17 KB).
AUDIT_VALUE_MAX = 300


def _shortened(value: str) -> str:
    if len(value) <= AUDIT_VALUE_MAX:
        return value
    return f"{value[:AUDIT_VALUE_MAX]}… ({len(value):,} characters)"


def audit(action: str, who: str, address: str, form: Mapping[str, str], outcome: str) -> None:
    what = ", ".join(
        f"{k}={_shortened(v)!r}" for k, v in sorted(form.items()) if k not in ("csrf", "next")
    )
    log.info("dashboard action %s by %s from %s (%s): %s", action, who, address, what, outcome)


__all__ = ["ACTIONS", "FIELDS", "MULTI", "Outcome", "audit"]
