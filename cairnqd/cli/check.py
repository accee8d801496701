"""`cairnqd check`: what the daemon would find before it starts, without starting it.

Plain `check` validates the config only; `--handlers` imports every group's registries
as a child would; `--connect` runs the daemon's pre-spawn checks (`daemon.preflight`).
Exit 0 when fine, 78 where the daemon would refuse to start, 69 when the database cannot
be reached.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cairnqd.cli import schedules as cli_schedules
from cairnqd.cli.admin import CliError, describe_database, load, pending_migrations, with_store
from cairnqd.cli.fleet import fleet_lines
from cairnqd.config import Config, GroupConfig, format_duration, setting_position
from cairnqd.daemon import exitcodes
from cairnqd.store.factory import missing_sqlite_file

if TYPE_CHECKING:
    from cairnqd.cli.admin import Subparsers
    from cairnqd.daemon.parent.preflight import Preflight

__all__ = ["add_parser", "cmd_check", "estimate_series"]

# `check` warns above this many metric series: past it, scrapes get slow and
# Prometheus memory grows with every label combination.
_SERIES_WARNING = 5000


def queues_of(config: Config) -> list[str]:
    return list(dict.fromkeys(q for g in config.groups.values() for q in g.queues))


def estimate_series(config: Config, task_names: int | None = None) -> int:
    """Metric series this config produces, for `check`'s cardinality warning. Counts
    configured queues only; `task_name_label` multiplies the task counters by the
    handler count when known (`--handlers`), else by 1."""
    metrics = config.metrics
    per_name = (task_names or 1) if metrics.task_name_label else 1

    def histogram(buckets: Sequence[float]) -> int:
        return len(buckets) + 3  # each bound, +Inf, _sum, _count

    # started, succeeded, failed by 4 reasons, retried, canceled
    task_counters = (1 + 1 + 4 + 1 + 1) * per_name
    per_queue = (
        5 + 1 + 1  # tasks by status, oldest queued age, expired leases
        + task_counters
        + histogram(metrics.duration_buckets) + histogram(metrics.wait_buckets)
        + 4  # lease recoveries by reason
    )  # fmt: skip
    per_group = 4 + 1 + 9 + 3  # children by state, desired, restarts by reason, group state
    slots = sum(g.processes for g in config.groups.values())  # RSS per child
    # db up/duration/scrape errors, db errors (3 components by 4 kinds), purge runs,
    # failures and last success, reload success and time, generation, build info
    fixed = 3 + 12 + 3 + 2 + 1 + 1
    queues, groups, rules = len(queues_of(config)), len(config.groups), len(config.retention.rules)
    return queues * per_queue + groups * per_group + slots + rules + fixed


def _describe_group(group: GroupConfig) -> str:
    return (
        f"group {group.name}: processes {group.processes}, concurrency {group.concurrency}, "
        f"queues {', '.join(group.queues)}"
    )


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def cmd_check(args: argparse.Namespace) -> int:
    # Here, not at the top: other commands need not import the checks.
    from cairnqd.daemon.parent.preflight import Preflight, check_handlers, run_preflight

    config = load(args.config)
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    report, task_names = Preflight(), None
    registered: dict[str, set[str]] | None = None
    if args.connect:
        report = run_preflight(config, handlers=False)
        _check_ports(args.config, config, report)
    if args.handlers or args.connect:
        registered = check_handlers(config, report)
        task_names = len(set().union(*registered.values()))
    verdict = "FAILED" if report.problems else "OK"
    groups, queues = len(config.groups), len(queues_of(config))
    print(
        f"{args.config}: {verdict} ({_plural(groups, 'group')}, {_plural(queues, 'queue')}, "
        f"{config.database.backend})"
    )
    _print_details(config, report, task_names, connected=args.connect)
    schedule_lines, schedule_warnings = cli_schedules.check_lines(config, registered)
    for line in schedule_lines:
        print(line)
    if args.connect:
        _print_fleet(config, report)
    checked = ["the config"]
    if task_names is not None:
        checked.append("handler imports")
    if args.connect:
        checked.append("the database")
        print(f"checked: {', '.join(checked)}")
    else:
        print(f"checked: {', '.join(checked)}; the database was not contacted (--connect)")
    for finding in report.warnings:
        print(f"warning: {finding}", file=sys.stderr)
    for unhandled in schedule_warnings:
        print(f"warning: {unhandled}", file=sys.stderr)
    if report.problems:
        problems = [str(p) for p in report.problems]
        noun = _plural(len(problems), "problem")
        raise CliError(
            exitcodes.CONFIG, f"{args.config}: {noun}; cairnqd would not start", problems
        )
    if report.unreachable:
        raise CliError(exitcodes.UNAVAILABLE, f"{args.config}: the database cannot be reached")
    return exitcodes.OK


def _check_ports(config_path: str, config: Config, report: Preflight) -> None:
    """Bind the metrics and dashboard addresses for a moment, as `run` will: a port
    another program holds stops the daemon at start (exit 78). Not while a daemon runs
    this config: it holds them itself, and a reload keeps its sockets."""
    # Here, as the checks are: other commands need not import the metrics server.
    from cairnqd.daemon.parent.metrics.server import bind_reason
    from cairnqd.daemon.parent.statefile import StateFile, state_path

    statefile = StateFile(state_path(config_path, config.runtime_dir))
    if statefile.locked_by_other():
        return
    for key, listen in (
        ("metrics.listen", config.metrics.listen),
        ("dashboard.listen", config.dashboard.listen),
    ):
        if listen is None or listen.port == 0:
            continue
        where = setting_position(config_path, tuple(key.split(".")))
        at = f" (at {where})" if where else " (its default)"
        try:
            family, _, _, _, address = socket.getaddrinfo(
                listen.host, listen.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                # As the daemon's HTTP servers do: a port in TIME_WAIT is free to them.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
        except OSError as exc:  # socket.gaierror included
            report.add("problem", key, f"cannot bind {listen}{at}: {bind_reason(exc)}")


def _print_fleet(config: Config, report: Preflight) -> None:
    """The daemons live on the database, when it exists and answered the checks."""
    if report.problems or report.unreachable:
        return
    if missing_sqlite_file(config.database) is not None:
        print("fleet: none yet (the database does not exist)")
        return
    # A check writes nothing: with migrations pending (which `run` would apply on
    # SQLite) the tables the fleet lives in may not exist yet, so they are not read.
    if pending_migrations(config):
        print("fleet: not read (migrations pending)")
        return
    print("fleet (the daemons on this database now):")
    for line in fleet_lines(with_store(config, lambda store: store.fleet.live(), migrate=False)):
        print(f"  {line}")
    limits = config.flow_limits()
    if limits:
        bypasses = with_store(config, lambda s: s.limit_table.bypassing(limits), migrate=False)
        for bypass in bypasses:
            print(f"warning: {bypass.describe()}", file=sys.stderr)


def _print_details(
    config: Config, report: Preflight, task_names: int | None, *, connected: bool
) -> None:
    if not connected:
        print(f"database: {describe_database(config)} (not contacted)")
    for finding in report.findings:
        if finding.level == "ok" and finding.subject != "handlers":
            print(finding)
    for group in config.groups.values():
        print(_describe_group(group))
    for finding in report.findings:
        if finding.level == "ok" and finding.subject == "handlers":
            print(finding.text)
    rules = config.retention.rules
    every = format_duration(config.retention.interval)
    described = "; ".join(r.describe() for r in rules) if rules else "off (rules: [])"
    print(f"retention: every {every}: {described}")
    listen = config.metrics.listen
    series = estimate_series(config, task_names)
    print(f"metrics: {listen if listen is not None else 'off'}, ~{series} series")
    if series > _SERIES_WARNING:
        message = f"~{series} metric series; check metrics.task_name_label and the queues"
        print(f"warning: {message}", file=sys.stderr)


# `cairnqd check --help` describes the command in full.
_DESCRIPTION = """\
Plain `check` validates the config through the same `load_config` the
daemon and its reload use, and reads nothing else: it says so on its last line, and
never calls a database it did not contact OK. `--handlers` imports every group's
registries in a process set up as a child is; `--connect` also contacts the database
and runs the daemon's own pre-spawn checks (`daemon.preflight`): reachability, pending
migrations, the installation and protocol, the Postgres connection budget. So
`check --connect` passes exactly when `cairnqd run` would get as far as spawning."""


def add_parser(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check",
        parents=parents,
        help="validate the config (and more, with --handlers or --connect)",
        description=_DESCRIPTION,
    )
    p.add_argument(
        "--handlers",
        action="store_true",
        help="also import every group's handler registries, as a child would",
    )
    p.add_argument(
        "--connect",
        action="store_true",
        help="also contact the database: reachability, pending migrations, the protocol "
        "and the Postgres connection budget (implies --handlers)",
    )
    p.set_defaults(func=cmd_check)
