"""Handler registries: what a `handlers:` entry in the config points at.

A `module:attribute` path to a `TaskRegistry` or a public-SDK-style `Worker`. The parent
only parses paths (`parse_handler_path`); importing runs application code, so only a
child or a preflight child resolves them (docs/architecture.md, "Handler registries").
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar, overload

from cairnqd.config.handler_path import parse_handler_path
from cairnqd.errors import CairnQError
from cairnqd.models import TaskDef, task_name
from cairnqd.store.arguments import MAX_TEXT_BYTES, MAX_WORKER_COUNT, check_text

__all__ = [
    "Handler",
    "HandlerError",
    "HandlerSpec",
    "Registration",
    "TaskRegistry",
    "parse_handler_path",
    "resolve_handlers",
]

Handler = Callable[..., Any]
F = TypeVar("F", bound=Handler)


class Registration(NamedTuple):
    """One registered name: the handler and its delivery options."""

    fn: Handler
    #: Tasks per handler call (batch delivery), or None for one at a time.
    batch: int | None = None
    #: A resource declared in the group's `resources` that each call draws from.
    resource: str | None = None


@dataclass(frozen=True)
class HandlerSpec:
    """A resolved handler, ready for the SDK worker's `register`."""

    name: str
    fn: Handler
    batch: int | None = None
    resource: str | None = None
    #: The `module:attribute` it was found through, for error messages.
    source: str = ""


class HandlerError(CairnQError):
    """A handler path that cannot be imported or does not hold handlers."""

    def __init__(self, spec: str, message: str) -> None:
        self.spec = spec
        super().__init__(f"{spec}: {message}")


def _name_of(fn: Handler) -> str:
    name = getattr(fn, "__name__", "")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"cannot derive a task name from {fn!r}; pass one: @registry.task('x')")
    return name


class TaskRegistry:
    """Handlers for cairnqd to run, declared without a database or a worker.

    The decorators match the public SDK's `Worker.task`, so a handler module reads
    the same under either; the worker itself is built in the child from the config.
    """

    def __init__(self) -> None:
        self._handlers: dict[str, Registration] = {}

    @property
    def handlers(self) -> Mapping[str, Registration]:
        return dict(self._handlers)

    @overload
    def task(self, fn: F, /) -> F: ...

    @overload
    def task(
        self,
        name: str | TaskDef[Any, Any] | None = None,
        /,
        *,
        batch: int | None = None,
        resource: str | None = None,
    ) -> Callable[[F], F]: ...

    def task(
        self,
        name: str | TaskDef[Any, Any] | Handler | None = None,
        /,
        *,
        batch: int | None = None,
        resource: str | None = None,
    ) -> Any:
        """`@registry.task`, `@registry.task("name")`, `@registry.task(name, batch=8)`."""
        if callable(name) and not isinstance(name, TaskDef):
            self.register(_name_of(name), name, batch=batch, resource=resource)
            return name
        explicit = None if name is None else task_name(name)

        def decorator(fn: F) -> F:
            self.register(explicit or _name_of(fn), fn, batch=batch, resource=resource)
            return fn

        return decorator

    def register(
        self, name: str, fn: Handler, *, batch: int | None = None, resource: str | None = None
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a task name must be a non-empty string, got {name!r}")
        # The rule a submit applies to names: no task under any other name can ever
        # exist, so its handler would never run.
        check_text(name, "task name", max_bytes=MAX_TEXT_BYTES)
        if not callable(fn):
            raise ValueError(f"handler for {name!r} is not callable: {fn!r}")
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int)):
            raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
        if batch is not None and batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if batch is not None and batch > MAX_WORKER_COUNT:
            # The worker that runs it refuses more (`Worker.register`): said here, where
            # the registration is, rather than when a daemon child boots.
            raise ValueError(f"batch must be <= {MAX_WORKER_COUNT}, got {batch}")
        if resource is not None and (not isinstance(resource, str) or not resource):
            raise ValueError(f"resource must be a non-empty string, got {resource!r}")
        # The SDK silently keeps the last registration; in a registry assembled from
        # several modules that hides a real mistake, so refuse it.
        if name in self._handlers:
            raise ValueError(f"task {name!r} is already registered")
        self._handlers[name] = Registration(fn, batch, resource)


def _import_attribute(spec: str) -> object:
    module_name, attribute = parse_handler_path(spec)
    try:
        obj: object = importlib.import_module(module_name)
    except Exception as exc:  # an application module may raise anything at import time
        raise HandlerError(spec, f"cannot import {module_name}: {exc!r}") from exc
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise HandlerError(spec, f"{module_name} has no attribute {attribute}") from None
    return obj


def _handler_table(spec: str, obj: object) -> Mapping[str, Any]:
    """The name -> registration mapping of a registry or of a public-SDK Worker.

    The SDK's Worker keeps its registrations in `_handlers` (name -> a record with
    `fn`, `batch` and `resource`). That is a private attribute, so it is read by
    duck typing and reported clearly if a future SDK moves it."""
    if isinstance(obj, TaskRegistry):
        return obj.handlers
    for attribute in ("handlers", "_handlers"):
        table = getattr(obj, attribute, None)
        if isinstance(table, Mapping):
            return table
    raise HandlerError(
        spec,
        f"is a {type(obj).__name__}, not a handler registry: point it at a "
        "cairnqd.registry.TaskRegistry or a cairnq Worker",
    )


def _as_registration(spec: str, name: str, entry: Any) -> Registration:
    if isinstance(entry, tuple) and entry and callable(entry[0]):
        return Registration(*entry[:3])
    fn = getattr(entry, "fn", entry)
    if not callable(fn):
        raise HandlerError(spec, f"handler {name!r} is not callable: {entry!r}")
    return Registration(fn, getattr(entry, "batch", None), getattr(entry, "resource", None))


def resolve_handlers(specs: Iterable[str]) -> dict[str, HandlerSpec]:
    """Import each `module:attribute` and merge their handlers by task name.

    Two registries defining the same name is an error: which one runs would depend
    on the order of a list in a config file."""
    resolved: dict[str, HandlerSpec] = {}
    for spec in specs:
        try:
            table = _handler_table(spec, _import_attribute(spec))
        except ValueError as exc:
            raise HandlerError(spec, str(exc)) from None
        for name, entry in table.items():
            registration = _as_registration(spec, str(name), entry)
            if name in resolved:
                other = resolved[name].source
                raise HandlerError(spec, f"task {name!r} is also defined by {other}")
            resolved[name] = HandlerSpec(name, *registration, source=spec)
    return resolved
