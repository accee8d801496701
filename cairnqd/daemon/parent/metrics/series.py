"""The series book: which label values each labelled family has in use.

prometheus_client can remove a series only by its full label values, so dropping a
queue, group or rule on reload needs a record of every combination created; the book
also caches the labelled children that the hot path (task events) updates.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol


class Labelled(Protocol):
    """What the book needs of a labelled family: a prometheus_client metric, or our
    `BucketHistogram`."""

    def labels(self, *values: str) -> Any: ...

    def remove(self, *values: str) -> None: ...


class SeriesBook:
    """Label values in use per labelled metric, so a dropped queue, group or rule can
    have every series `remove()`d (prometheus_client offers no partial match)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[int, tuple[Labelled, tuple[str, ...], set[tuple[str, ...]]]] = {}
        # The labelled child per (metric, values): task events hit the same few series
        # thousands of times a second, and `labels()` re-validates every call.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: Labelled, labelnames: Sequence[str], *values: str) -> Any:
        found = self._children.get((id(metric), values))
        if found is not None:
            return found
        with self._lock:
            entry = self._seen.setdefault(id(metric), (metric, tuple(labelnames), set()))
            entry[2].add(values)
            found = self._children[(id(metric), values)] = metric.labels(*values)
        return found

    def forget(self, metric: Labelled) -> None:
        with self._lock:
            self._seen.pop(id(metric), None)
            for key in [k for k in self._children if k[0] == id(metric)]:
                del self._children[key]

    def remove(self, metric: Labelled, *values: str) -> None:
        """Drop one series (and the cached child that would otherwise outlive it)."""
        with self._lock:
            self._children.pop((id(metric), values), None)
            entry = self._seen.get(id(metric))
            if entry is not None:
                entry[2].discard(values)
            with contextlib.suppress(KeyError):
                metric.remove(*values)

    def remove_where(self, label: str, keep: Callable[[str], bool]) -> None:
        """Remove every series whose `label` value fails `keep`."""
        with self._lock:
            for metric, names, seen in self._seen.values():
                if label not in names:
                    continue
                index = names.index(label)
                for values in [v for v in seen if not keep(v[index])]:
                    seen.discard(values)
                    self._children.pop((id(metric), values), None)
                    with contextlib.suppress(KeyError):
                        metric.remove(*values)
