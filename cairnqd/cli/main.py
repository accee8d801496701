"""The `cairnqd` command: the daemon (`run`, the default) and the operator's tools.

The parser is built from `COMMANDS`, one registration function per command or group;
this file keeps the entry point, `run`, `config dump`, `reload` and `version`. `-c` and
`--log-level` go before or after the subcommand. Expected failures exit with a sysexits
code, usage errors with 64 (docs/architecture.md, "The command line").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import yaml

from cairnqd.cli import admin as cli_admin
from cairnqd.cli import bulk as cli_bulk
from cairnqd.cli import check as cli_check
from cairnqd.cli import fleet as cli_fleet
from cairnqd.cli import init as cli_init
from cairnqd.cli import limits as cli_limits
from cairnqd.cli import move as cli_move
from cairnqd.cli import purge as cli_purge
from cairnqd.cli import queues as cli_queues
from cairnqd.cli import rollpreview
from cairnqd.cli import schedules as cli_schedules
from cairnqd.cli import status as cli_status
from cairnqd.cli import top as cli_top
from cairnqd.cli.admin import CliError, duration, load
from cairnqd.config.yamlload import (
    YamlDocument,
    YamlScalar,
    YamlSyntaxError,
    interpolate,
    load_yaml,
)
from cairnqd.daemon import exitcodes
from cairnqd.daemon.parent.statefile import (
    DaemonState,
    StateFile,
    StateFileError,
    master_title,
    running_masters,
    state_path,
)

if TYPE_CHECKING:
    from cairnqd.cli.admin import Subparsers

__all__ = ["main"]

ENV_CONFIG = "CAIRNQD_CONFIG"
_LEVELS = ("debug", "info", "warning", "error", "critical")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(exitcodes.USAGE, f"{self.prog}: error: {message}\n")


# -- run, check, config dump, version ------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    try:
        config = load(args.config)
    except CliError as exc:
        # A successor of a binary upgrade: the running parent reports this.
        from cairnqd.daemon.parent.succession import report_failed_start

        report_failed_start([*exc.details, exc.message])
        raise
    if args.log_level:
        # Only for this start: a reload re-reads logging.level from the file.
        level = args.log_level.upper()
        config = dataclasses.replace(
            config, logging=dataclasses.replace(config.logging, level=level)
        )
    from cairnqd.daemon.parent.supervisor import (
        run_daemon,  # the daemon's imports are not every command's cost
    )

    return run_daemon(args.config, config, log_level=args.log_level)


def cmd_dashboard(args: argparse.Namespace) -> int:
    config = load(args.config)
    if args.listen is not None:
        listen = _listen(args.listen, config)
        config = dataclasses.replace(
            config, dashboard=dataclasses.replace(config.dashboard, listen=listen)
        )
    from cairnqd.dashboard.standalone import run_dashboard

    return run_dashboard(args.config, config)


def _listen(value: str, config: Any) -> Any:
    """`--listen HOST:PORT`, held to the rules `check` holds dashboard.listen to."""
    from cairnqd.config.kinds import ListenKind

    try:
        listen = ListenKind().convert(value)
    except Exception as exc:
        raise CliError(exitcodes.USAGE, f"dashboard --listen: {exc}") from None
    if listen is None:
        raise CliError(exitcodes.USAGE, "dashboard --listen: give host:port, not off")
    if not listen.is_loopback and config.dashboard.token is None:
        raise CliError(
            exitcodes.USAGE,
            f"dashboard --listen {listen}: beyond this host the dashboard needs "
            "dashboard.token_file in the config",
        )
    return listen


def cmd_config_dump(args: argparse.Namespace) -> int:
    data = load(args.config).redacted()
    if args.format == "json":
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    return exitcodes.OK


def cmd_version(args: argparse.Namespace) -> int:
    # Here only: the driver costs a fifth of a second to import, and no other command
    # on a SQLite deployment needs it.
    import sqlite3

    import psycopg

    from cairnqd import __version__
    from cairnqd._protocol import migrations
    from cairnqd.daemon.wire.messages import PROTOCOL_VERSION
    from cairnqd.store.migrate import STORAGE_PROTOCOL_VERSION

    libpq = psycopg.pq.version()
    ours = sorted(m.name for m in migrations("sqlite") if m.ledger == "cairnqd")
    print(f"cairnqd {__version__}")
    print(f"storage protocol {STORAGE_PROTOCOL_VERSION}")
    print(f"pipe protocol {PROTOCOL_VERSION}")
    print(f"extension migrations {len(ours)} (newest {ours[-1]})")
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
    from cairnqd.config import default_runtime_dir  # the config's own fallback, not a copy

    try:
        root, _ = interpolate(load_yaml(config_path).root, os.environ)
    except (OSError, YamlSyntaxError) as exc:
        note = f" ({config_path} does not parse, so its runtime_dir was not read: {exc})"
        return default_runtime_dir(os.environ), note
    node = YamlDocument(root).node(("runtime_dir",))
    if isinstance(node, YamlScalar) and isinstance(node.value, str) and node.value:
        # Relative to the config file's directory, as the daemon's load takes it.
        base = os.path.dirname(os.path.abspath(config_path))
        return os.path.normpath(os.path.join(base, os.path.expanduser(node.value))), ""
    return default_runtime_dir(os.environ), ""


def _locate(args: argparse.Namespace) -> tuple[StateFile, str]:
    """The state file of the daemon running `args.config`, and a note for "not found"
    messages. Where the file's runtime_dir says, when a daemon lives there; otherwise
    where the running master for this config keeps it, found from the process itself
    (`running_masters`): the file may no longer parse, or name another directory than
    the one the daemon started with, and the daemon must still get the reload, so that
    it says what is wrong with the file."""
    runtime_dir, note = _runtime_dir(args.config)
    named = StateFile(state_path(args.config, runtime_dir))
    if named.locked_by_other():
        return named, note
    masters = running_masters(args.config)
    if args.pid is not None:
        masters = [m for m in masters if m[0] == args.pid] or masters
    if len(masters) > 1:
        pids = ", ".join(str(pid) for pid, _ in masters)
        raise _no_daemon(
            f"several cairnqd masters run {args.config} (pids {pids}), each with its own "
            "runtime_dir: give --pid"
        )
    if not masters:
        return named, f"{note}; no process is titled {master_title(args.config)!r}"
    pid, path = masters[0]
    why = "does not parse" if note else f"names runtime_dir {runtime_dir}"
    print(
        f"cairnqd: {args.config} {why}; the daemon for it (pid {pid}) keeps its state "
        f"in {os.path.dirname(path)}",
        file=sys.stderr,
    )
    return StateFile(path), ""


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
        raise _no_daemon(f"no cairnqd running for {args.config}: {statefile.path} is stale{note}")
    return state["pid"], state


def _check_master(pid: int, config_path: str, owner: int | None) -> None:
    """Refuse to signal `pid` unless it is the cairnqd master for this config (its
    process title says so) and, when the state file named it, runs as that file's
    owner: a stale or planted state file must not make us signal another process."""
    try:
        title = _process_title(pid)
        uid = os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        raise _no_daemon(f"no process {pid}: is cairnqd running?") from None
    except OSError as exc:
        raise _no_daemon(f"cannot check that pid {pid} is cairnqd: {exc.strerror}") from None
    expected = master_title(config_path)
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


def _process_title(pid: int) -> str:
    """The process's title, as `ps` shows it (empty for a zombie); OSError if none."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def _titled_master(pid: int, config_path: str) -> bool:
    """Whether `pid` is alive and titled the cairnqd master for this config."""
    try:
        return _process_title(pid).startswith(master_title(config_path))
    except OSError:
        return False


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


def _check_pipe_protocol(args: argparse.Namespace, pid: int, state: DaemonState) -> None:
    """`reload --all` starts children of the installed code under the running parent:
    refuse, plainly, when the two cannot talk (docs/releasing.md)."""
    from cairnqd import __version__
    from cairnqd.daemon.wire.messages import PROTOCOL_VERSION

    running = state.get("pipe_protocol")
    if running is None or running == PROTOCOL_VERSION:
        return
    if "upgrade" in state:
        instead = f"upgrade instead (cairnqd -c {args.config} upgrade --wait 2m)"
    else:
        instead = "restart the daemon instead (systemctl restart cairnqd)"
    raise CliError(
        exitcodes.CONFIG,
        f"reload --all cannot load the installed cairnqd {__version__} (pipe protocol "
        f"{PROTOCOL_VERSION}) into the running daemon (pid {pid}, cairnqd "
        f"{state.get('version', 'unknown')}, pipe protocol {running}): its children would "
        f"refuse that parent. A new parent must load it: {instead}; nothing was changed",
    )


def _preview_interruptions(args: argparse.Namespace, statefile: StateFile) -> None:
    """Say which running tasks the reload's rolls would cut short, before it starts."""
    edited = rollpreview.load_edited(args.config)
    snapshot = rollpreview.ask_running(statefile.path) if edited is not None else None
    if edited is None or snapshot is None:
        return
    for line in rollpreview.preview_lines(snapshot, edited, roll_all=args.all):
        print(line)
    sys.stdout.flush()


def cmd_reload(args: argparse.Namespace) -> int:
    statefile, note = _locate(args)
    pid, state = _find_daemon(args, statefile, note)
    _check_master(pid, args.config, statefile.owner if state is not None else None)
    if args.wait is None:
        _refuse_unloadable(args.config)
    if args.all and state is not None:
        _check_pipe_protocol(args, pid, state)
    signum = signal.SIGUSR2 if args.all else signal.SIGHUP
    # Read seq before signalling, or a fast daemon could bump it before we look.
    seq = state["reload"]["seq"] if state is not None else 0
    generation = state["generation"] if state is not None else None
    if args.wait is not None:
        _preview_interruptions(args, statefile)
    _signal(pid, signum)
    if args.wait is None:
        print(f"sent {signum.name} to cairnqd (pid {pid})")
        return exitcodes.OK
    outcome = _await_reload(statefile, pid, seq, args.wait.total_seconds())
    if outcome["reload"]["ok"]:
        changes = outcome["reload"].get("changes", [])
        if generation is not None and outcome["generation"] == generation and not changes:
            print(f"reload applied: nothing changed; still generation {generation} (pid {pid})")
            return exitcodes.OK
        print(f"reload applied: generation {outcome['generation']} (pid {pid})")
        for line in changes:
            print(f"  {line}")
        return exitcodes.OK
    if generation is not None and outcome["generation"] != generation:
        # Applied, but a group's roll stopped: the errors name the group and slot.
        message = f"reload failed: generation {outcome['generation']} is not running everywhere"
    else:
        message = f"reload refused; still running generation {outcome['generation']}"
    raise CliError(exitcodes.CONFIG, f"{message} (pid {pid})", outcome["reload"]["errors"])


def _refuse_unloadable(config_path: str) -> None:
    """Without --wait nothing reports the daemon's verdict back: a file the daemon would
    refuse is refused here, before any signal, with its problems and exit 78, rather than
    "sent" and exit 0 while the refusal goes to the daemon's log (and its reload-failed
    alert). With --wait the daemon itself judges the file, in its own environment."""
    try:
        load(config_path)
    except CliError as exc:
        raise CliError(
            exc.code,
            f"{exc.message}; not sent to the daemon, which keeps its running config "
            "(`reload --wait` has the daemon judge the file instead)",
            exc.details,
        ) from None


def cmd_upgrade(args: argparse.Namespace) -> int:
    statefile, note = _locate(args)
    pid, state = _find_daemon(args, statefile, note)
    _check_master(pid, args.config, statefile.owner if state is not None else None)
    if state is not None and "upgrade" not in state:
        raise CliError(
            exitcodes.CONFIG,
            f"the running daemon (pid {pid}, cairnqd {state.get('version', 'before 0.2.0')}) "
            "cannot upgrade in place: restart it once (systemctl restart cairnqd); from then "
            "on `upgrade` loads new releases without a gap",
        )
    seq = state["upgrade"]["seq"] if state is not None and "upgrade" in state else 0
    _signal(pid, signal.SIGURG)
    if args.wait is None:
        print(f"sent URG to cairnqd (pid {pid}): it starts the installed cairnqd beside itself")
        return exitcodes.OK
    outcome = _await_upgrade(statefile, pid, seq, args.wait.total_seconds())
    upgrade = outcome["upgrade"]
    if upgrade["ok"]:
        print(
            f"upgraded: cairnqd {upgrade['from_version']} (pid {upgrade['from_pid']}) -> "
            f"cairnqd {outcome.get('version', 'unknown')} (pid {outcome['pid']}), "
            f"generation {outcome['generation']}"
        )
        print(f"  pid {upgrade['from_pid']} finishes its running tasks and exits")
        return exitcodes.OK
    raise CliError(
        exitcodes.CONFIG,
        f"upgrade failed; still running cairnqd {outcome.get('version', 'unknown')} (pid {pid})",
        upgrade["errors"],
    )


def _await_upgrade(statefile: StateFile, pid: int, seq: int, timeout_s: float) -> DaemonState:
    """The state once the upgrade numbered after `seq` has an outcome. The old parent
    may exit (its tasks done) a moment before its successor writes the state: the
    wait goes on while some process holds the lock."""
    deadline = time.monotonic() + timeout_s
    last_error: StateFileError | None = None
    while True:
        try:
            state = statefile.read()
        except StateFileError as exc:
            state, last_error = None, exc
        if state is not None and state.get("upgrade", {"seq": seq})["seq"] != seq:
            return state
        if not _alive(pid) and not statefile.locked_by_other():
            raise _no_daemon(f"cairnqd (pid {pid}) exited before reporting the upgrade")
        if time.monotonic() >= deadline:
            reason = f" (last read: {last_error})" if last_error else ""
            message = (
                f"no upgrade outcome from pid {pid} within {timeout_s:g}s{reason}; "
                "`cairnqd status` shows how far it got"
            )
            raise CliError(exitcodes.TEMPFAIL, message)
        time.sleep(0.05)


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
        help="override logging.level for this run",
    )


def _add_run(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        parents=parents,
        help="run the daemon in the foreground (the default command)",
        description="Run the supervisor and its worker children in the foreground until TERM "
        "or INT. Before any child starts it checks the database, the migrations, every group's "
        "handler imports and the connection budget (as `check --connect` does) and exits 78 on "
        "a problem. HUP reloads the config, USR2 also rolls unchanged groups, TSTP pauses "
        "claiming, URG loads newly installed code under a new parent (`upgrade`), QUIT stops at "
        "once handing tasks back.",
    )
    p.set_defaults(func=cmd_run)


def _add_config(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "config",
        parents=parents,
        help="config tools (config dump)",
        description="Tools for the config file.",
    )
    config_sub = p.add_subparsers(
        dest="config_command", metavar="COMMAND", required=True, title="commands"
    )
    dump = config_sub.add_parser(
        "dump",
        parents=parents,
        help="print the effective config, passwords redacted",
        description="Print the config as the daemon would run it: every default filled in, "
        "relative paths made absolute, DSN passwords and dsn_file contents redacted.",
    )
    dump.add_argument(
        "--format", choices=("yaml", "json"), default="yaml", help="output format (yaml)"
    )
    dump.set_defaults(func=cmd_config_dump)


# -- stop ----------------------------------------------------------------------------------

#: What a stop may take past the longest shutdown_timeout: the parent then sends QUIT,
#: SIGKILL 2 s later, ends what is left in the children's process groups (TERM, SIGKILL
#: 2 s later), and stops its own threads, up to 30 s when the database does not answer
#: (systemd/cairnqd.service's TimeoutStopSec has the same sum).
STOP_MARGIN_S = 40.0


def _stop_wait_s(config_path: str) -> float:
    """How long `stop` waits by default: the config's longest shutdown_timeout and the
    hard stop after it. Read from the file as it is now (the daemon may run an earlier
    load of it); the default shutdown_timeout when the file does not load."""
    from cairnqd.config import load_config

    try:
        config = load_config(config_path)
    except Exception:  # the daemon still gets the signal; only the wait is a guess
        return 30.0 + STOP_MARGIN_S
    longest = max(
        [config.shutdown_timeout] + [config.shutdown_timeout_for(group) for group in config.groups]
    )
    return longest.total_seconds() + STOP_MARGIN_S


def cmd_stop(args: argparse.Namespace) -> int:
    if args.no_wait and args.wait is not None:
        raise CliError(exitcodes.USAGE, "stop: --wait and --no-wait contradict each other")
    if not args.no_wait and args.wait is None:
        args.wait = timedelta(seconds=_stop_wait_s(args.config))
    statefile, note = _locate(args)
    pid, state = _find_daemon(args, statefile, note)
    _check_master(pid, args.config, statefile.owner if state is not None else None)
    signum = signal.SIGQUIT if args.now else signal.SIGTERM
    what = "stopping now, running tasks handed back" if args.now else "draining"
    _signal(pid, signum)
    if args.no_wait:
        print(f"sent {signum.name} to cairnqd (pid {pid}): {what}")
        return exitcodes.OK
    timeout_s = args.wait.total_seconds()
    print(f"sent {signum.name} to cairnqd (pid {pid}): {what}; waiting up to {timeout_s:g}s")
    sys.stdout.flush()
    began = time.monotonic()
    # Gone once its state file's lock is free and no process under its pid is still
    # the master for this config (it drops the lock a moment before it exits; a pid
    # alone could already belong to another process).
    while statefile.locked_by_other() or _titled_master(pid, args.config):
        if time.monotonic() - began >= timeout_s:
            hint = (
                ""
                if args.now
                else f"; `cairnqd -c {args.config} stop --now` hands the running tasks back"
            )
            raise CliError(
                exitcodes.TEMPFAIL,
                f"cairnqd (pid {pid}) still running {timeout_s:g}s after {signum.name}{hint}",
            )
        time.sleep(0.05)
    print(
        f"stopped: cairnqd (pid {pid}) exited {time.monotonic() - began:.1f}s after {signum.name}"
    )
    return exitcodes.OK


def _add_stop(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "stop",
        parents=parents,
        help="stop the running daemon: drain (or --now) and wait until it has exited",
        description="Send TERM to the daemon running this config, found by its state file in "
        "runtime_dir: its children stop claiming and finish what they hold, for up to "
        "shutdown_timeout. With --now, QUIT: finished results are written and running tasks "
        "are handed back, their attempt given back. Then wait until the daemon and all its "
        "children have exited: by default the config's longest shutdown_timeout plus 40s. "
        "Exit 0 once it has, 75 if it is still running at the deadline, 69 if no daemon runs "
        "this config.",
    )
    _daemon_options(p, "wait up to DURATION for the daemon to exit (default: the drain's bound)")
    p.add_argument("--no-wait", action="store_true", help="send the signal and return at once")
    p.add_argument(
        "--now", action="store_true", help="QUIT instead of TERM: hand running tasks back"
    )
    p.set_defaults(func=cmd_stop)


def _add_reload(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "reload",
        parents=parents,
        help="reload the running daemon's config (--wait prints what changed)",
        description="Send HUP (or USR2 with --all) to the daemon running this config, found "
        "by its state file in runtime_dir. Without --wait, a file that does not load is "
        "refused here (exit 78) and nothing is sent. With --wait, the daemon judges the "
        "file: first list the running tasks that the groups it rolls, shrinks or removes "
        "would cut short past their shutdown_timeout, "
        "then wait for the outcome: print what the reload changed, or why it was refused "
        "(exit 78). A reload that changes nothing keeps the generation.",
    )
    _daemon_options(p, "wait up to DURATION for the outcome (rolls included) and print it")
    p.add_argument("--all", action="store_true", help="SIGUSR2: also roll unchanged groups")
    p.set_defaults(func=cmd_reload)


def _add_upgrade(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "upgrade",
        parents=parents,
        help="load newly installed cairnqd code without a gap (a new parent takes over)",
        description="Send URG to the daemon running this config: it starts the installed "
        "cairnqd as a new parent, which starts its groups one by one beside the running "
        "children and takes over the listening sockets and the state once all are ready; "
        "the old parent then finishes its tasks and exits. Capacity never drops, whatever "
        "changed between the releases. If the new parent cannot get every group ready "
        "within reload.upgrade_timeout, the running one carries on unchanged. With --wait, "
        "print the outcome (exit 78 on failure, with the reasons).",
    )
    _daemon_options(p, "wait up to DURATION for the new parent to take over, and print it")
    p.set_defaults(func=cmd_upgrade)


def _daemon_options(p: argparse.ArgumentParser, wait_help: str) -> None:
    """--pid and --wait: which daemon to signal, and how long to wait for the outcome."""
    p.add_argument("--pid", type=int, help="the daemon's pid (default: from its state file)")
    p.add_argument("--wait", type=duration, metavar="DURATION", help=wait_help)


def _add_dashboard(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "dashboard",
        parents=parents,
        help="serve the web dashboard without running workers",
        description="Serve the web dashboard (docs/dashboard.md) on dashboard.listen, or "
        "--listen, until TERM or INT, reading the config's database: for an ops host that "
        "runs no workers. A daemon serves the same dashboard itself when its config sets "
        "dashboard.listen.",
    )
    p.add_argument("--listen", metavar="HOST:PORT", help="override dashboard.listen")
    p.set_defaults(func=cmd_dashboard)


def _add_version(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "version",
        parents=parents,
        help="versions of cairnqd, the protocol, Python, SQLite and psycopg",
        description="Print the versions of cairnqd, its storage protocol, Python, SQLite and "
        "psycopg (with libpq). `cairnqd --version` prints cairnqd's alone.",
    )
    p.set_defaults(func=cmd_version)


Register = Callable[["Subparsers", list[argparse.ArgumentParser]], None]

#: Every subcommand, in the order `--help` lists them. A module adding commands
#: exposes one `(subparsers, parents) -> None` function and gets one line here.
COMMANDS: tuple[Register, ...] = (
    _add_run,
    cli_init.add_parser,
    cli_check.add_parser,
    _add_config,
    cli_admin.add_migrate,
    _add_reload,
    _add_stop,
    _add_upgrade,
    cli_admin.add_reads,
    cli_admin.add_submit,
    cli_admin.add_control,
    cli_bulk.extend_parsers,
    cli_purge.add_parser,
    cli_queues.add_parsers,
    cli_fleet.add_parser,
    cli_limits.add_parser,
    cli_status.add_parsers,
    cli_top.add_parsers,
    cli_schedules.add_parsers,
    cli_move.add_parser,
    _add_dashboard,
    _add_version,
)

_EPILOG = """examples:
  cairnqd init                             write a starter ./cairnq.yaml (SQLite, demo handlers)
  cairnqd -c cairnq.yaml check --connect   what the daemon checks before it starts
  cairnqd -c cairnq.yaml migrate           create or upgrade the database schema
  cairnqd -c cairnq.yaml                   run the daemon (same as `run`)
  cairnqd -c cairnq.yaml submit demo.echo --payload '{"n": 1}' --wait
  cairnqd -c cairnq.yaml stats             tasks per queue and status
  cairnqd -c cairnq.yaml reload --wait 60s apply an edited config; print what changed
  cairnqd -c cairnq.yaml stop              drain the running daemon and wait for it to exit
  cairnqd purge --dry-run                  count what retention.rules would delete

exit codes:
  0   success
  1   nothing done: no such task; a task in the wrong state for the command; an
      idempotency key already taken (submit --conflict reject); the task failed
      (submit --wait); "no" at a prompt; a file `init` would overwrite
  64  usage: a bad command line, or purge by filters without --yes
  65  bad data: invalid JSON, not a cairnq database, another protocol version,
      migrations pending (run `cairnqd migrate`)
  66  a missing input: the --payload-file, or the SQLite database (only `migrate`
      and the daemon create it)
  69  unavailable: the database or the daemon cannot be reached
  70  internal error: a bug (please report it, with the traceback)
  75  try again later: the daemon's lock is held, another host is purging, a
      --wait or --timeout ran out
  78  config: an invalid, missing or unreadable config file, a refused reload, a
      daemon that would not start (check --connect)

Run `cairnqd COMMAND --help` for a command's options.
"""


class _VersionAction(argparse.Action):
    """`--version`: cairnqd's version, looked up only when asked (it costs an import)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from cairnqd import __version__

        print(f"cairnqd {__version__}")
        parser.exit(exitcodes.OK)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="cairnqd",
        allow_abbrev=False,
        description=__doc__.splitlines()[0].removeprefix("The `cairnqd` command: ").capitalize(),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _global_options(parser, defaults=True)
    parser.add_argument("--version", action=_VersionAction, help="print cairnqd's version")
    common = _Parser(add_help=False, allow_abbrev=False)
    _global_options(common, defaults=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for register in COMMANDS:
        register(sub, [common])
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
