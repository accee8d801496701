"""The parent process: `cairnqd -c cairnq.yaml`.

Design note. One thread runs one `selectors` loop over the signal wakeup fd and every
child's events pipe. Signal handlers only record the signal number; `run()` then
reads as named steps: dispatch signals, read pipes, reap children, check deadlines,
keep each pool at size, report status. Database work never runs here: the
maintenance thread owns a connection (reaper, hand-back, purge) and the metrics
thread another, so a stalled database can never stall reaping, signals or the
systemd watchdog.

Beside it: `reload` (SIGHUP, SIGUSR2 and the rolls they start), `deadlines` (boot,
heartbeat, max_run), `status` (process title, sd_notify, /healthz, the SIGUSR1 dump)
and `connection_budget` (the start-up check against max_connections).

When a child dies without saying goodbye, the parent hands its tasks back at once
(`release_worker`, scoped by the dead child's worker_id and run only after waitpid),
so they are claimable in milliseconds instead of after the lease expires.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import sys
import time
from collections import deque

from setproctitle import setproctitle

from cairnqd.config import Config, GroupConfig
from cairnqd.daemon import systemd
from cairnqd.daemon.connection_budget import check_connection_budget
from cairnqd.daemon.deadlines import check_deadlines
from cairnqd.daemon.exitcodes import CONFIG, OK, TEMPFAIL
from cairnqd.daemon.fleet import Fleet, Retiring
from cairnqd.daemon.logs import (
    LoggingSetupError,
    configure_logging,
    logging_settings,
    reopen_logs,
)
from cairnqd.daemon.maintenance import Maintenance
from cairnqd.daemon.messages import (
    ChildMessage,
    Fatal,
    Goodbye,
    MessageError,
    Ready,
    ReopenLogs,
    SetLogging,
    decode_child,
    encode,
)
from cairnqd.daemon.metrics import Metrics
from cairnqd.daemon.pipes import PipeError
from cairnqd.daemon.pool import ChildProcess, GroupPool, Slot, spawn_child
from cairnqd.daemon.reload import ConfigReload, ReloadPlan
from cairnqd.daemon.runtimedir import UnsafeRuntimeDir
from cairnqd.daemon.statefile import (
    AlreadyRunning,
    StateFile,
    after_reload,
    initial_state,
    state_path,
)
from cairnqd.daemon.status import StatusReport, status_dump

log = logging.getLogger("cairnqd.supervisor")

_HANDLED = (
    signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1,
    signal.SIGUSR2, signal.SIGTSTP, signal.SIGTTIN, signal.SIGCHLD,
)  # fmt: skip
#: The parent's process label in log lines; a child's is `[group] slot/slots`.
PARENT_LABEL = "master"
# Child messages that change what the loop must do next (the rest are task events).
_STATE_EVENTS = (Ready, Goodbye, Fatal)
# A child that keeps writing garbage gets one log line per this many seconds.
_MALFORMED_LOG_EVERY_S = 10.0
_TICK_S = 0.1


class Supervisor:
    def __init__(self, config_path: str, config: Config) -> None:
        self.config_path = os.path.abspath(config_path)
        self.config = config
        self.generation = 1
        self.fleet = Fleet(config)
        self.by_fd: dict[int, ChildProcess] = {}
        self.by_pid: dict[int, ChildProcess] = {}
        self.selector = selectors.DefaultSelector()
        self.signals: deque[int] = deque()
        self.stopping = False
        self.reload = ConfigReload(self, process_label=PARENT_LABEL)
        self._ownership_logged: set[str] = set()
        self.status = StatusReport(self.config_path, self._database_problems)
        self.metrics = Metrics(config)
        self.maintenance = Maintenance(config, self.metrics)
        self.statefile = StateFile(state_path(self.config_path, config.runtime_dir))
        self.state = initial_state(self.config_path)

    # -- lifecycle ---------------------------------------------------------------------

    def run(self) -> int:
        try:
            self.statefile.acquire()
        except AlreadyRunning as exc:
            log.error("%s", exc)
            return TEMPFAIL
        except UnsafeRuntimeDir as exc:
            log.error("%s", exc)
            return CONFIG
        except OSError as exc:
            log.error("cannot take the lock in %s: %s", self.statefile.directory, exc)
            return CONFIG
        try:
            return self._run()
        finally:
            self.statefile.release()

    def _run(self) -> int:
        refusal = check_connection_budget(self.config)
        if refusal is not None:
            log.error("%s", refusal)
            return CONFIG
        wakeup_r = self._start()
        self._loop(wakeup_r)
        return self._finish()

    def _start(self) -> int:
        """Signals, the metrics endpoint, maintenance and the (empty) pools; returns the
        signal wakeup fd. Children are spawned by the first tick."""
        wakeup_r = self._install_signals()
        listen = self.config.metrics.listen
        if listen is not None:
            port = self.metrics.serve(listen.host, listen.port, health=self.status.health)
            log.info("metrics on http://%s:%d/metrics", listen.host, port)
        self.maintenance.start()
        self.write_state()
        log.info(
            "cairnqd started: %s, %d group(s), generation %d",
            self.config.database.backend, len(self.fleet.groups), self.generation,
        )  # fmt: skip
        return wakeup_r

    def _loop(self, wakeup_r: int) -> None:
        next_housekeeping = 0.0
        while True:
            timeout = max(0.0, next_housekeeping - time.monotonic())
            urgent = self._read_events(wakeup_r, timeout)
            self._dispatch_signals()
            # Task events arrive thousands of times a second; the steps below only
            # need to run on a signal, a child's change of state, or every tick.
            now = time.monotonic()
            if not urgent and now < next_housekeeping:
                continue
            next_housekeeping = now + _TICK_S
            if self._tick():
                return

    def _read_events(self, wakeup_r: int, timeout: float) -> bool:
        """Wait up to `timeout` for signals and child messages; True if one of them
        needs the tick's steps now rather than at the next tick."""
        urgent = False
        for key, _ in self.selector.select(timeout):
            if key.fd == wakeup_r:
                self._drain_wakeup(wakeup_r)
                urgent = True
            else:
                urgent |= self._read_child(key.fd)
        return urgent

    def _tick(self) -> bool:
        """The loop's named steps; True once the parent should exit."""
        self._reap()
        self._check_ownership()
        check_deadlines(self.fleet.pools(), self.config.supervisor)
        if self.stopping:
            if self._stop_step():
                return True
        else:
            self._keep_pools()
            self._advance_rolls()
            self.reload.advance()
            if self.fleet.all_fatal():
                return True
        self._report()
        return False

    def _finish(self) -> int:
        systemd.stopping("stopped")
        self.maintenance.stop(timeout_s=10.0)
        self.metrics.close()
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
        self.reload.request(roll_all=False)

    def handle_sigusr2(self) -> None:
        self.reload.request(roll_all=True)

    def handle_sigusr1(self) -> None:
        # logrotate's postrotate signal: reopen first, so the status lands in the new
        # file, then have every child reopen its own handler (each opened the file).
        reopen_logs()
        for child in self.all_children():
            child.control.send_whole(encode(ReopenLogs()))
        log.info("status:\n%s", self.status_dump())

    def handle_sigtstp(self) -> None:
        log.warning("SIGTSTP: children stop claiming (quiet) until reload or restart")
        for child in self.all_children():
            child.signal(signal.SIGUSR1)
        systemd.status("quiet")

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
        child = spawn_child(self.config, group, slot, generation)
        self.by_fd[child.events.fd] = child
        self.by_pid[child.pid] = child
        self.selector.register(child.events.fd, selectors.EVENT_READ)
        log.info("spawned %s/%d pid %d (gen %d)", group.name, slot, child.pid, generation)
        return child

    def _read_child(self, fd: int) -> bool:
        """Handle what a child sent; True if its state changed (ready, bye, fatal,
        closed pipe), which the loop acts on at once rather than at the next tick."""
        child = self.by_fd.get(fd)
        if child is None:
            return False
        try:
            lines = child.events.read_lines()
        except PipeError as exc:
            log.error("child %d sent garbage (%s); killing it", child.pid, exc)
            child.kill_reason = "protocol"
            child.signal(signal.SIGKILL)
            lines = []
        changed = False
        for line in lines:
            # The one guard on what a child writes: past it, every field is typed.
            try:
                message = decode_child(line)
            except MessageError as exc:
                self._on_malformed(child, exc)
                continue
            self._on_event(child, message)
            changed |= isinstance(message, _STATE_EVENTS)
        if child.events.closed:
            self._forget_fd(child)
            changed = True
        return changed

    def _forget_fd(self, child: ChildProcess) -> None:
        if self.by_fd.pop(child.events.fd, None) is not None:
            self.selector.unregister(child.events.fd)

    def _on_malformed(self, child: ChildProcess, error: MessageError) -> None:
        """Count a line that is no valid message; log it, at most once per interval."""
        if child.count_malformed(time.monotonic(), _MALFORMED_LOG_EVERY_S):
            log.warning(
                "child %d of %s wrote a malformed message (%d so far): %s",
                child.pid, child.group, child.malformed, error,
            )  # fmt: skip

    def _on_event(self, child: ChildProcess, message: ChildMessage) -> None:
        child.on_message(message, time.monotonic())
        self.metrics.record_event(child.group, child.slot, message)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.by_pid.pop(pid, None)
            if child is None:
                continue  # not ours (a handler's grandchild reparented to us?)
            child.proc.returncode = os.waitstatus_to_exitcode(status)
            self._read_child(child.events.fd)  # the last words (bye, fatal, end)
            self._forget_fd(child)
            child.close_pipes()
            self._on_exit(child, child.proc.returncode)

    def _on_exit(self, child: ChildProcess, code: int) -> None:
        where = self.fleet.detach(child)
        self._forget_slot_series(child)
        planned = code == OK and child.bye is not None
        if not planned:
            self.maintenance.hand_back(child.worker_id, self._handback_reason(child))
        described = describe_exit(code)
        group = where.pool
        if group is None:
            log.info("child %d of removed group %s exited (%s)", child.pid, child.group, described)
        elif planned:
            log.info("child %d of %s exited (%s)", child.pid, group.name, child.bye)
            if child.bye not in ("drain", None):
                self.metrics.child_restart(group.name, str(child.bye))
        elif child.quit_sent_at is not None:
            log.info("child %d of %s stopped (%s)", child.pid, group.name, described)
        elif where.role == "successor" and where.slot is not None:
            self._on_failed_successor(group, where.slot, child, described)
        elif code == CONFIG or child.fatal is not None:
            self._on_cannot_boot(group, child, described)
        else:
            self._on_crash(group, where.slot if where.role == "slot" else None, child, described)

    def _on_failed_successor(
        self, group: GroupPool, slot: Slot, child: ChildProcess, described: str
    ) -> None:
        """A roll's new child ended before it took its slot: the roll stops there, the
        slot keeps its old child, and the reload is reported failed."""
        error = child.fatal or described
        if child.kill_reason is not None:
            error = f"{error} ({child.kill_reason})"
        when = "before it was ready" if child.ready_at is None else "before it took over"
        message = (
            f"group {group.name} slot {slot.index}: the new child (pid {child.pid}) ended "
            f"{when}: {error}; the slot keeps its generation {slot_generation(slot)} child"
        )
        if group.stop_roll():
            log.error("roll of group %s stopped: %s", group.name, message)
        else:
            log.error("%s", message)
        self.reload.roll_failed(message)
        self.metrics.child_restart(group.name, "boot_failure")

    def _on_crash(
        self, group: GroupPool, slot: Slot | None, child: ChildProcess, described: str
    ) -> None:
        """Any other end, before `ready` or after: a crash, paced by backoff and the
        group's budget. Only a child that cannot boot makes a group FATAL."""
        if child.kill_reason is None and child.proc.returncode == -signal.SIGKILL:
            log.warning("child %d of %s was SIGKILLed (possibly OOM-killed)", child.pid, group.name)
        booting = "" if child.ready_at is not None else " while booting"
        log.warning("child %d of %s died%s (%s)", child.pid, group.name, booting, described)
        if slot is None or self.stopping:
            return
        reason = (child.kill_reason or "crash") if child.ready_at is not None else "boot_failure"
        self.metrics.child_restart(group.name, reason)
        group.on_crash(slot, child, time.monotonic())

    def _check_ownership(self) -> None:
        """Every live child belongs to exactly one pool; say so loudly if not (once
        per problem): such a child would escape drain, deadlines and hand-back."""
        for problem in self.fleet.ownership_problems(list(self.by_pid.values())):
            if problem not in self._ownership_logged:
                self._ownership_logged.add(problem)
                log.error("bookkeeping bug: %s", problem)

    def _forget_slot_series(self, child: ChildProcess) -> None:
        """A child of a slot that no longer exists (shrunk pool, removed group) took
        its slot's RSS series with it."""
        pool = self.fleet.groups.get(child.group)
        if pool is None or child.slot >= len(pool.slots):
            self.metrics.remove_child(child.group, child.slot)

    def _handback_reason(self, child: ChildProcess) -> str:
        if child.kill_reason == "max_run":
            return "max_run"
        return "shutdown" if self.stopping else "worker_exit"

    def _on_cannot_boot(self, group: GroupPool, child: ChildProcess, described: str) -> None:
        error = child.fatal or described
        if group.stop_roll():
            log.error("roll of group %s stopped: new child cannot boot: %s", group.name, error)
            self.reload.roll_failed(f"group {group.name} kept generation: {error}")
            return
        self.metrics.child_restart(group.name, "boot_failure")
        group.mark_fatal(error, time.monotonic())

    # -- pools ---------------------------------------------------------------------------

    def fatal_groups(self) -> list[str]:
        return self.fleet.fatal_groups()

    def rolling(self) -> bool:
        return self.fleet.rolling()

    def apply_reload(self, plan: ReloadPlan) -> None:
        """Switch to `plan.config`: parent-hot settings in place, then the pools."""
        config = self.config = plan.config
        if plan.new_generation:
            self.generation += 1
        self._forward_logging()
        self.maintenance.reconfigure(config)
        self.metrics.apply_config(config)
        self._retire(self.fleet.apply(plan))

    def record_reload(self, ok: bool, errors: list[str]) -> None:
        """Publish a reload's outcome: state file (for `reload --wait`), metrics, systemd."""
        self.state = after_reload(self.state, ok=ok, errors=errors, generation=self.generation)
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
        self.fleet.fill(self.spawn, self.generation)
        for group in self.fleet.groups.values():
            self.metrics.set_children(group.name, group.state_counts())
            self.metrics.set_group_state(group.name, group.state)

    # -- stopping ------------------------------------------------------------------------

    def _begin_drain(self, why: str) -> None:
        if why != "SIGQUIT":  # QUIT stops at once; its own line says so
            log.info("%s: draining (stop claiming, finish in-flight tasks)", why)
        self.stopping = True
        systemd.stopping("draining")
        self.maintenance.pause_purge()
        now = time.monotonic()
        for pool in self.fleet.pools():
            for child in pool.children():
                child.retire(now, self._drain_timeout_s(pool))

    def _begin_hard_stop(self) -> None:
        now = time.monotonic()
        for child in self.all_children():
            child.quit(now)

    def _stop_step(self) -> bool:
        """True once every child is gone (the deadlines stop the slow ones)."""
        return not self.all_children()

    def _drain_timeout_s(self, pool: GroupPool) -> float:
        """How long a child of `pool` may drain: its group's `shutdown_timeout`."""
        return (pool.config.shutdown_timeout or self.config.shutdown_timeout).total_seconds()

    # -- reporting -----------------------------------------------------------------------

    def _report(self) -> None:
        self.status.tick(
            self.fleet.groups.values(),
            self.all_children(),
            generation=self.generation,
            stopping=self.stopping,
        )

    def _database_problems(self) -> list[str]:
        """Database trouble the parent's own threads ran into (from any thread)."""
        found = (self.maintenance.database_problem(), self.metrics.database.problem())
        return [problem for problem in found if problem]

    def write_state(self) -> None:
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


def slot_generation(slot: Slot) -> str:
    return str(slot.child.generation) if slot.child is not None else "(none)"


def describe_exit(code: int) -> str:
    """`exit 3`, or `signal SIGKILL` for a child a signal ended (`Popen` convention)."""
    if code >= 0:
        return f"exit {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:  # a real-time signal has no name
        return f"signal {-code}"


def run_daemon(config_path: str, config: Config) -> int:
    # Before anything is created: the SQLite file (payloads), its -wal and -shm, the
    # log file and the state files are the daemon user's alone. Children inherit it.
    os.umask(0o077)
    try:
        configure_logging(config.logging, process_label=PARENT_LABEL)
    except LoggingSetupError as exc:
        print(f"cairnqd: {exc}", file=sys.stderr)
        return CONFIG
    setproctitle(f"cairnqd: master [{os.path.abspath(config_path)}] starting")
    return Supervisor(config_path, config).run()
