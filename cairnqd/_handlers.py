"""Registered handlers: how a function becomes a task handler.

How a handler is called is decided once, at registration (awaited, or run in the
worker's thread pool; `(ctx)`, `(ctx, payload)` or, with `batch=`, a list of
contexts), so the per-task path only reads flags.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cairnqd.models import TaskDef, task_name

Handler = Callable[..., Any]


@dataclass
class RegisteredHandler:
    name: str
    fn: Handler
    batch: int | None
    resource: str | None
    is_async: bool
    wants_payload: bool


def make_handler(
    name: str | TaskDef[Any, Any],
    fn: Handler,
    *,
    batch: int | None,
    resource: str | None,
    resources: Mapping[str, int],
) -> RegisteredHandler:
    """Validate a registration against the worker's declared `resources`."""
    resolved = task_name(name)
    if not isinstance(resolved, str) or not resolved:
        raise ValueError(f"task name must be a non-empty string, got {resolved!r}")
    if not callable(fn):
        raise ValueError(f"handler for {resolved!r} is not callable: {fn!r}")
    check_positive(batch, "batch", allow_none=True)
    if resource is not None and resource not in resources:
        declared = ", ".join(sorted(resources)) or "none"
        raise ValueError(
            f"task {resolved!r} declares resource {resource!r}, which is not in "
            f"Worker(resources=...); declared: {declared}"
        )
    return RegisteredHandler(
        name=resolved,
        fn=fn,
        batch=batch,
        resource=resource,
        is_async=is_async(fn),
        wants_payload=batch is None and wants_payload(fn),
    )


def is_async(fn: Handler) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - a callable object's own method
    return call is not None and inspect.iscoroutinefunction(call)


def wants_payload(fn: Handler) -> bool:
    """(ctx, payload) when the handler takes two positional parameters or *args."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = 0
    for p in params:
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            return True
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional >= 2


def derived_name(fn: Handler) -> str:
    """The task name a bare `@worker.task` takes: the function's own name, which must
    be an identifier (a lambda's `<lambda>` would collide across handlers)."""
    name = getattr(fn, "__name__", "")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(
            f"worker.task: cannot derive a task name from {name or fn!r}; pass one "
            "explicitly, e.g. @worker.task('summary.create')"
        )
    return name


def check_positive(value: Any, arg: str, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{arg} must be an integer >= 1, got {value!r}")
    if value < 1:  # worded as the public SDK words it
        raise ValueError(f"{arg} must be >= 1, got {value}")
