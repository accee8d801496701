"""`ClaimPlan.one_draw` (cairnqd/_claims.py) names the draw the plan makes exactly when
the plan makes one, with what it would pass: the store then sends the claim in one flight
instead of running the plan, so a mismatch would claim more or less than the plan."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from cairnqd._claims import ClaimPlan, ClaimSource
from cairnqd.store.base import OneDraw, Row

sources = st.builds(
    ClaimSource,
    names=st.lists(st.sampled_from(["a", "b", "c"]), max_size=2, unique=True),
    batch=st.integers(1, 4),
    resource=st.sampled_from([None, None, "gpu"]),
)


@given(
    ordered=st.lists(sources, max_size=3),
    free=st.integers(-1, 8),
    ahead=st.integers(0, 8),
    capacity=st.integers(0, 3),
    in_use=st.integers(0, 3),
)
def test_one_draw_is_the_plans_only_draw(
    ordered: list[ClaimSource], free: int, ahead: int, capacity: int, in_use: int
) -> None:
    plan = ClaimPlan(ordered, free, ahead, {"gpu": capacity}, {"gpu": in_use})
    made: list[OneDraw] = []

    async def draw(names: Sequence[str] | None, limit: int, ready: int | None = None) -> list[Row]:
        # The store's draw takes nothing for no names or no room (TaskStore._claim_in).
        if limit > 0 and (names is None or names):
            made.append(OneDraw(names, limit))
        return []

    asyncio.run(plan(draw))
    offered = plan.one_draw()
    if offered is not None:
        assert made == [offered]
    else:
        # No offer: the plan draws otherwise (several draws, a resource) or not at all.
        assert len(made) != 1 or ordered[0].resource is not None or len(ordered) > 1
