"""The `cairnqd` command: the daemon (`run`, the default) and the operator's tools.

Design note. Every command validates the config through the same
`load_config` the daemon and its reload use, so `check` passes exactly when `run`
would start. Expected failures are one clear line on stderr and a sysexits code
(`exitcodes`); a traceback means a bug (exit 70). argparse's usage exit 2 becomes 64,
which systemd's `RestartPreventExitStatus=` never restarts.

`-c` and `--log-level` are accepted before or after the subcommand
(`cairnqd check -c f` reads as naturally as `cairnqd -c f check`). Database commands
live in `cli_admin`; this file keeps the entry point, the config commands and `reload`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import signal
import sqlite3
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import psycopg
import yaml

from cairnqd import __version__
from cairnqd.cli import admin as cli_admin
from cairnqd.cli import bulk as cli_bulk
from cairnqd.cli import queues as cli_queues
from cairnqd.cli import schedules as cli_schedules
from cairnqd.cli import status as cli_status
from cairnqd.cli import top as cli_top
from cairnqd.cli.admin import CliError, describe_database, duration, load
from cairnqd.config import Config, GroupConfig, format_duration
from cairnqd.config.yamlload import (
    YamlDocument,
    YamlScalar,
    YamlSyntaxError,
    interpolate,
    load_yaml,
)
from cairnqd.daemon import exitcodes
from cairnqd.daemon.statefile import DaemonState, StateFile, StateFileError, state_path
from cairnqd.registry import HandlerError, resolve_handlers

__all__ = ["main"]

ENV_CONFIG = "CAIRNQD_CONFIG"
STORAGE_PROTOCOL_VERSION = 1
_LEVELS = ("debug", "info", "warning", "error", "critical")
# `check` warns above this many metric series: each costs Prometheus memory and scrape time.
_SERIES_WARNING = 5000


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(exitcodes.USAGE, f"{self.prog}: error: {message}\n")


# -- run, check, config dump, version ------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    config = load(args.config)
    if args.log_level:
        # Only for this start: a reload re-reads logging.level from the file.
        level = args.log_level.upper()
        config = dataclasses.replace(
            config, logging=dataclasses.replace(config.logging, level=level)
        )
    from cairnqd.daemon.supervisor import (
        run_daemon,  # the daemon's imports are not every command's cost
    )

    return run_daemon(args.config, config)


def _queues(config: Config) -> list[str]:
    return list(dict.fromkeys(q for g in config.groups.values() for q in g.queues))


def estimate_series(config: Config, task_names: int | None = None) -> int:
    """Metric series this config produces, for `check`'s cardinality
    warning. Counts configured queues only; `task_name_label` multiplies the task
    counters by the handler count when known (`--handlers`), else by 1."""
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
    queues, groups, rules = len(_queues(config)), len(config.groups), len(config.retention.rules)
    return queues * per_queue + groups * per_group + slots + rules + fixed


def _describe_group(group: GroupConfig) -> str:
    return (
        f"group {group.name}: processes {group.processes}, concurrency {group.concurrency}, "
        f"queues {', '.join(group.queues)}"
    )


def _check_handlers(config: Config) -> tuple[int, list[str], list[str]]:
    """Import each distinct registry list once, as a child would. Returns the number
    of task names, a line per group, and the failures among them."""
    names: set[str] = set()
    outcomes: dict[tuple[str, ...], tuple[bool, str]] = {}
    lines: list[str] = []
    failures: list[str] = []
    for group in config.groups.values():
        if group.handlers not in outcomes:
            try:
                handlers = resolve_handlers(group.handlers)
            except HandlerError as exc:
                outcomes[group.handlers] = (False, f"cannot load handlers: {exc}")
            else:
                names.update(handlers)
                listed = ", ".join(sorted(handlers)) or "(none)"
                outcomes[group.handlers] = (True, f"handlers {listed}")
        ok, text = outcomes[group.handlers]
        (lines if ok else failures).append(f"group {group.name}: {text}")
    return len(names), lines, failures


def cmd_check(args: argparse.Namespace) -> int:
    config = load(args.config)
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    task_names, handler_lines, failures = (
        _check_handlers(config) if args.handlers else (None, [], [])
    )
    queues, groups = _queues(config), len(config.groups)
    print(
        f"{args.config}: {'OK' if not failures else 'FAILED'} "
        f"({groups} group{'s' if groups != 1 else ''}, "
        f"{len(queues)} queue{'s' if len(queues) != 1 else ''}, {config.database.backend})"
    )
    print(f"database: {describe_database(config)}")
    for line in [*map(_describe_group, config.groups.values()), *handler_lines]:
        print(line)
    schedule_lines, schedule_warnings = cli_schedules.check_lines(config, handlers=args.handlers)
    for line in schedule_lines:
        print(line)
    for unhandled in schedule_warnings:
        print(f"warning: {unhandled}", file=sys.stderr)
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
    if failures:
        raise CliError(exitcodes.CONFIG, f"{args.config}: handlers failed to load", failures)
    return exitcodes.OK


def cmd_config_dump(args: argparse.Namespace) -> int:
    data = load(args.config).redacted()
    if args.format == "json":
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    return exitcodes.OK


def cmd_version(args: argparse.Namespace) -> int:
    libpq = psycopg.pq.version()
    print(f"cairnqd {__version__}")
    print(f"protocol {STORAGE_PROTOCOL_VERSION}")
    print(f"python {platform.python_version()} ({platform.python_implementation()})")
    print(f"sqlite {sqlite3.sqlite_version}")
    print(f"psycopg {psycopg.__version__} (libpq {libpq // 10000}.{libpq % 10000})")
    return exitcodes.OK


# -- reload --------------------------------------------------------------------------------


def _runtime_dir(config_path: str) -> tuple[str, str]:
    """The config's runtime_dir, read without validating the rest: a broken config
    must still reach the daemon, whose refusal (`reload --wait` exit 78) is how the
    operator learns what is wrong with it. Also a note for "not found" messages when
    the file does not even parse, so the default directory was used."""
    from cairnqd.config import _default_runtime_dir  # the config's own fallback, not a copy

    try:
        root, _ = interpolate(load_yaml(config_path).root, os.environ)
    except (OSError, YamlSyntaxError) as exc:
        note = f" ({config_path} does not parse, so its runtime_dir was not read: {exc})"
        return _default_runtime_dir(os.environ), note
    node = YamlDocument(root).node(("runtime_dir",))
    if isinstance(node, YamlScalar) and isinstance(node.value, str) and node.value:
        return node.value, ""
    return _default_runtime_dir(os.environ), ""


def _no_daemon(message: str) -> CliError:
    return CliError(exitcodes.UNAVAILABLE, message)


def _find_daemon(
    args: argparse.Namespace, statefile: StateFile, note: str
) -> tuple[int, DaemonState | None]:
    """The pid to signal and the state to wait on; CliError(69) if there is no daemon."""
    try:
        state = statefile.read()
    except StateFileError as exc:
        if args.wait is not None or args.pid is None:
            raise _no_daemon(str(exc)) from None
        state = None
    if args.pid is not None:
        if state is not None and state["pid"] != args.pid and args.wait is not None:
            raise _no_daemon(
                f"{statefile.path} belongs to pid {state['pid']}, not {args.pid}: "
                "is -c the daemon's config?"
            )
        if args.wait is not None and state is None:
            raise _no_daemon(f"cannot wait: no state file at {statefile.path}{note}")
        return args.pid, state
    if state is None:
        raise _no_daemon(
            f"no cairnqd running for {args.config}: no state file at {statefile.path}{note}"
        )
    # The lock, not the pid, says whether the daemon lives: after a crash its pid may
    # already belong to an unrelated process that must not get our signal.
    if not statefile.locked_by_other():
        raise _no_daemon(f"no cairnqd running for {args.config}: {statefile.path} is stale")
    return state["pid"], state


def _check_master(pid: int, config_path: str, owner: int | None) -> None:
    """Refuse to signal `pid` unless it is the cairnqd master for this config (its
    process title says so) and, when the state file named it, runs as that file's
    owner: a stale or planted state file must not make us signal another process."""
    proc = f"/proc/{pid}"
    try:
        title = Path(proc, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        uid = os.stat(proc).st_uid
    except FileNotFoundError:
        raise _no_daemon(f"no process {pid}: is cairnqd running?") from None
    except OSError as exc:
        raise _no_daemon(f"cannot check that pid {pid} is cairnqd: {exc.strerror}") from None
    expected = f"cairnqd: master [{os.path.abspath(config_path)}]"
    if not title.startswith(expected):
        raise _no_daemon(
            f"pid {pid} is not the cairnqd master for {config_path} "
            f"(it runs {title.strip()[:80]!r}); not signalling it"
        )
    if owner is not None and uid != owner:
        raise _no_daemon(
            f"pid {pid} runs as uid {uid}, but its state file belongs to uid {owner}; "
            "not signalling it"
        )


def _signal(pid: int, signum: signal.Signals) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        raise _no_daemon(f"no process {pid}: is cairnqd running?") from None
    except PermissionError:
        raise _no_daemon(f"not allowed to signal pid {pid}: run as the daemon's user") from None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists; it is just not ours
    return True


def _await_reload(statefile: StateFile, pid: int, seq: int, timeout_s: float) -> DaemonState:
    deadline = time.monotonic() + timeout_s
    last_error: StateFileError | None = None
    while True:
        try:
            state = statefile.read()
        except StateFileError as exc:  # a foreign writer; atomic writes never tear
            state, last_error = None, exc
        if state is not None and state["reload"]["seq"] != seq:
            return state
        if not _alive(pid):
            raise _no_daemon(f"cairnqd (pid {pid}) exited before reporting the reload")
        if time.monotonic() >= deadline:
            reason = f" (last read: {last_error})" if last_error else ""
            message = f"no reload outcome from pid {pid} within {timeout_s:g}s{reason}"
            raise CliError(exitcodes.TEMPFAIL, message)
        time.sleep(0.05)


def cmd_reload(args: argparse.Namespace) -> int:
    runtime_dir, note = _runtime_dir(args.config)
    statefile = StateFile(state_path(args.config, runtime_dir))
    pid, state = _find_daemon(args, statefile, note)
    _check_master(pid, args.config, statefile.owner if state is not None else None)
    signum = signal.SIGUSR2 if args.all else signal.SIGHUP
    # Read seq before signalling, or a fast daemon could bump it before we look.
    seq = state["reload"]["seq"] if state is not None else 0
    generation = state["generation"] if state is not None else None
    _signal(pid, signum)
    if args.wait is None:
        print(f"sent {signum.name} to cairnqd (pid {pid})")
        return exitcodes.OK
    outcome = _await_reload(statefile, pid, seq, args.wait.total_seconds())
    if outcome["reload"]["ok"]:
        print(f"reload applied: generation {outcome['generation']} (pid {pid})")
        return exitcodes.OK
    if generation is not None and outcome["generation"] != generation:
        # Applied, but a group's roll stopped: the errors name the group and slot.
        message = f"reload failed: generation {outcome['generation']} is not running everywhere"
    else:
        message = f"reload refused; still running generation {outcome['generation']}"
    raise CliError(exitcodes.CONFIG, f"{message} (pid {pid})", outcome["reload"]["errors"])


# -- the parser ----------------------------------------------------------------------------


def _global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """-c and --log-level; subcommands get them with SUPPRESS defaults, so a value
    given before the subcommand is not overwritten by the subcommand's default."""
    fallback = os.environ.get(ENV_CONFIG) or "./cairnq.yaml"
    parser.add_argument(
        "-c",
        "--config",
        metavar="FILE",
        default=fallback if defaults else argparse.SUPPRESS,
        help=f"config file (env {ENV_CONFIG}; default ./cairnq.yaml)",
    )
    parser.add_argument(
        "--log-level",
        choices=_LEVELS,
        type=str.lower,
        default=None if defaults else argparse.SUPPRESS,
        help="override logging.level",
    )


def _add_local_commands(sub: cli_admin.Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", parents=parents, help="run the daemon in the foreground (default)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("check", parents=parents, help="validate the config")
    p.add_argument("--handlers", action="store_true", help="also import every handler registry")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("config", parents=parents, help="config tools")
    config_sub = p.add_subparsers(dest="config_command", metavar="COMMAND", required=True)
    dump = config_sub.add_parser("dump", parents=parents, help="the effective config, redacted")
    dump.add_argument("--format", choices=("yaml", "json"), default="yaml")
    dump.set_defaults(func=cmd_config_dump)

    p = sub.add_parser("reload", parents=parents, help="reload the running daemon's config")
    p.add_argument("--pid", type=int, help="the daemon's pid (default: from its state file)")
    p.add_argument("--wait", type=duration, metavar="DURATION", help="wait for the outcome")
    p.add_argument("--all", action="store_true", help="SIGUSR2: also roll unchanged groups")
    p.set_defaults(func=cmd_reload)

    p = sub.add_parser("version", parents=parents, help="versions of cairnqd and its libraries")
    p.set_defaults(func=cmd_version)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cairnqd", allow_abbrev=False, description=__doc__.splitlines()[0])
    _global_options(parser, defaults=True)
    common = _Parser(add_help=False, allow_abbrev=False)
    _global_options(common, defaults=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_local_commands(sub, [common])
    cli_admin.add_parsers(sub, [common])
    cli_bulk.extend_parsers(sub, [common])
    cli_queues.add_parsers(sub, [common])
    cli_status.add_parsers(sub, [common])
    cli_top.add_parsers(sub, [common])
    cli_schedules.add_parsers(sub, [common])
    parser.set_defaults(func=cmd_run)
    return parser


def _report(error: CliError) -> int:
    for line in error.details:
        print(line, file=sys.stderr)
    print(f"cairnqd: {error.message}", file=sys.stderr)
    return error.code


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors (already remapped)
        return exc.code if isinstance(exc.code, int) else exitcodes.USAGE
    args.command = args.command or "run"
    if args.log_level and args.func is not cmd_run:  # the daemon sets up its own logging
        logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    try:
        code: Any = args.func(args)
    except CliError as exc:
        return _report(exc)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except BrokenPipeError:  # `cairnqd list | head`: the reader left; not an error of ours
        # Point stdout at /dev/null so the interpreter's final flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception:  # a bug: show everything, and say it is ours
        traceback.print_exc()
        print("cairnqd: internal error (a bug; please report it)", file=sys.stderr)
        return exitcodes.SOFTWARE
    return int(code)


if __name__ == "__main__":
    raise SystemExit(main())
