"""Cron expressions as a schedule may write them: five fields or an `@` macro.

The fields are read by `cronsim` (docs/schedules.md, "Which cron library, and why");
this module adds the macros and refuses the six-field form and expressions that can
never fire (`0 0 30 2 *`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from cronsim import CronSim, CronSimError

__all__ = ["MACROS", "CronExpression", "parse_cron"]

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# A leap day repeats every 4 years (8 across a century boundary); a rule that has not
# fired in this long never will.
_PROBE_YEARS = 9


@dataclass(frozen=True)
class CronExpression:
    """A valid cron expression: `text` as written, `fields` the five fields it means."""

    text: str
    fields: tuple[str, str, str, str, str]

    @property
    def five_fields(self) -> str:
        return " ".join(self.fields)

    @property
    def names_its_hours(self) -> bool:
        """True when the hour field is not a wildcard (`*`, `*/n`): such a schedule
        is about wall-clock times, and the DST rules apply to it (see `slots`)."""
        return not self.fields[1].startswith("*")


def _explain(parts: list[str], exc: CronSimError) -> str:
    message = str(exc).lower()
    if message == "bad day-of-month":
        # cronsim says this both for a day outside 1-31 and for a day no listed month
        # has; the second is the one worth naming.
        try:
            CronSim(" ".join([*parts[:3], "*", parts[4]]), datetime(2000, 1, 1, tzinfo=UTC))
        except CronSimError:
            return message
        return "never fires: no month it lists has that day"
    return message


def parse_cron(text: str) -> CronExpression:
    """A `CronExpression`, or ValueError saying what is wrong with `text`."""
    stripped = text.strip()
    if stripped.startswith("@"):
        if stripped.lower() not in MACROS:
            known = ", ".join(MACROS)
            raise ValueError(f"unknown macro {stripped!r} (expected one of {known})")
        expanded = MACROS[stripped.lower()]
    else:
        expanded = stripped
    parts = expanded.split()
    if len(parts) != 5:
        hint = "; seconds are not supported, use every: for that" if len(parts) == 6 else ""
        raise ValueError(
            f"expected 5 fields (minute hour day-of-month month day-of-week) or a macro "
            f"like @daily, got {len(parts)} field{'s' if len(parts) != 1 else ''}{hint}"
        )
    probe = datetime(2000, 1, 1, tzinfo=UTC)
    try:
        iterator = CronSim(expanded, probe)
    except CronSimError as exc:
        raise ValueError(f"{stripped!r}: {_explain(parts, exc)}") from None
    except (ValueError, IndexError) as exc:  # defensive: a parser corner the library missed
        raise ValueError(f"{stripped!r}: not a cron expression ({exc})") from None
    try:
        first = next(iterator)
    except StopIteration:
        first = None
    if first is None or first.year > probe.year + _PROBE_YEARS:
        raise ValueError(f"{stripped!r} never fires (no such date exists)")
    fields = (parts[0], parts[1], parts[2], parts[3], parts[4])
    return CronExpression(text=stripped, fields=fields)
