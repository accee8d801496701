"""Identifier formats shared with the public SDKs: `task_<ULID>`, `worker_<ULID>`."""

from __future__ import annotations

from ulid import ULID


def new_task_id() -> str:
    return f"task_{ULID()}"


def new_worker_id(prefix: str = "worker") -> str:
    return f"{prefix}_{ULID()}"
