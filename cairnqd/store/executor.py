"""The seam between a dialect and everything above it: `Executor` and `Session`.

A dialect (store/sqlite/, store/postgres/) supplies these few primitives and nothing
else is dialect-specific: `TaskStore` writes each protocol operation with them once,
and the table classes of store/tables/ (pauses, bulk actions, dashboard reads, daemon
reports, schedules) take an `Executor` and run their statements, named as the files of
protocol/, through it. tests/store/test_executor.py is the suite every dialect passes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from cairnqd._protocol import Dialect, Statement
from cairnqd.store.arguments import Params

if TYPE_CHECKING:
    from cairnqd.models import Task

Row = Mapping[str, Any]
T = TypeVar("T")


class Session(Protocol):
    """Statements inside one write transaction."""

    async def fetch(
        self, op: str, params: Params, supplied: frozenset[str] = frozenset()
    ) -> list[Row]:
        """Run statement `op` (a protocol/ file name, `extensions/...` for ours) with
        `params`; its rows. `supplied` names the optional filters the caller bound;
        a filter left out of it is dropped from the statement."""
        ...

    async def fetch_statement(self, stmt: Statement, params: Params) -> list[Row]:
        """Run `stmt`, a statement the caller composed from a protocol/ file
        (`_protocol.composed`); its rows."""
        ...


class Executor(Protocol):
    """What code above a dialect runs its statements with."""

    @property
    def dialect(self) -> Dialect: ...

    async def fetch(
        self, op: str, params: Params, supplied: frozenset[str] = frozenset()
    ) -> list[Row]:
        """One statement outside an explicit transaction (the dialect may group-commit
        a write with others)."""
        ...

    async def scan(
        self,
        op: str,
        params: Params,
        supplied: frozenset[str],
        convert: Callable[[list[Row]], list[T]],
    ) -> list[T]:
        """A read whose cost grows with the table, converted to values without
        holding the event loop for the whole of it."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[Session]:
        """A write transaction: committed when the block ends, rolled back if it
        raises, and let finish as a whole by a store that is closing."""
        ...

    async def replayable(self, work: Callable[[Session], Awaitable[T]]) -> T:
        """`work` in a write transaction, run once more reading undecodable text as
        markers when a row it reads back holds text the driver refuses."""
        ...

    def operation(self) -> AbstractContextManager[None]:
        """Bracket several statements as one operation a closing store lets finish."""
        ...

    def tasks(self, rows: Sequence[Row]) -> list[Task]:
        """Rows of `cairnq_tasks` as tasks, decoded as this dialect's driver needs."""
        ...


class UserSession(Protocol):
    """The caller's side of a transaction it shares with a settlement (`complete_in`,
    `ctx.succeed_in`): its own statements in the driver's SQL, values as `$1`, `$2`."""

    async def query(self, text: str, values: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Run `text` with `values`; its rows (none for a statement without any)."""
        ...

    async def execute(self, sql: str) -> None:
        """Run `sql` (which may hold several statements) without values."""
        ...


UserWrite = Callable[[UserSession], Awaitable[Any]]
"""The caller's writes in a shared transaction; what it returns becomes the result."""

__all__ = ["Executor", "Row", "Session", "UserSession", "UserWrite"]


def unsupported_tx(tx: object, wanted: str) -> TypeError:
    """The error for a `tx=` this dialect cannot write through, naming what was given."""
    kind = f"{type(tx).__module__}.{type(tx).__qualname__}"
    return TypeError(
        f"tx= must be {wanted}; got a {kind}. Pass the connection (or transaction) your "
        "own writes go through, on this store's database (docs/transactions.md)"
    )
