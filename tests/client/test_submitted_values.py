"""What `submit` and `submit_many` hand back is what was stored: the payload and metadata
as JSON reads them back, on both dialects, keyed or not (docs/protocol.md §4.4: tuples
become arrays and non-string keys strings).

A keyless submit used to hand back the caller's own objects instead, so
`(await submit("t", {1: "a"})).payload` had the key 1 while `get` (and a keyed submit,
and the public SDK's submit) had "1", and a tuple stayed a tuple."""

from __future__ import annotations

import enum
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.store.base import TaskStore


class Colour(enum.IntEnum):
    RED = 1


VALUES: list[tuple[str, Any, Any]] = [
    ("int-key", {1: "a"}, {"1": "a"}),
    ("none-and-float-keys", {None: 1, 1.5: 2}, {"null": 1, "1.5": 2}),
    ("tuple-inside", {"ids": (1, 2)}, {"ids": [1, 2]}),
    ("tuple-top", (1, "x"), [1, "x"]),
    ("nested-int-key", {"a": [{2: True}]}, {"a": [{"2": True}]}),
    ("enum-value", {"c": Colour.RED}, {"c": 1}),
    ("plain", {"a": 1, "b": [1, 2], "c": {"d": None}}, {"a": 1, "b": [1, 2], "c": {"d": None}}),
    ("scalar", "text", "text"),
]


def _same(got: Any, expected: Any) -> bool:
    """Equal, and of the same JSON types all the way down (1 == Colour.RED, (1,) != [1])."""
    if type(got) is not type(expected):
        return False
    if isinstance(expected, dict):
        # Key order aside: Postgres jsonb keeps its own.
        return set(got) == set(expected) and all(_same(got[k], expected[k]) for k in expected)
    if isinstance(expected, list):
        return len(got) == len(expected) and all(map(_same, got, expected))
    return bool(got == expected)


@pytest.mark.parametrize(
    ("value", "stored"), [case[1:] for case in VALUES], ids=[case[0] for case in VALUES]
)
async def test_a_submit_hands_back_the_stored_values(
    store: TaskStore, value: Any, stored: Any
) -> None:
    client = CairnQ(store)
    made = [
        await client.submit("t", value, metadata=value),
        await client.submit("t", value, metadata=value, key="k1"),
        *await client.submit_many(
            [
                {"name": "t", "payload": value, "metadata": value},
                {"name": "t", "payload": value, "metadata": value, "key": "k2"},
            ]
        ),
    ]
    for task in made:
        again = await client.get(task.id)
        assert again is not None
        assert _same(again.payload, stored) and _same(again.metadata, stored)
        assert _same(task.payload, stored), (task.payload, stored)
        assert _same(task.metadata, stored), (task.metadata, stored)
