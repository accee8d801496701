"""Schedule rules, independent of any worker or daemon: cron and `every:` slots in a
time zone, and the misfire plan for the slots a scheduler finds due.

The daemon runs schedules from its config (cairnqd/daemon/parent/scheduler.py); this package
only computes, with the time passed in, so anyone can ask when a rule fires."""

from cairnqd.schedules.cron import MACROS, CronExpression, parse_cron
from cairnqd.schedules.misfire import POLICIES, DuePlan, Misfire, plan_due
from cairnqd.schedules.slots import CronSlots, EverySlots, Slots, from_ms, to_ms

__all__ = [
    "MACROS",
    "POLICIES",
    "CronExpression",
    "CronSlots",
    "DuePlan",
    "EverySlots",
    "Misfire",
    "Slots",
    "from_ms",
    "parse_cron",
    "plan_due",
    "to_ms",
]
