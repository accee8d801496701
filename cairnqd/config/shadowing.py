"""Purge rules that can never fire, and rules whose overlap shortens a retention.

A task is kept for the shortest rule that matches it and filters cannot exclude, so
a rule inside a shorter one is dead: an error, not a warning."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cairnqd.config.checks import Checks
from cairnqd.config.sections import PurgeRule
from cairnqd.config.units import format_duration
from cairnqd.config.yamlload import YamlPath, format_path


def _covers(a: PurgeRule, b: PurgeRule) -> bool:
    """Every task `b` matches, `a` matches too."""
    pairs = zip(a.filters(), b.filters(), strict=True)
    return all(fa is None or fa == fb for (_, fa), (_, fb) in pairs)


def _overlaps(a: PurgeRule, b: PurgeRule) -> bool:
    pairs = zip(a.filters(), b.filters(), strict=True)
    return all(fa is None or fb is None or fa == fb for (_, fa), (_, fb) in pairs)


def _shadows(a: PurgeRule, i: int, b: PurgeRule, j: int) -> bool:
    """Rule i deletes everything rule j would, no later than j would. Of two
    identical rules, the later one is the redundant one."""
    if not _covers(a, b) or a.older_than > b.older_than:
        return False
    return a.older_than < b.older_than or not _covers(b, a) or i < j


def check_rule_shadowing(ck: Checks, built: Sequence[Any], path: YamlPath) -> None:
    """A task's retention is the minimum over matching rules, and
    filters cannot exclude, so a rule inside a shorter one can never fire. `built`
    holds INVALID for the rules that failed their own checks: the others are compared
    all the same, each under its own index."""
    rules = {i: rule for i, rule in enumerate(built) if isinstance(rule, PurgeRule)}
    for j, rule in rules.items():
        shadow = next((i for i, a in rules.items() if i != j and _shadows(a, i, rule, j)), None)
        if shadow is not None:
            other = format_path((*path, shadow))
            ck.error_at(
                (*path, j),
                f"never deletes anything: {other} ({rules[shadow].describe()}) "
                "removes those tasks first",
            )
            continue
        for i, earlier in ((i, a) for i, a in rules.items() if i < j):
            nested = _covers(earlier, rule) or _covers(rule, earlier)
            partial = _overlaps(earlier, rule) and not nested
            if partial and earlier.older_than != rule.older_than:
                _warn_overlap(ck, path, (i, earlier), (j, rule))


def _warn_overlap(
    ck: Checks, path: YamlPath, a: tuple[int, PurgeRule], b: tuple[int, PurgeRule]
) -> None:
    """Tasks matching both rules get the shorter retention; say so at the longer one,
    whose author probably expected otherwise."""
    (longer_index, _), (shorter_index, shorter) = sorted(
        (a, b), key=lambda pair: pair[1].older_than, reverse=True
    )
    other = format_path((*path, shorter_index))
    ck.warn_at(
        (*path, longer_index),
        f"tasks also matched by {other} ({shorter.describe()}) are deleted after "
        f"{format_duration(shorter.older_than)}",
    )
