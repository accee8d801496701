"""From what an application holds to the driver connection a `tx=` writes through.

Applications hold their transaction in many shapes: a SQLAlchemy `Session`,
`Connection`, `AsyncSession` or `AsyncConnection`, Django's connection inside
`transaction.atomic()`, or the driver's connection itself; a handler holds the
session `ctx.succeed_in` gives its write. Each is unwrapped here to
the DB-API connection under it (psycopg 3 or sqlite3), which a dialect then writes
through (store/sqlite/callertx.py, store/postgres/callertx.py). No library is
imported: a shape is recognised by its type's module, so none of them is a
dependency.
"""

from __future__ import annotations

from collections.abc import Coroutine
from contextvars import ContextVar
from typing import Any, TypeVar, cast

T = TypeVar("T")


def _module(tx: object) -> str:
    return type(tx).__module__


def is_async_shape(tx: object) -> bool:
    """An asyncio-only shape (SQLAlchemy's asyncio extension): `await submit(...)`."""
    return _module(tx).startswith("sqlalchemy.ext.asyncio")


async def driver_connection(tx: object) -> object:
    """The driver connection under `tx`, or `tx` itself when it is none of the shapes
    above (the dialect then accepts it or names it in its TypeError). ValueError for a
    Django atomic block already marked for rollback."""
    module = _module(tx)
    if module.startswith("cairnqd.") and type(tx).__name__ == "UserSession":
        # `ctx.succeed_in`'s session: the settlement's own transaction.
        return tx.connection  # type: ignore[attr-defined]
    if module.startswith("sqlalchemy.ext.asyncio"):
        return await _sqlalchemy_async(tx)
    if module.startswith("sqlalchemy."):
        return sync_driver_connection(tx)
    if module.startswith("django."):
        return _django(tx)
    return tx


def sync_driver_connection(tx: object) -> object:
    """`driver_connection` for the sync shapes: no await needed."""
    module = _module(tx)
    if module.startswith("sqlalchemy.orm"):
        tx = tx.connection()  # type: ignore[attr-defined]  # the Session's, begun if need be
        module = _module(tx)
    if module.startswith("sqlalchemy.engine"):
        if getattr(tx, "closed", False) or getattr(tx, "invalidated", False):
            raise ValueError("tx= is a closed or invalidated SQLAlchemy Connection")
        raw: Any = tx.connection  # type: ignore[attr-defined]
        return raw.dbapi_connection
    if module.startswith("django."):
        return _django(tx)
    return tx


async def _sqlalchemy_async(tx: Any) -> object:
    if hasattr(tx, "sync_session"):  # AsyncSession: its connection, begun if need be
        tx = await tx.connection()
    raw = await tx.get_raw_connection()
    return raw.driver_connection


def _django(tx: Any) -> object:
    """Django's connection (`django.db.connection`, or `connections[alias]`)."""
    if getattr(tx, "needs_rollback", False):
        raise ValueError(
            "tx= is a Django connection whose atomic block is marked for rollback (an "
            "exception was caught inside it): nothing can commit with it"
        )
    tx.ensure_connection()
    return tx.connection


#: Set while `complete_now` drives a submit: whatever it needs must come without waiting.
_driven: ContextVar[bool] = ContextVar("cairnqd_sync_submit", default=False)


def in_sync_submit() -> bool:
    """Whether this code runs inside a sync submit (`submit_sync`), where nothing may
    wait on the event loop, even if one runs in this thread."""
    return _driven.get()


def complete_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` to its end in this thread, without an event loop: for a sync
    submit through a sync connection, whose every step returns at once. RuntimeError
    if it had to wait for something (a step that needs the event loop)."""
    token = _driven.set(True)
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    finally:
        _driven.reset(token)
    coroutine.close()
    raise RuntimeError(
        "this submit needs an event loop (the store's own connection, or the queue-depth "
        "limit's check): call `await client.submit(...)` from async code instead"
    )
