"""Messages of the public API pinned against the public cairnq SDK itself: the same
bad call raises the same exception with the same words in both."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import cairnq
import pytest

import cairnqd
from cairnqd.store.sqlite import SQLiteStore


def _message(call: Callable[[], Any]) -> tuple[type[BaseException], str]:
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


def _ours(tmp_path: Path, **kw: Any) -> cairnqd.Worker:
    return cairnqd.Worker(SQLiteStore(str(tmp_path / "ours.db")), ["default"], **kw)


def _theirs(tmp_path: Path, **kw: Any) -> Any:
    return cairnq.Worker(cairnq.SQLiteStore(str(tmp_path / "theirs.db")), ["default"], **kw)


async def noop(ctx: Any) -> None:
    return None


@pytest.mark.parametrize("batch", [0, -3])
def test_a_batch_below_one(tmp_path: Path, batch: int) -> None:
    ours = _message(lambda: _ours(tmp_path).task("t", batch=batch)(noop))
    theirs = _message(lambda: _theirs(tmp_path).task("t", batch=batch)(noop))
    assert ours == (ValueError, f"batch must be >= 1, got {batch}")
    assert ours[1] == theirs[1] and issubclass(theirs[0], ValueError)


@pytest.mark.parametrize("capacity", [0, -1])
def test_a_resource_ceiling_below_one(tmp_path: Path, capacity: int) -> None:
    ours = _message(lambda: _ours(tmp_path, resources={"gpu": capacity}))
    theirs = _message(lambda: _theirs(tmp_path, resources={"gpu": capacity}))
    assert ours == (ValueError, f"resources['gpu'] must be >= 1, got {capacity}")
    assert ours[1] == theirs[1] and issubclass(theirs[0], ValueError)


@pytest.mark.parametrize("max_run_ms", [0, -5])
def test_a_max_run_of_zero_or_less(tmp_path: Path, max_run_ms: int) -> None:
    ours = _message(lambda: _ours(tmp_path, max_run_ms=max_run_ms))
    theirs = _message(lambda: _theirs(tmp_path, max_run_ms=max_run_ms))
    assert ours == (ValueError, f"max_run_ms must be > 0, got {max_run_ms}")
    assert ours[1] == theirs[1] and issubclass(theirs[0], ValueError)
