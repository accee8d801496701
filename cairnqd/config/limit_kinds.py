"""How the `limits:` section is read: a rate, a partition field, the name globs, and
the checks across a limit's keys (`finish_limit`). The meaning of each lives in
`cairnqd.limits`, whose parsers give the errors a user sees."""

from __future__ import annotations

from typing import Any

from cairnqd.config.checks import Checks
from cairnqd.config.kinds import INVALID, ParsedStrKind, StrKind
from cairnqd.config.yamlload import YamlPath
from cairnqd.limits import parse_field, parse_rate

NAME_GLOB = StrKind(r"[A-Za-z0-9_.:*?-]+", "a task name or a glob of one with * and ?")


class RateKind(ParsedStrKind):
    expected = "a rate like 100/10s"

    def parse(self, text: str) -> None:
        parse_rate(text, "rate")


class FieldKind(ParsedStrKind):
    expected = "a payload field like payload.tenant"

    def parse(self, text: str) -> None:
        parse_field(text, "partition_by")


def finish_limit(ck: Checks, v: dict[str, Any], path: YamlPath) -> dict[str, Any]:
    if not v["queues"] and not v["names"]:
        ck.error_at(path, "say which tasks it covers: set queues, names, or both")
        v["queues"] = INVALID
    if v["concurrency"] is None and v["rate"] is None:
        ck.error_at(path, "set concurrency, rate, or both")
        v["concurrency"] = INVALID
    return v
