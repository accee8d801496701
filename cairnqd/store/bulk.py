"""Long `submit_many` lists on both dialects: runs of keyless items written as rows a
step at a time, and keyed items each on the keyed path, all in the caller's transaction
(docs/architecture.md, "Long submit_many lists").
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from cairnqd.models import Task
from cairnqd.store.arguments import Params
from cairnqd.store.base import prepare_items

#: Items `[start, stop)` of the list, all keyless, inserted: their tasks in list order.
InsertRun = Callable[[int, int], Awaitable[list[Task]]]
SubmitKeyed = Callable[[Params], Awaitable[Task]]


async def insert_in_runs(
    items: Sequence[Mapping[str, Any]],
    ids: Sequence[str],
    insert_run: InsertRun,
    submit_keyed: SubmitKeyed,
) -> list[Task]:
    """Every item of `items` (item i under `ids[i]`) through `insert_run` or
    `submit_keyed`, in list order; the tasks in list order."""
    out: list[Task] = []
    runs = itertools.groupby(range(len(items)), key=lambda index: _keyed(items[index]))
    for keyed, run in runs:
        indexes = list(run)
        start, stop = indexes[0], indexes[-1] + 1
        if keyed:
            for params in prepare_items(items, ids, start, stop):
                out.append(await submit_keyed(params))
        else:
            out += await insert_run(start, stop)
    return out


def _keyed(item: Any) -> bool:
    try:
        return item.get("key") is not None
    except AttributeError:  # not a mapping: prepare_items says so, with its index
        return False


__all__ = ["InsertRun", "SubmitKeyed", "insert_in_runs"]
