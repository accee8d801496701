"""The 35 cairnq conformance scenarios, run unchanged on SQLite and Postgres.

A small interpreter of the scenario format (docs/protocol.md §9.1): client ops go through
`CairnQ`, worker ops through the store, `$alias.field.0` references are resolved
against saved results, and `expectError` matches the raised class by name.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from cairnqd.store.base import TaskStore

# A verbatim copy of the upstream scenario files (MIT, see LICENSE-cairnq beside them),
# so the suite runs from any checkout. CAIRNQ_SCENARIOS points at another copy.
SCENARIOS = Path(os.environ.get("CAIRNQ_SCENARIOS", Path(__file__).parent / "scenarios"))
FILES = sorted(SCENARIOS.glob("*.json"))
# The workspace's shared copy, when this checkout sits beside it.
SHARED = Path(__file__).resolve().parents[3] / "shared/protocol/conformance/scenarios"


def test_all_scenarios_are_present() -> None:
    assert len(FILES) == 35, f"expected 35 scenario files in {SCENARIOS}, found {len(FILES)}"


@pytest.mark.skipif(not SHARED.is_dir(), reason="no shared/ beside this checkout")
def test_scenarios_match_the_shared_copy() -> None:
    shared = {p.name: p.read_bytes() for p in SHARED.glob("*.json")}
    ours = {p.name: p.read_bytes() for p in FILES}
    assert ours == shared, "tests/protocol/scenarios drifted from shared/protocol/conformance"


def plain(value: Any) -> Any:
    """Results as the scenarios see them: dataclasses become dicts."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


class Runner:
    def __init__(self, client: CairnQ) -> None:
        self.client = client
        self.store: TaskStore = client.store
        self.saved: dict[str, Any] = {}

    def resolve(self, value: Any) -> Any:
        if isinstance(value, str) and value.startswith("$"):
            alias, *path = value[1:].split(".")
            target: Any = self.saved[alias]
            for part in path:
                if target is None:
                    return None
                target = target[int(part)] if isinstance(target, list) else target.get(part)
            return target
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        return value

    async def run_op(self, op: str, args: dict[str, Any]) -> Any:
        c, s = self.client, self.store
        if op == "submit":
            delay = args.pop("run_at_delay_ms", args.pop("delay_ms", 0))
            return await s.submit(**args, delay_ms=delay)
        if op in ("get", "get_status", "cancel"):
            return await getattr(c, op)(args["id"])
        if op in ("get_by_key", "get_status_by_key", "cancel_by_key"):
            return await getattr(c, op)(args["key"])
        if op == "retry":
            return await c.retry(args["id"], reset_attempt=args.get("reset_attempt", False))
        if op == "retry_by_key":
            return await c.retry_by_key(args["key"], reset_attempt=args.get("reset_attempt", False))
        if op == "list":
            return await c.list(**args)
        if op == "purge":
            return await c.purge(**args)
        if op == "stats":
            return await c.stats(args.get("queue"))
        if op == "queue_depth":
            return await c.queue_depth(args["queue"], args["max_depth"])
        if op == "claim":
            return await s.claim(
                queues=args["queues"],
                worker_id=args["worker_id"],
                lease_ms=args.get("lease_ms", 30000),
                limit=args.get("limit", 1),
                names=args.get("names"),
            )
        if op == "heartbeat":
            return await s.heartbeat(
                task_id=args["id"],
                worker_id=args["worker_id"],
                lease_ms=args.get("lease_ms", 30000),
            )
        if op == "heartbeat_batch":
            beats = await s.heartbeat_batch(
                task_ids=args["ids"],
                worker_id=args["worker_id"],
                lease_ms=args.get("lease_ms", 30000),
            )
            return [{"id": i, "cancel_requested": beats[i]} for i in args["ids"] if i in beats]
        if op == "progress":
            return await s.progress(
                task_id=args["id"],
                worker_id=args["worker_id"],
                progress=args.get("progress"),
                message=args.get("message"),
            )
        if op in ("succeed", "complete"):
            return await getattr(s, op)(
                task_id=args["id"], worker_id=args["worker_id"], result=args.get("result")
            )
        if op == "fail":
            return await s.fail(
                task_id=args["id"],
                worker_id=args["worker_id"],
                error=args["error"],
                retryable=args.get("retryable", True),
                delay_ms=args.get("delay_ms", 0),
            )
        if op == "sleep":
            await asyncio.sleep(args["ms"] / 1000)
            return None
        raise AssertionError(f"unknown op {op!r}")

    def check(self, where: str, actual: Any, expect: dict[str, Any]) -> None:
        for kind, wanted in expect.items():
            if kind == "equals":
                assert isinstance(actual, dict), f"{where}: expected an object, got {actual!r}"
                for field, value in wanted.items():
                    assert actual.get(field) == value, (
                        f"{where}: {field} = {actual.get(field)!r}, expected {value!r}"
                    )
            elif kind == "equalsRef":
                assert actual == self.resolve(wanted), f"{where}: {actual!r} != {wanted}"
            elif kind == "notEqualsRef":
                assert actual != self.resolve(wanted), f"{where}: {actual!r} == {wanted}"
            elif kind == "greaterThanRef":
                assert actual > self.resolve(wanted), f"{where}: {actual!r} <= {wanted}"
            elif kind == "length":
                assert len(actual) == wanted, f"{where}: length {len(actual)} != {wanted}"
            elif kind in ("notNull", "isNull"):
                for field in wanted:
                    value = None if actual is None else actual.get(field)
                    if kind == "isNull":
                        assert value is None, f"{where}: {field} = {value!r}, expected null"
                    else:
                        assert value is not None, f"{where}: {field} is null"
            elif kind != "target":
                raise AssertionError(f"{where}: unknown assertion {kind!r}")

    async def run(self, steps: list[dict[str, Any]]) -> None:
        for index, step in enumerate(steps):
            op = step["op"]
            where = f"step {index} ({op})"
            if op == "expect":
                target = self.resolve(step["target"])
                self.check(where, target, {k: v for k, v in step.items() if k not in ("op",)})
                continue
            args = self.resolve(step.get("args", {}))
            if "expectError" in step:
                with pytest.raises(Exception) as caught:
                    await self.run_op(op, args)
                assert type(caught.value).__name__ == step["expectError"], (
                    f"{where}: raised {type(caught.value).__name__}: {caught.value}"
                )
                if "save" in step:
                    self.saved[step["save"]] = {
                        "task_id": getattr(caught.value, "task_id", None),
                        "type": type(caught.value).__name__,
                    }
                continue
            result = plain(await self.run_op(op, args))
            if "save" in step:
                self.saved[step["save"]] = result
            if "expect" in step:
                self.check(where, result, step["expect"])


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
async def test_scenario(path: Path, store: TaskStore) -> None:
    scenario = json.loads(path.read_text())
    await Runner(CairnQ(store)).run(scenario["steps"])
