"""What one claim transaction draws, given the registered handlers.

A claim makes one draw per *source*: every name with `batch=` or `resource=` is its
own source, the plain names share one (the only source prefetch feeds). The worker
rotates the order from claim to claim, so when the free call slots run out before the
last draw, no source starves. Quotas count handler calls, not tasks (a batch source
draws `batch` tasks per call), and a resource source never draws past the capacity
that calls in flight and this claim's earlier draws leave.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cairnqd._handlers import RegisteredHandler
from cairnqd.store.base import ClaimDraw, OneDraw, Row


@dataclass
class ClaimSource:
    """One claim draw per poll: the names it covers and their batch size."""

    names: list[str]
    batch: int
    resource: str | None

    @property
    def shared(self) -> bool:
        """The source of plain handlers (no batch, no resource): the one prefetch feeds."""
        return self.batch == 1 and self.resource is None


def claim_sources(handlers: Mapping[str, RegisteredHandler]) -> list[ClaimSource]:
    shared = [h.name for h in handlers.values() if h.batch is None and not h.resource]
    sources = [ClaimSource(shared, 1, None)] if shared else []
    for h in handlers.values():
        if h.batch is not None or h.resource:
            sources.append(ClaimSource([h.name], h.batch or 1, h.resource))
    return sources


@dataclass
class ClaimPlan:
    """The draws of one claim, run inside `TaskStore.claim_session` as its `plan`."""

    ordered: list[ClaimSource]
    free: int  # free call slots
    ahead: int  # plain tasks to claim beyond them (prefetch)
    capacity: Mapping[str, int]  # declared resources
    in_use: Mapping[str, int]  # the worker's live count of calls per resource

    async def __call__(self, draw: ClaimDraw) -> list[Row]:
        remaining = self.free
        taken: dict[str, int] = {}
        claimed: list[Row] = []
        for source in self.ordered:
            quota = remaining + (self.ahead if source.shared else 0)
            if quota <= 0:
                continue
            if source.resource is not None:
                headroom = (
                    self.capacity[source.resource]
                    - self.in_use[source.resource]
                    - taken.get(source.resource, 0)
                )
                quota = min(quota, headroom)
            if quota <= 0:
                continue
            rows = await draw(source.names, source.batch * quota, source.batch * remaining)
            calls = -(-len(rows) // source.batch)
            remaining = max(0, remaining - calls)
            if source.resource is not None:
                taken[source.resource] = taken.get(source.resource, 0) + calls
            claimed.extend(rows)
        return claimed

    def one_draw(self) -> OneDraw | None:
        """The draw `__call__` makes when it makes exactly one, with no resource's
        capacity to weigh: the store may then send the claim in one flight."""
        if len(self.ordered) != 1:
            return None
        source = self.ordered[0]
        quota = self.free + (self.ahead if source.shared else 0)
        if source.resource is not None or quota <= 0 or not source.names:
            return None
        return OneDraw(source.names, source.batch * quota)
