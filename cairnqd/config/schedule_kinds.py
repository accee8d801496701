"""How a schedule's settings are read: the cron rule, the time zone, the misfire
policy, the payload, and the checks across them (`finish_schedule`)."""

from __future__ import annotations

import json
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cairnqd.config.checks import Checks
from cairnqd.config.kinds import INVALID, Invalid, Kind, ParsedStrKind, show_node, show_value
from cairnqd.config.yamlload import (
    YamlMapping,
    YamlNode,
    YamlPath,
    YamlScalar,
    to_plain,
)
from cairnqd.schedules import POLICIES, Misfire, parse_cron
from cairnqd.schedules.misfire import COUNT_CAP

#: The most missed slots `catch_up` may fire: as many as the scheduler counts per look.
#: A larger N could never be reached, and past sys.maxsize the plan would fail outright.
MAX_CATCH_UP = COUNT_CAP

#: A payload bigger than this as JSON is refused at load rather than at every slot.
_MAX_PAYLOAD_BYTES = 64 * 1024


class CronKind(ParsedStrKind):
    expected = "a cron expression like '0 3 * * *' or a macro like @daily"

    def parse(self, text: str) -> None:
        parse_cron(text)


class TimezoneKind(ParsedStrKind):
    expected = "an IANA time zone like Europe/Berlin"

    def parse(self, text: str) -> None:
        try:
            ZoneInfo(text)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {text!r} (expected an IANA name like Europe/Berlin)"
            ) from None


class MisfireKind(Kind):
    expected = "skip, once, or {catch_up: N}"
    bound = f"N from 1 to {MAX_CATCH_UP}"

    def check(self, ck: Checks, node: YamlNode, path: YamlPath) -> Any:
        if isinstance(node, YamlScalar):
            if node.value == "catch_up":
                raise Invalid("catch_up needs a limit: write misfire: {catch_up: 10}")
            if node.value == "skip":
                return Misfire("skip")
            if node.value == "once":
                return Misfire("once")
            raise self.fail(show_value(node.value), f" (policies: {', '.join(POLICIES)})")
        if not isinstance(node, YamlMapping):
            raise self.fail(show_node(node))
        keys = list(node.entries)
        if keys != ["catch_up"]:
            raise self.fail("a mapping with " + (", ".join(map(repr, keys)) or "no keys"))
        entry = node.entries["catch_up"]
        limit = entry.node.value if isinstance(entry.node, YamlScalar) else None
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise Invalid(
                f"expected an integer ≥ 1, got {show_node(entry.node)}", entry.node, ("catch_up",)
            )
        if limit > MAX_CATCH_UP:
            message = f"expected an integer from 1 to {MAX_CATCH_UP}, got {limit}"
            raise Invalid(message, entry.node, ("catch_up",))
        return Misfire("catch_up", limit)

    def dump(self, value: Any) -> Any:
        assert isinstance(value, Misfire)
        return {"catch_up": value.limit} if value.policy == "catch_up" else value.policy


class PayloadKind(Kind):
    """Any JSON value, written as YAML."""

    expected = "a JSON value"

    def check(self, ck: Checks, node: YamlNode, path: YamlPath) -> Any:
        value = to_plain(node)
        try:
            text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        except ValueError:
            raise Invalid("not a JSON value: NaN and infinities cannot be stored") from None
        try:
            size = len(text.encode())
        except UnicodeEncodeError:  # "\ud800" in a quoted YAML string
            raise Invalid(
                "not a JSON value: a lone UTF-16 surrogate is not valid Unicode text"
            ) from None
        if size > _MAX_PAYLOAD_BYTES:
            raise Invalid(f"larger than {_MAX_PAYLOAD_BYTES // 1024} KiB as JSON")
        return value


def finish_schedule(ck: Checks, v: dict[str, Any], path: YamlPath) -> dict[str, Any]:
    rules = [k for k in ("cron", "every") if v[k] is not None]
    if not rules:
        ck.error_at(path, "set one of cron or every")
        v["cron"] = INVALID
    elif len(rules) == 2:
        ck.error_at((*path, "every"), "cron and every are both set; keep one")
        v["every"] = INVALID
    elif rules == ["every"] and v["timezone"] is not None:
        message = (
            "applies to cron only: every: counts from the Unix epoch; "
            "use cron for a time of day in a zone"
        )
        ck.error_at((*path, "timezone"), message)
        v["timezone"] = INVALID
    return v


def warn_unserved_queues(ck: Checks, schedules: Any, groups: Any) -> None:
    """A schedule whose queue no group here claims: fine when another host serves it,
    a silent pile-up when nobody does."""
    if schedules is INVALID or groups is INVALID:
        return
    served = {queue for group in groups.values() for queue in group.queues}
    for name, schedule in schedules.items():
        if schedule.queue not in served:
            ck.warn_at(
                ("schedules", name, "queue"),
                f"no group in this config claims queue {schedule.queue!r}; its tasks wait "
                "for a worker elsewhere",
            )
