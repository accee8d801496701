"""The parent process: `cairnqd -c cairnq.yaml`.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import cast

from setproctitle import setproctitle

from cairnqd import __version__
from cairnqd.config import Config, GroupConfig, setting_position
from cairnqd.daemon import systemd
from cairnqd.daemon.boot import child_push, limit_specs
from cairnqd.daemon.exitcodes import CONFIG, OK, TEMPFAIL
from cairnqd.daemon.listening import adopt
from cairnqd.daemon.logs import (
    LoggingSetupError,
    configure_logging,
    logging_settings,
    reopen_logs,
)
from cairnqd.daemon.parent.cadence import Cadence, Due
from cairnqd.daemon.parent.channels import ChildChannels
from cairnqd.daemon.parent.control import (
    ControlServer,
    Snapshot,
    control_path,
    daemon_view,
    restarts_by_group,
)
from cairnqd.daemon.parent.deadlines import (
    PARENT_STALL_S,
    check_deadlines,
    forgive_silence,
    next_due,
    reported_trouble,
)
from cairnqd.daemon.parent.exits import ChildExits, describe_exit
from cairnqd.daemon.parent.fleet import Fleet, Retiring
from cairnqd.daemon.parent.leftovers import Leftovers
from cairnqd.daemon.parent.maintenance import Maintenance
from cairnqd.daemon.parent.metrics import Metrics
from cairnqd.daemon.parent.metrics.server import MetricsBindError
from cairnqd.daemon.parent.pool import ChildProcess, GroupPool, spawn_child
from cairnqd.daemon.parent.preflight import run_preflight
from cairnqd.daemon.parent.reload import ConfigReload, ReloadPlan
from cairnqd.daemon.parent.runtimedir import UnsafeRuntimeDir
from cairnqd.daemon.parent.scheduler import Scheduler
from cairnqd.daemon.parent.statefile import (
    AlreadyRunning,
    DaemonState,
    StateFile,
    StateFileError,
    after_reload,
    after_upgrade,
    initial_state,
    state_path,
)
from cairnqd.daemon.parent.status import StatusReport, status_dump
from cairnqd.daemon.parent.succession import Succession, report_failed_start
from cairnqd.daemon.parent.upgrade import Relaunch, Upgrade, start_successor
from cairnqd.daemon.parent.upgrade_link import Inheritance, InheritanceError, take_inheritance
from cairnqd.daemon.parent.wakerelay import SETTLED, WakeRelay, backed_up
from cairnqd.daemon.parent.wakerouting import WakeRouter, deliver, limited_groups
from cairnqd.daemon.systemd import SYSTEMD_ONLY_VARS
from cairnqd.daemon.wakerole import wake_lock_path
from cairnqd.daemon.wire.messages import (
    PROTOCOL_VERSION,
    Claiming,
    ReopenLogs,
    SetCancelGrace,
    SetLimits,
    SetLogging,
    encode,
)
from cairnqd.dashboard import DashboardBindError, DashboardData, DashboardServer
from cairnqd.store.sqlite.files import ensure_file, is_plain_file, remember_file
from cairnqd.store.tables.schedules import host_label

log = logging.getLogger("cairnqd.supervisor")

_HANDLED = (
    signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1,
    signal.SIGUSR2, signal.SIGTSTP, signal.SIGTTIN, signal.SIGCHLD, signal.SIGURG,
)  # fmt: skip
#: The parent's process label in log lines; a child's is `[group] slot/slots`.
PARENT_LABEL = "master"
#: How often the loop checks that the runtime directory still holds our lock and state.
_RUNTIME_CHECK_S = 2.0
#: Signals that stop the daemon; while it starts (`_preflight`) they cut the start short.
_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


class _StoppedWhileStarting(BaseException):
    """A stop signal arrived during the preflight: raised from the signal handler, as
    KeyboardInterrupt is (and, like it, past `except Exception`), so that a probe
    importing the handlers is ended at once."""

    def __init__(self, signum: int) -> None:
        self.name = signal.Signals(signum).name
        super().__init__(self.name)


class Supervisor:
    def __init__(
        self,
        config_path: str,
        config: Config,
        *,
        log_level: str | None = None,
        inheritance: Inheritance | None = None,
    ) -> None:
        self.config_path = os.path.abspath(config_path)
        self.config = config
        self.generation = 1
        #: How a binary upgrade starts the installed code as our successor.
        self.relaunch = Relaunch(self.config_path, log_level)
        #: The upgrade this parent started (SIGURG), until its successor is reaped.
        self.upgrade: Upgrade | None = None
        #: Set when this parent is a successor: it serves once the running one lets go.
        self.succession: Succession | None = None
        #: The exit code when it is not the usual one (an abandoned succession).
        self.exit_code: int | None = None
        if inheritance is not None:
            self.succession = Succession(
                inheritance, list(config.groups), config.reload.upgrade_timeout.total_seconds()
            )
            self.generation = int(inheritance.state.get("generation", 0)) + 1
        #: When the loop next runs its steps, and why (`cadence.py`).
        self.cadence = Cadence(time.monotonic())
        self.fleet = Fleet(config)
        self.selector = selectors.DefaultSelector()
        self.signals: deque[int] = deque()
        #: The signal wakeup fd, once the handlers are installed (`_run`).
        self.wakeup_r = -1
        #: True during the preflight, when a stop signal ends the start (`_StoppedWhileStarting`).
        self._starting = False
        #: When the runtime files are next checked (`_keep_runtime_files`), and the
        #: problem with them last logged.
        self._runtime_check_at = 0.0
        self._runtime_trouble: str | None = None
        self.stopping = False
        #: Children told to stop claiming by SIGTSTP; the next applied reload resumes.
        self.quiet = False
        self.reload = ConfigReload(self, process_label=PARENT_LABEL)
        self.status = StatusReport(self.config_path, self._database_problems)
        self.metrics = Metrics(config)
        self.maintenance = Maintenance(config, self.metrics, version=__version__)
        self.scheduler = Scheduler(config, self.metrics)
        self.metrics.database.set_outage_source(self._processes_without_database)
        self.channels = ChildChannels(self.selector, self.metrics, alarming=self._heard_trouble)
        #: Process groups of reaped children that still hold what their handlers started.
        self.leftovers = Leftovers()
        #: The host's one LISTEN on direct_dsn, passed on to the children (or None).
        self.wakes: WakeRelay | None = None
        #: Which children each relayed wake-up goes to.
        self.wake_router = WakeRouter(self._group_queues)
        if child_push(config.database) == "pipe":
            self.wakes = WakeRelay(
                config.database,
                on_deaf=self.metrics.parent_listen_deaf,
                settled=bool(config.limits),
            )
            self.channels.on_room = self._room_changed
        self.exits = ChildExits(self.fleet, self.maintenance, self.metrics, self.reload.roll_failed)
        path = state_path(self.config_path, config.runtime_dir)
        if inheritance is not None:
            path = inheritance.state_path  # the running parent's, whatever runtime_dir says now
        self.statefile = StateFile(path)
        self.state = initial_state(self.config_path)
        #: Answers `cairnqd status` and `top` from a thread, off this loop.
        self.control = ControlServer(control_path(self.statefile.path))
        self.started_at = time.time()
        #: The web dashboard, when `dashboard.listen` is set: its own threads and store.
        self.dashboard: DashboardServer | None = None
        #: Its database thread alone, when the daemon only reports (`dashboard.report`).
        self.dashboard_data: DashboardData | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def run(self) -> int:
        try:
            if self.succession is not None:
                self.statefile.adopt(self.succession.inheritance.lock_fd)
            else:
                self.statefile.acquire()
        except AlreadyRunning as exc:
            log.error("%s", exc)
            return TEMPFAIL
        except (UnsafeRuntimeDir, StateFileError) as exc:  # or an inherited lock not ours
            log.error("%s", exc)
            self._abandon_succession([str(exc)])
            return CONFIG
        except OSError as exc:
            log.error("cannot take the lock in %s: %s", self.statefile.directory, exc)
            return CONFIG
        try:
            if self.succession is None:
                self._start_control()  # a successor answers once it serves
            return self._run()
        finally:
            self.control.stop()
            if self.succession is not None:
                self.succession.close()
            self.statefile.release()

    def _start_control(self) -> None:
        try:
            self.control.start()
        except (OSError, UnsafeRuntimeDir) as exc:
            # Status is a convenience: the daemon runs on without it.
            log.warning("no control socket (%s): `cairnqd status` cannot ask this daemon", exc)

    def _run(self) -> int:
        # Handlers first: the preflight takes as long as the handlers take to import,
        # and a HUP, USR1 or TSTP under the default actions would kill (or stop) a
        # daemon still starting; from here on each is queued until the loop runs.
        self.wakeup_r = self._install_signals()
        self._starting = True
        try:
            ready = self._preflight()
        except _StoppedWhileStarting as stop:
            log.info("%s while starting: stopped before any child was started", stop.name)
            self._abandon_succession([f"the new parent was stopped ({stop.name}) while starting"])
            return OK if self.exit_code is None else self.exit_code
        finally:
            self._starting = False
        if not ready:
            return CONFIG
        if self.succession is not None:
            return self._run_as_successor()
        self._create_sqlite_file()
        try:
            wakeup_r = self._start()
        except MetricsBindError as exc:
            where = setting_position(self.config_path, ("metrics", "listen"))
            key = f"metrics.listen at {where}" if where else "metrics.listen (its default)"
            log.error("cannot start: %s; set %s to a free port, or off", exc, key)
            return CONFIG
        except DashboardBindError as exc:
            where = setting_position(self.config_path, ("dashboard", "listen"))
            log.error("cannot start: %s; set dashboard.listen at %s to a free port, or off",
                      exc, where)  # fmt: skip
            self.maintenance.stop(timeout_s=10.0)
            self.scheduler.stop(timeout_s=5.0)
            self.metrics.close()
            return CONFIG
        self._loop(wakeup_r)
        return self._finish()

    def _preflight(self) -> bool:
        """What every child would fail on, checked once before any exists (`preflight`):
        False, after one `cannot start:` line per problem, if the daemon must not start."""
        report = run_preflight(self.config)
        for finding in report.warnings:
            log.warning("%s", finding)
        for finding in report.problems:
            log.error("cannot start: %s", finding)
        if report.problems:
            self._abandon_succession([str(finding) for finding in report.problems])
        return not report.problems

    def _create_sqlite_file(self) -> None:
        """Create the SQLite file if it is missing, before any child or thread opens it:
        from then on every process opens it only if it exists (`mode=rw`), so a file
        deleted under a running daemon is never silently recreated empty."""
        path = self.config.database.path
        if path is None or not is_plain_file(path):
            return
        try:
            if ensure_file(path):
                log.info("created the database file %s", path)
        except OSError as exc:
            log.error("cannot create the database file %s: %s", path, exc)
            return
        remember_file(path)

    def _start(self) -> int:
        """Signals, the metrics endpoint, maintenance and the (empty) pools; returns the
        signal wakeup fd. Children are spawned by the first tick. A successor leaves
        what the running parent still serves (metrics, dashboard, state) to `_promote`."""
        wakeup_r = self.wakeup_r
        if self.succession is None:
            self._serve_metrics()
        self.maintenance.start()
        self.scheduler.start()
        if self.wakes is not None:
            self.wakes.start()
            self.selector.register(self.wakes.fd, selectors.EVENT_READ)
        if self.succession is None:
            self._start_dashboard()
            self.write_state()
        log.info(
            "cairnqd started: %s, %d group(s), generation %d",
            self.config.database.backend, len(self.fleet.groups), self.generation,
        )  # fmt: skip
        self._log_push_mode()
        # The preflight and start-up above are not a stall of the loop, which starts now.
        self.cadence = Cadence(time.monotonic())
        return wakeup_r

    def _log_push_mode(self) -> None:
        """One line on how wake-ups reach the children when it is not the usual way."""
        db = self.config.database
        push = child_push(db)
        if push == "off":
            log.warning(
                "push wake-ups off: LISTEN does not work through a transaction pooler "
                "(database.pooler: transaction) and database.direct_dsn is not set; "
                "children poll every groups.*.poll_interval and leadership uses lease rows"
            )
        elif push == "pipe":
            log.info(
                "push wake-ups through this process: one LISTEN on database.direct_dsn, "
                "passed on to the children over their pipes"
            )

    def _serve_metrics(self, adopted: socket.socket | None = None) -> None:
        """`/metrics` on `metrics.listen`, or on the socket a running parent passed us;
        MetricsBindError when it cannot be bound."""
        listen = self.config.metrics.listen
        if listen is not None:
            port = self.metrics.serve(
                listen.host, listen.port, health=self.status.health, adopted=adopted
            )
            log.info("metrics on http://%s:%d/metrics", listen.host, port)

    def _start_dashboard(self, adopted: socket.socket | None = None) -> None:
        """The web dashboard on threads of its own; it reads the status `cairnqd status`
        reads (the control snapshot), never this loop's state directly, and writes it
        to the database for dashboards on other hosts. With `dashboard.report` and no
        `listen`, only the reporting runs."""
        settings = self.config.dashboard
        if settings.listen is None and not settings.report:
            return
        data = DashboardData(self.config, daemon_view=self.control.current, report_as=host_label())
        if settings.listen is None:
            self.dashboard_data = data
            data.start()
            return
        self.dashboard = DashboardServer(self.config, data)
        port = self.dashboard.start(adopted)
        host = f"[{settings.listen.host}]" if ":" in settings.listen.host else settings.listen.host
        log.info("dashboard on http://%s:%d/", host, port)

    def _loop(self, wakeup_r: int) -> None:
        cadence = self.cadence
        while True:
            urgent = self._read_events(wakeup_r, cadence.wait_s(time.monotonic()))
            self._dispatch_signals()
            # Task events arrive thousands of times a second; the steps below only
            # need to run on a signal, a child's change of state, or when due.
            started = time.monotonic()
            if not urgent and not cadence.due(started):
                continue
            if self._tick():
                return
            cadence.plan(started, self._reasons_to_tick(time.monotonic()))

    def _reasons_to_tick(self, now: float) -> Iterator[Due]:
        """Everything that needs the loop's steps again, and when (`cadence.py`): work
        that moves step by step is due `now`, which the cadence makes the busy tick;
        the rest is due at its deadline. With none, the loop ticks after a second."""
        stepping = (
            (self.stopping, "stopping"),
            (self.reload.busy, "reload"),
            (self.fleet.rolling(), "roll"),
            (self.upgrade is not None and self.upgrade.state == "starting", "upgrade"),
            (self.succession is not None and not self.succession.serving, "taking over"),
            (not self.leftovers.empty, "processes children left"),
        )
        yield from (Due(now, why) for busy, why in stepping if busy)
        for pool in self.fleet.groups.values():
            if (spawn := pool.next_spawn(now)) is not None:
                yield spawn
        yield from next_due(self.fleet.pools(), self.config.supervisor, now)
        if (watchdog := self.status.next_due()) is not None:
            yield watchdog
        if (publish := self.control.next_publish()) is not None:
            yield Due(publish, "status snapshot")

    def _heard_trouble(self, child: ChildProcess) -> bool:
        """A heartbeat reported what the deadlines act on: tick now, not when due."""
        pool = self.fleet.groups.get(child.group)
        return pool is not None and reported_trouble(child, pool.config)

    def _read_events(self, wakeup_r: int, timeout: float) -> bool:
        """Wait up to `timeout` for signals and child messages; True if one of them
        needs the tick's steps now rather than at the next tick."""
        urgent = False
        for key, _ in self.selector.select(timeout):
            if key.fd == wakeup_r:
                self._drain_wakeup(wakeup_r)
                urgent = True
            elif self.wakes is not None and key.fd == self.wakes.fd:
                self._send_wakes(self.wakes.take())
            elif self.upgrade is not None and key.fd == self.upgrade.link_fd:
                self._read_successor()
                urgent = True
            elif self.succession is not None and key.fd == self.succession.link_fd:
                self._read_predecessor()
                urgent = True
            else:
                urgent |= self.channels.read(key.fd)
        return urgent

    def _send_wakes(self, notified: dict[str, int]) -> None:
        """Each notification to one child with room of each group claiming from its
        queue, in turn, or to all of the group's children when none has room
        (wakerouting.py). A child whose control pipe is backed up is skipped (it
        polls, see wakerelay.py)."""
        settled = notified.pop(SETTLED, 0)
        children = self._wakeable()
        deliver(self.wake_router.route(notified, children))
        if settled:
            # Tasks settled somewhere: room, perhaps, for the children a limit holds
            # back, which a LISTEN of their own would have heard (docs/limits.md).
            limited = limited_groups(self.config)
            deliver((c, (SETTLED,)) for c in children if c.group in limited)

    def _room_changed(self, child: ChildProcess) -> None:
        """A child said whether it has room, or was reaped: what it was sent alone
        goes to another if it has none (wakerouting.py)."""
        deliver(self.wake_router.room_changed(child, self._wakeable()))

    def _wakeable(self) -> list[ChildProcess]:
        return [c for c in self.channels.live() if not backed_up(c.control.fd)]

    def _group_queues(self, name: str) -> tuple[str, ...]:
        group = self.config.groups.get(name)
        return tuple(group.queues) if group is not None else ()

    def _tick(self) -> bool:
        """The loop's named steps; True once the parent should exit."""
        self._reap()
        self.fleet.check_ownership(self.channels.live())
        now = time.monotonic()
        late_s = self.cadence.late_s(now)
        if late_s > PARENT_STALL_S:
            # We were stopped or starved, not the children: their silence was ours.
            log.warning("the supervisor loop stalled for %.1fs", late_s)
            forgive_silence(self.fleet.pools(), now)
        check_deadlines(self.fleet.pools(), self.config.supervisor)
        self._keep_runtime_files(now)
        if self.stopping:
            if self._stop_step():
                return True
        else:
            self._keep_pools()
            self._advance_rolls()
            self.reload.advance()
            self._advance_succession(now)
            if self.fleet.all_fatal():
                return True
        self._report()
        return False

    def _keep_runtime_files(self, now: float) -> None:
        """Put the lock, state file and control socket back when the runtime directory
        lost them (logind removes $XDG_RUNTIME_DIR at its user's last logout, a /tmp
        cleaner removes old files): without them `reload`, `status` and `stop` cannot
        find this daemon, and nothing keeps a second one off the config."""
        if now < self._runtime_check_at:
            return
        self._runtime_check_at = now + _RUNTIME_CHECK_S
        if self.upgrade is not None and self.upgrade.active and not self.handed_over:
            return  # the successor shares the lock we hold; its outcome decides
        lost = self.statefile.lost()
        if lost is None:
            self._runtime_trouble = None
            return
        if lost == "lock":
            try:
                self.statefile.restore()
            except AlreadyRunning as exc:
                self._runtime_problem(
                    logging.CRITICAL,
                    f"the runtime directory {self.statefile.directory} lost this daemon's "
                    f"lock, and another daemon took it since: {exc}; two daemons run "
                    f"{self.config_path}: stop one",
                )
                return
            except (OSError, UnsafeRuntimeDir) as exc:
                self._runtime_problem(
                    logging.ERROR,
                    f"the runtime directory {self.statefile.directory} lost this daemon's "
                    f"lock and it cannot be made again ({exc}): `cairnqd reload`, `status` "
                    "and `stop` cannot find this daemon; trying again",
                )
                return
            self.control.stop()
            self._start_control()
        try:
            self.statefile.write(self.state)
        except OSError as exc:  # a full runtime directory: said once, tried again
            self._runtime_problem(logging.ERROR, f"cannot write the state file: {exc}")
            return
        self._runtime_trouble = None
        what = "lock, state file and control socket" if lost == "lock" else "state file"
        log.warning("the runtime directory %s lost this daemon's %s: made again",
                    self.statefile.directory, what)  # fmt: skip

    def _runtime_problem(self, level: int, message: str) -> None:
        """Log a runtime directory problem once, not on every look."""
        if message != self._runtime_trouble:
            log.log(level, "%s", message)
        self._runtime_trouble = message

    def _finish(self) -> int:
        systemd.stopping("stopped")
        self.leftovers.kill_all()  # only when every group went FATAL: a stop waits for them
        if self.dashboard is not None:
            self.dashboard.stop()
        if self.dashboard_data is not None:
            self.dashboard_data.stop()
        self.scheduler.stop(timeout_s=5.0)
        if self.wakes is not None:
            self.wakes.stop()
        self.maintenance.stop(timeout_s=10.0)
        self.metrics.close()
        if self.exit_code is not None:
            return self.exit_code
        if self.stopping:
            return OK
        # Every group is FATAL, and only a child that cannot boot makes one so: a
        # restart would fail the same way (systemd's RestartPreventExitStatus=78).
        return CONFIG

    # -- signals -------------------------------------------------------------------------

    def _install_signals(self) -> int:
        wakeup_r, wakeup_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wakeup_w, warn_on_full_buffer=False)
        for sig in _HANDLED:
            signal.signal(sig, self._enqueue_signal)
        for sig in (signal.SIGTTOU, signal.SIGWINCH, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN)
        self.selector.register(wakeup_r, selectors.EVENT_READ)
        return wakeup_r

    def _enqueue_signal(self, signum: int, _frame: object) -> None:
        self.signals.append(signum)
        if self._starting and signum in _STOPS:
            # No child exists yet, and the preflight may wait on an import that never
            # ends: stop now (the probe is killed as the exception unwinds through it).
            # Queued too, so that the loop still drains if anything swallowed it.
            self._starting = False
            raise _StoppedWhileStarting(signum)

    @staticmethod
    def _drain_wakeup(fd: int) -> None:
        try:
            while os.read(fd, 4096):
                pass
        except BlockingIOError:
            pass

    def _dispatch_signals(self) -> None:
        while self.signals:
            signum = self.signals.popleft()
            handler = getattr(self, f"handle_{signal.Signals(signum).name.lower()}", None)
            if handler is not None:
                handler()

    def handle_sigterm(self) -> None:
        if self.stopping:
            log.info("already stopping; ignoring SIGTERM")
            return
        self._begin_drain("SIGTERM")

    def handle_sigint(self) -> None:
        if self.stopping:
            log.warning("second SIGINT: stopping now")
            self._begin_hard_stop()
            return
        self._begin_drain("SIGINT")

    def handle_sigquit(self) -> None:
        log.warning("SIGQUIT: stopping now")
        if not self.stopping:
            self._begin_drain("SIGQUIT")
        self._begin_hard_stop()

    def handle_sighup(self) -> None:
        self._request_reload(roll_all=False)

    def handle_sigusr2(self) -> None:
        self._request_reload(roll_all=True)

    def _request_reload(self, *, roll_all: bool) -> None:
        busy = self._upgrade_under_way()
        if busy is not None:
            log.error("reload refused: %s", busy)
            self.record_reload(False, [f"{busy}; reload refused"])
            return
        self.reload.request(roll_all=roll_all)

    def handle_sigurg(self) -> None:
        self._begin_upgrade()

    def handle_sigusr1(self) -> None:
        # logrotate's postrotate signal: reopen first, so the status lands in the new
        # file, then have every child reopen its own handler (each opened the file).
        reopen_logs()
        for child in self.all_children():
            child.control.send_whole(encode(ReopenLogs()))
        log.info("status:\n%s", self.status_dump())

    def handle_sigtstp(self) -> None:
        log.warning("SIGTSTP: children stop claiming (quiet) until reload or restart")
        self.quiet = True
        for child in self.all_children():
            child.signal(signal.SIGUSR1)
        systemd.status("quiet")

    def _end_quiet(self) -> None:
        """A reload after SIGTSTP: every child claims again. Groups that roll get new
        children, which claim anyway; the ones that stay are told over their pipe."""
        if not self.quiet:
            return
        self.quiet = False
        log.info("reload: ending the SIGTSTP quiet; children claim again")
        line = encode(Claiming(on=True))
        for child in self.all_children():
            child.control.send_whole(line)

    def handle_sigttin(self) -> None:
        import faulthandler

        faulthandler.dump_traceback(all_threads=True)
        for child in self.all_children():
            child.signal(signal.SIGTTIN)

    def handle_sigchld(self) -> None:
        pass  # the wakeup already made the loop reap

    # -- children: pipes and exits -------------------------------------------------------

    def all_children(self) -> list[ChildProcess]:
        return self.fleet.children()

    def spawn(self, group: GroupConfig, slot: int, generation: int) -> ChildProcess:
        wake_lock = wake_lock_path(self.statefile.path, group.name)
        child = spawn_child(self.config, group, slot, generation, wake_lock)
        if self.quiet:  # a replacement during a SIGTSTP quiet stays quiet too
            child.control.send_whole(encode(Claiming(on=False)))
        self.channels.add(child)
        log.info("spawned %s/%d pid %d (gen %d)", group.name, slot, child.pid, generation)
        return child

    def _reap(self) -> None:
        for child, code in self.channels.reap():
            owner = f"child {child.pid} of {child.group}"
            self.leftovers.sweep(child.pid, owner, time.monotonic())
            self.exits.on_exit(child, code, stopping=self.stopping)
        self.leftovers.check(time.monotonic(), {c.pid for c in self.channels.live()})

    # -- pools ---------------------------------------------------------------------------

    def fatal_groups(self) -> list[str]:
        return self.fleet.fatal_groups()

    def rolling(self) -> bool:
        return self.fleet.rolling()

    def apply_reload(self, plan: ReloadPlan) -> None:
        """Switch to `plan.config`: parent-hot settings in place, then the pools."""
        before = self.config
        config = self.config = plan.config
        if plan.new_generation:
            self.generation += 1
        self._forward_logging()
        self._forward_limits(before)
        if self.wakes is not None:
            self.wakes.watch_settled(bool(config.limits))
        self._forward_cancel_grace(before)
        if self.dashboard is not None:
            # Its groups, schedules and limits as reloaded; its address and database
            # are restart-only.
            self.dashboard.data.config = config
        self._end_quiet()
        self.maintenance.reconfigure(config)
        self.metrics.apply_config(config)
        self.scheduler.reconfigure(config)
        self._retire(self.fleet.apply(plan))

    def record_reload(self, ok: bool, errors: list[str], changes: Sequence[str] = ()) -> None:
        """Publish a reload's outcome: state file (for `reload --wait`), metrics, systemd."""
        self.state = after_reload(
            self.state, ok=ok, errors=errors, generation=self.generation, changes=changes
        )
        self.metrics.reload_result(ok, self.generation)
        self.write_state()
        status = f"generation {self.generation}" if ok else f"reload failed: {errors[0]}"
        systemd.notify("READY=1", f"STATUS={status}")

    def _forward_logging(self) -> None:
        """Children apply reloaded logging settings in place; children spawned later
        get them in their boot message."""
        line = encode(SetLogging(logging_settings(self.config.logging)))
        for child in self.all_children():
            child.control.send_whole(line)

    def _forward_limits(self, before: Config) -> None:
        """Children keep reloaded `limits:` from their next claim on (no roll);
        children spawned later get them in their boot message."""
        specs = limit_specs(self.config)
        if specs == limit_specs(before):
            return
        line = encode(SetLimits(specs))
        for child in self.all_children():
            child.control.send_whole(line)
        log.info("limits reloaded: %s", ", ".join(sorted(specs)) or "none")

    def _forward_cancel_grace(self, before: Config) -> None:
        """Children keep a reloaded `cancel_grace` from now on (no roll); children
        spawned later get it in their boot message."""
        for name, group in self.config.groups.items():
            was = before.groups.get(name)
            if was is None or was.cancel_grace == group.cancel_grace:
                continue
            line = encode(SetCancelGrace(group.cancel_grace.total_seconds()))
            for child in self.all_children():
                if child.group == name:
                    child.control.send_whole(line)

    def _advance_rolls(self) -> None:
        surge = self.config.reload.max_surge
        replaced = self.fleet.advance_rolls(surge, self.spawn, self.generation)
        self._retire(replaced)
        for pool, _ in replaced:
            self.metrics.child_restart(pool.name, "reload")

    def _retire(self, children: Retiring) -> None:
        """Stop children their pool no longer wants (shrink, roll, removed group):
        they stop claiming and finish what they hold, within their group's
        `shutdown_timeout` (then the deadlines stop them hard)."""
        now = time.monotonic()
        for pool, child in children:
            child.retire(now, self._drain_timeout_s(pool))

    def _keep_pools(self) -> None:
        starting = self.succession is not None and not self.succession.serving
        admitted = self.succession.admitted if self.succession and starting else None
        self.fleet.fill(self.spawn, self.generation, only=admitted)
        for group in self.fleet.groups.values():
            self.metrics.set_children(group.name, group.state_counts())
            self.metrics.set_group_state(group.name, group.state)

    # -- stopping ------------------------------------------------------------------------

    def _begin_drain(self, why: str) -> None:
        if why != "SIGQUIT":  # QUIT stops at once; its own line says so
            log.info("%s: draining (stop claiming, finish in-flight tasks)", why)
        if self.upgrade is not None and self.upgrade.state == "starting":
            self._upgrade_failed([f"the running parent was stopped ({why}) during the upgrade"])
        if self.succession is not None and not self.succession.serving:
            self._abandon_succession([f"the new parent was stopped ({why}) before it took over"])
        self.stopping = True
        systemd.stopping("draining")
        self.maintenance.pause_purge()
        self.scheduler.pause()  # another host takes the schedules over at once
        now = time.monotonic()
        for pool in self.fleet.pools():
            for child in pool.children():
                child.retire(now, self._drain_timeout_s(pool))

    def _begin_hard_stop(self) -> None:
        now = time.monotonic()
        for child in self.all_children():
            child.quit(now)
        if self.upgrade is not None and self.upgrade.active and not self.handed_over:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.upgrade.pid, signal.SIGQUIT)

    def _stop_step(self) -> bool:
        """True once every child is gone (the deadlines stop the slow ones), and what
        their handlers started too (`leftovers`), and a successor that never took over."""
        successor = self.upgrade is not None and self.upgrade.active and not self.handed_over
        return not self.all_children() and self.leftovers.empty and not successor

    def _drain_timeout_s(self, pool: GroupPool) -> float:
        """How long a child of `pool` may drain: its group's `shutdown_timeout`."""
        return (pool.config.shutdown_timeout or self.config.shutdown_timeout).total_seconds()

    # -- binary upgrade: the running parent's side -------------------------------------

    @property
    def handed_over(self) -> bool:
        return self.upgrade is not None and self.upgrade.state == "handed_over"

    def _upgrade_under_way(self) -> str | None:
        """Why a reload or another upgrade must wait, or None."""
        if self.upgrade is not None and self.upgrade.state == "starting":
            return f"an upgrade is in progress (new parent pid {self.upgrade.pid})"
        if self.succession is not None and not self.succession.serving:
            return f"this parent is taking over from pid {self.succession.from_pid}"
        return None

    def _begin_upgrade(self) -> None:
        """SIGURG: start the installed code as our successor (`upgrade.py`)."""
        if self.stopping:
            log.info("stopping; upgrade ignored")
            return
        refusal = self._upgrade_under_way()
        if refusal is None and self.upgrade is not None and self.upgrade.active:
            refusal = f"the last attempt's new parent (pid {self.upgrade.pid}) is still stopping"
        if refusal is None and self.reload.busy:
            refusal = "a reload is in progress; upgrade once it has finished"
        lock_fd = self.statefile.lock_fd
        if refusal is None and lock_fd is None:
            refusal = "this parent does not hold the state file's lock"
        if refusal is not None:
            log.error("upgrade refused: %s", refusal)
            self._record_upgrade([f"upgrade refused: {refusal}"])
            return
        assert lock_fd is not None
        listeners = {}
        if (sock := self.metrics.listening_socket) is not None:
            listeners["metrics"] = sock
        if self.dashboard is not None and (sock := self.dashboard.listening_socket) is not None:
            listeners["dashboard"] = sock
        try:
            self.upgrade = start_successor(
                self.relaunch,
                lock_fd=lock_fd,
                state_path=self.statefile.path,
                listeners=listeners,
                state=self.state,
                version=__version__,
            )
        except OSError as exc:
            log.error("upgrade failed: cannot start the installed cairnqd: %s", exc)
            self._record_upgrade([f"cannot start the installed cairnqd: {exc}"])
            return
        self.selector.register(self.upgrade.link_fd, selectors.EVENT_READ)
        self.channels.watch(self.upgrade.pid, self._successor_exited)
        self.status.note = f"upgrading: new parent pid {self.upgrade.pid}"
        systemd.status(f"upgrading: new parent pid {self.upgrade.pid}")

    def _read_successor(self) -> None:
        upgrade = self.upgrade
        assert upgrade is not None
        for message in upgrade.read():
            if message.kind == "hello":
                log.info(
                    "upgrade: pid %d runs cairnqd %s (pipe protocol %s), generation %s",
                    upgrade.pid, upgrade.version, upgrade.pipe_protocol, upgrade.generation,
                )  # fmt: skip
            elif message.kind == "progress":
                group = message.fields.get("group")
                ready, of = upgrade.progress.get(str(group), (0, 0))
                log.info("upgrade: group %s: %d/%d children ready under pid %d",
                         group, ready, of, upgrade.pid)  # fmt: skip
        if upgrade.state == "handing_over":
            self._hand_over()
        elif upgrade.state == "failed":
            self._upgrade_failed(upgrade.errors)
        elif upgrade.reader.closed:
            self._drop_successor_link()  # its exit says the rest

    def _successor_exited(self, code: int) -> None:
        upgrade = self.upgrade
        assert upgrade is not None
        was = upgrade.state
        upgrade.exited(code)
        if was == "starting":
            self._upgrade_failed(upgrade.errors)
        elif was == "handed_over":
            ended = describe_exit(code)
            log.warning("upgrade: our successor (pid %d) ended (%s)", upgrade.pid, ended)
        else:
            ended = describe_exit(code)
            log.info("upgrade: the abandoned new parent (pid %d) ended (%s)", upgrade.pid, ended)

    def _hand_over(self) -> None:
        """The successor has every group ready: it serves from now on, we retire."""
        upgrade = self.upgrade
        assert upgrade is not None
        # Our listeners first: the control socket's path is the successor's to bind.
        self.control.stop()
        self.metrics.stop_serving()
        if self.dashboard is not None:
            self.dashboard.stop()
            self.dashboard = None
        if self.dashboard_data is not None:
            self.dashboard_data.stop()
            self.dashboard_data = None
        if not upgrade.hand_over():
            # It died between `ready` and now: its exit fails the upgrade, and we serve on.
            self._restart_serving()
            return
        self.statefile.hand_over()
        systemd.main_pid(upgrade.pid)
        for name in SYSTEMD_ONLY_VARS:  # from now on only the successor talks to systemd
            os.environ.pop(name, None)
        self.status.watchdog_every = None
        self._drop_successor_link()
        self.status.note = f"retiring: handed over to pid {upgrade.pid}"
        log.info(
            "upgrade: handed over to pid %d (cairnqd %s); this parent (cairnqd %s) drains "
            "its %d children and exits",
            upgrade.pid, upgrade.version, __version__, len(self.all_children()),
        )  # fmt: skip
        self._begin_drain(f"upgrade to pid {upgrade.pid}")

    def _restart_serving(self) -> None:
        """Serve again what `_hand_over` let go of, when the successor vanished."""
        try:
            self._serve_metrics()
            self._start_dashboard()
        except (MetricsBindError, DashboardBindError) as exc:
            log.error("after the failed upgrade: %s", exc)
        self._start_control()

    def _upgrade_failed(self, errors: Sequence[str]) -> None:
        upgrade = self.upgrade
        assert upgrade is not None
        upgrade.fail(errors)
        self._drop_successor_link()
        for line in upgrade.errors:
            log.error("upgrade failed: %s", line)
        log.error("upgrade failed; still running cairnqd %s (pid %d)", __version__, os.getpid())
        self.status.note = ""
        self._record_upgrade(upgrade.errors)

    def _drop_successor_link(self) -> None:
        upgrade = self.upgrade
        if upgrade is None or upgrade.link_fd < 0:
            return
        self.selector.unregister(upgrade.link_fd)
        upgrade.close_link()

    def _record_upgrade(self, errors: Sequence[str]) -> None:
        """A failed or refused upgrade, for `cairnqd upgrade --wait`."""
        self.state = after_upgrade(
            self.state, ok=False, errors=errors, from_version=__version__, from_pid=os.getpid()
        )
        self.write_state()

    # -- binary upgrade: the successor's side --------------------------------------------

    def _run_as_successor(self) -> int:
        succession = self.succession
        assert succession is not None
        inheritance = succession.inheritance
        self._create_sqlite_file()
        self.metrics.reload_result(True, self.generation)  # the config, as loaded now
        wakeup_r = self._start()
        self.selector.register(inheritance.link_fd, selectors.EVENT_READ)
        succession.hello(
            version=__version__, pipe_protocol=PROTOCOL_VERSION, generation=self.generation
        )
        self.status.note = f"taking over from pid {inheritance.from_pid}"
        log.info(
            "upgrade: cairnqd %s taking over from pid %d (cairnqd %s); starting %d group(s) "
            "one by one beside its children",
            __version__, inheritance.from_pid, inheritance.from_version, len(self.fleet.groups),
        )  # fmt: skip
        self._loop(wakeup_r)
        return self._finish()

    def _read_predecessor(self) -> None:
        succession = self.succession
        assert succession is not None
        news = succession.read()
        if news is not None or succession.reader.closed:
            # Nothing more comes over the link once it has spoken or closed.
            self.selector.unregister(succession.link_fd)
            succession.close()
        if news == "yours":
            self._promote()
        elif news == "gone" and succession.orphaned():
            log.warning("upgrade: the running parent (pid %d) died before handing over; "
                        "serving in its place", succession.from_pid)  # fmt: skip
            succession.promote_orphan()
            self._promote()
        elif news == "gone":
            self._abandon_succession(
                [f"the running parent (pid {succession.from_pid}) ended the upgrade"]
            )
            self._begin_drain("upgrade abandoned")

    def _advance_succession(self, now: float) -> None:
        if self.succession is None or self.succession.serving:
            return
        errors = self.succession.step(self.fleet.groups, now)
        if errors:
            self._abandon_succession(errors)
            self._begin_drain("upgrade abandoned")

    def _abandon_succession(self, errors: Sequence[str]) -> None:
        """Give up taking over: tell the running parent why and exit 75 once drained."""
        if self.succession is None or self.succession.serving:
            return
        self.succession.abort(errors)
        self.exit_code = TEMPFAIL

    def _promote(self) -> None:
        """The running parent let go: serve what it served, own the state, tell systemd."""
        succession = self.succession
        assert succession is not None
        inheritance = succession.inheritance
        os.environ.update(inheritance.systemd)
        if "WATCHDOG_USEC" in inheritance.systemd:
            os.environ["WATCHDOG_PID"] = str(os.getpid())
        self.statefile.promote()
        listeners = dict(inheritance.listeners)
        try:
            self._serve_metrics(self._adopt(listeners.pop("metrics", None), "metrics"))
        except MetricsBindError as exc:
            log.error("upgrade: %s; no metrics until a restart", exc)
        try:
            self._start_dashboard(self._adopt(listeners.pop("dashboard", None), "dashboard"))
        except DashboardBindError as exc:
            log.error("upgrade: %s; no dashboard until a restart", exc)
        for fd in listeners.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._start_control()
        inherited = cast(DaemonState, {**inheritance.state})
        inherited = {**inherited, "config": self.config_path, "generation": self.generation}
        self.state = after_upgrade(
            inherited,
            ok=True,
            errors=[],
            from_version=inheritance.from_version,
            from_pid=inheritance.from_pid,
        )
        self.write_state()
        self.status.note = ""
        self.status.take_over_systemd(f"generation {self.generation}: upgraded to {__version__}")
        log.info(
            "upgrade: cairnqd %s (pid %d) serves now, generation %d; pid %d (cairnqd %s) "
            "drains its children",
            __version__, os.getpid(), self.generation, inheritance.from_pid,
            inheritance.from_version,
        )  # fmt: skip

    def _adopt(self, fd: int | None, use: str) -> socket.socket | None:
        """The inherited listening socket for `use` (metrics, dashboard) if the config
        still listens there; else None, and the listener binds afresh."""
        if fd is None:
            return None
        listen = self.config.metrics.listen if use == "metrics" else self.config.dashboard.listen
        if listen is None:
            os.close(fd)
            return None
        return adopt(fd, listen.host, listen.port)

    # -- reporting -----------------------------------------------------------------------

    def _report(self) -> None:
        self.status.tick(
            self.fleet.groups.values(),
            self.all_children(),
            generation=self.generation,
            stopping=self.stopping,
        )
        self.control.publish_due(self._control_view)

    def _control_view(self) -> Snapshot:
        """What `cairnqd status` shows: built on this loop, served by another thread."""
        view = self._daemon_view()
        # How often the loop runs its steps, and what it last planned them for.
        view["loop"] = {"ticks": self.cadence.ticks, "planned_for": self.cadence.next.why}
        if self.upgrade is not None and self.upgrade.state == "starting":
            view["upgrade"] = self.upgrade.describe()
        return view

    def _daemon_view(self) -> Snapshot:
        return daemon_view(
            instance=self.config.instance_name(),
            config_path=self.config_path,
            generation=self.generation,
            started_at=self.started_at,
            stopping=self.stopping,
            quiet=self.quiet,
            groups=self.fleet.groups.values(),
            removed=self.fleet.removed,
            restarts=restarts_by_group(self.metrics.child_restarts.collect()),
            shutdown_timeout_s=self.config.shutdown_timeout.total_seconds(),
        )

    def _database_problems(self) -> list[str]:
        """Database trouble the parent's own threads ran into (from any thread)."""
        found = (
            self.maintenance.database_problem(),
            self.metrics.database.problem(),
            self.scheduler.database_problem(),
        )
        return [problem for problem in found if problem]

    def _processes_without_database(self) -> int:
        """The parent (its maintenance thread) and children that cannot reach the
        database now; `cairnq_db_up` is 0 while any can't (from any thread)."""
        parent = 1 if self.maintenance.database_down_s() > 0 else 0
        return parent + self.status.children_without_database()

    def write_state(self) -> None:
        if not self.statefile.owned:
            return  # a successor not yet serving, or a parent that handed over
        try:
            self.statefile.write(self.state)
        except OSError as exc:
            log.error("cannot write the state file: %s", exc)

    def status_dump(self) -> str:
        return status_dump(
            self.fleet.groups.values(),
            self.fleet.removed,
            generation=self.generation,
            stopping=self.stopping,
        )


def run_daemon(config_path: str, config: Config, *, log_level: str | None = None) -> int:
    """Run the daemon until it stops; `log_level` is the command line's override, which a
    successor started by a binary upgrade keeps."""
    # Before anything is created: the SQLite file (payloads), its -wal and -shm, the
    # log file and the state files are the daemon user's alone. Children inherit it.
    os.umask(0o077)
    try:
        inheritance = take_inheritance()
    except InheritanceError as exc:
        print(f"cairnqd: cannot take over: {exc}", file=sys.stderr)
        return CONFIG
    try:
        configure_logging(config.logging, process_label=PARENT_LABEL)
    except LoggingSetupError as exc:
        print(f"cairnqd: {exc}", file=sys.stderr)
        if inheritance is not None:
            report_failed_start([str(exc)], inheritance)
        return CONFIG
    setproctitle(f"cairnqd: master [{os.path.abspath(config_path)}] starting")
    supervisor = Supervisor(config_path, config, log_level=log_level, inheritance=inheritance)
    return supervisor.run()
