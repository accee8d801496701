"""The parent process: `cairnqd -c cairnq.yaml`.

Design note. One thread runs one `selectors` loop over the signal wakeup fd and every
child's events pipe. Signal handlers only record the signal number; `run()` then
reads as named steps: dispatch signals, read pipes, reap children, check deadlines,
keep each pool at size, report status. Database work never runs here: the
maintenance thread owns a connection (reaper, hand-back, purge) and the metrics
thread another, so a stalled database can never stall reaping, signals or the
systemd watchdog.

When a child dies without saying goodbye, the parent hands its tasks back at once
(`release_worker`, scoped by the dead child's worker_id and run only after waitpid),
so they are claimable in milliseconds instead of after the lease expires.
"""

from __future__ import annotations

import asyncio
import logging
import os
import selectors
import signal
import sys
import time
from collections import deque
from typing import Any

from setproctitle import setproctitle

from . import systemd
from .config import Config, ConfigError, GroupConfig, load_config
from .exitcodes import CONFIG, OK, SOFTWARE, TEMPFAIL
from .logs import LoggingSetupError, configure_logging, logging_settings, reopen_logs
from .maintenance import Maintenance
from .metrics import Metrics
from .pool import ChildProcess, GroupPool, Slot, spawn_child
from .statefile import AlreadyRunning, StateFile, after_reload, initial_state, state_path

log = logging.getLogger("cairnqd.supervisor")

_HANDLED = (
    signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1,
    signal.SIGUSR2, signal.SIGTSTP, signal.SIGTTIN, signal.SIGCHLD,
)  # fmt: skip
#: The parent's process label in log lines; a child's is `[group] slot/slots`.
PARENT_LABEL = "master"
_KILL_GRACE_S = 5.0
# Child messages that change what the loop must do next (the rest are task events).
_STATE_EVENTS = frozenset({"ready", "bye", "fatal"})
_QUIT_GRACE_S = 2.0
_TICK_S = 0.1


class Supervisor:
    def __init__(self, config_path: str, config: Config) -> None:
        self.config_path = os.path.abspath(config_path)
        self.config = config
        self.generation = 1
        self.groups: dict[str, GroupPool] = {}
        self.by_fd: dict[int, ChildProcess] = {}
        self.by_pid: dict[int, ChildProcess] = {}
        self.selector = selectors.DefaultSelector()
        self.signals: deque[int] = deque()
        self.stopping = False
        self.stop_deadline: float | None = None
        self.hard_stop_at: float | None = None
        self.pending_reload: bool | None = None  # None, or "roll every group?"
        self.rolls: dict[str, list[int]] = {}
        # Groups removed by a reload whose children are still draining.
        self.orphans: list[GroupPool] = []
        self.reload_in_flight = False  # a reload waiting for its rolls to finish
        self.ready_sent = False
        self.last_tick = time.monotonic()
        self.watchdog_every = systemd.watchdog_interval()
        self.last_watchdog = 0.0
        self.metrics = Metrics(config)
        self.maintenance = Maintenance(config, self.metrics)
        self.statefile = StateFile(state_path(self.config_path, config.runtime_dir))
        self.state = initial_state(self.config_path)
        self.exit_causes: set[str] = set()
        self._title = ""

    # -- lifecycle ---------------------------------------------------------------------

    def run(self) -> int:
        try:
            self.statefile.acquire()
        except AlreadyRunning as exc:
            log.error("%s", exc)
            return TEMPFAIL
        try:
            return self._run()
        finally:
            self.statefile.release()

    def _run(self) -> int:
        refusal = check_connection_budget(self.config)
        if refusal is not None:
            log.error("%s", refusal)
            return CONFIG
        wakeup_r = self._install_signals()
        listen = self.config.metrics.listen
        if listen is not None:
            port = self.metrics.serve(listen.host, listen.port, health=self._healthy)
            log.info("metrics on http://%s:%d/metrics", listen.host, port)
        self.maintenance.start()
        for name, group in self.config.groups.items():
            self.groups[name] = GroupPool(group, self.config.group_fingerprint(name), self.config)
        self._write_state()
        log.info(
            "cairnqd started: %s, %d group(s), generation %d",
            self.config.database.backend, len(self.groups), self.generation,
        )  # fmt: skip
        next_housekeeping = 0.0
        while True:
            urgent = False
            timeout = max(0.0, next_housekeeping - time.monotonic())
            for key, _ in self.selector.select(timeout):
                if key.fd == wakeup_r:
                    self._drain_wakeup(wakeup_r)
                    urgent = True
                else:
                    urgent |= self._read_child(key.fd)
            self._dispatch_signals()
            # Task events arrive thousands of times a second; the steps below only
            # need to run on a signal, a child's change of state, or every tick.
            now = time.monotonic()
            if not urgent and now < next_housekeeping:
                continue
            next_housekeeping = now + _TICK_S
            self._reap()
            self._check_deadlines()
            if self.stopping:
                if self._stop_step():
                    break
            else:
                self._keep_pools()
                self._advance_rolls()
                if self._all_fatal():
                    break
            self._report()
        return self._finish()

    def _finish(self) -> int:
        systemd.stopping("stopped")
        self.maintenance.stop(timeout_s=10.0)
        self.metrics.close()
        if self.stopping:
            return OK
        # Every group is FATAL: 78 (do not restart us) if each cause was a boot error.
        return CONFIG if self.exit_causes <= {"cannot_boot"} else SOFTWARE

    def _all_fatal(self) -> bool:
        return bool(self.groups) and all(
            g.state == "fatal" and not g.children() for g in self.groups.values()
        )

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
        self._request_reload(roll_all=False)

    def handle_sigusr2(self) -> None:
        self._request_reload(roll_all=True)

    def handle_sigusr1(self) -> None:
        # logrotate's postrotate signal: reopen first, so the status lands in the new
        # file, then have every child reopen its own handler (each opened the file).
        reopen_logs()
        for child in self._all_children():
            child.control.send("reopen_logs")
        log.info("status:\n%s", self.status_dump())

    def handle_sigtstp(self) -> None:
        log.warning("SIGTSTP: children stop claiming (quiet) until reload or restart")
        for child in self._all_children():
            child.signal(signal.SIGUSR1)
        systemd.status("quiet")

    def handle_sigttin(self) -> None:
        import faulthandler

        faulthandler.dump_traceback(all_threads=True)
        for child in self._all_children():
            child.signal(signal.SIGTTIN)

    def handle_sigchld(self) -> None:
        pass  # the wakeup already made the loop reap

    # -- children: pipes and exits -------------------------------------------------------

    def _all_children(self) -> list[ChildProcess]:
        self.orphans = [g for g in self.orphans if g.children()]
        pools = [*self.groups.values(), *self.orphans]
        return [c for g in pools for c in g.children()]

    def _spawn(self, group: GroupConfig, slot: int, generation: int) -> ChildProcess:
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
            messages = child.events.read()
        except Exception as exc:
            log.error("child %d sent garbage (%s); killing it", child.pid, exc)
            child.kill_reason = "protocol"
            child.signal(signal.SIGKILL)
            messages = []
        changed = False
        for message in messages:
            self._on_event(child, message)
            changed |= message.get("t") in _STATE_EVENTS
        if child.events.closed:
            self._forget_fd(child)
            changed = True
        return changed

    def _forget_fd(self, child: ChildProcess) -> None:
        if self.by_fd.pop(child.events.fd, None) is not None:
            self.selector.unregister(child.events.fd)

    def _on_event(self, child: ChildProcess, message: dict[str, Any]) -> None:
        kind = message.get("t")
        child.last_heard = time.monotonic()
        if kind == "ready":
            child.state = "ready"
            child.ready_at = time.monotonic()
            child.rss = int(message.get("rss", 0))
            self.groups[child.group].boot_failures = 0
        elif kind == "hb":
            state = str(message.get("state", ""))
            if state == "db_wait":
                child.state = "db_wait"
            elif state in ("draining", "quiet"):
                child.state = state
            child.rss = int(message.get("rss", 0))
        elif kind == "start":
            child.in_flight[str(message.get("id"))] = {**message, "seen": time.monotonic()}
        elif kind == "end":
            child.in_flight.pop(str(message.get("id")), None)
        elif kind == "bye":
            child.bye = str(message.get("reason", "drain"))
        elif kind == "fatal":
            child.fatal = str(message.get("error", "unknown error"))
        elif kind == "dberr" and child.state == "starting":
            child.state = "db_wait"
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
        group = self.groups.get(child.group)
        for orphan in self.orphans:
            if child in orphan.children():
                group = None
                self._detach(orphan, child)
        now = time.monotonic()
        clean = code == 0 and child.bye is not None
        described = f"exit {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"
        if not clean:
            reason = self._handback_reason(child)
            self.maintenance.hand_back(child.worker_id, reason)
        if group is None:
            return
        slot = self._detach(group, child)
        if clean:
            log.info("child %d of %s exited (%s)", child.pid, group.name, child.bye)
            if child.bye not in ("drain", None):
                self.metrics.child_restart(group.name, str(child.bye))
            return
        if code == 78 or child.fatal is not None:
            self._on_cannot_boot(group, child, described)
            return
        if child.kill_reason is None and code == -signal.SIGKILL:
            log.warning("child %d of %s was SIGKILLed (possibly OOM-killed)", child.pid, group.name)
        log.warning("child %d of %s died (%s)", child.pid, group.name, described)
        if slot is None or self.stopping:
            return
        if child.ready_at is None:
            self.metrics.child_restart(group.name, "boot_failure")
            group.on_boot_failure(slot, now)
            self.exit_causes.add("boot_failure")
        else:
            self.metrics.child_restart(group.name, child.kill_reason or "crash")
            group.on_crash(slot, child, now)

    def _handback_reason(self, child: ChildProcess) -> str:
        if child.kill_reason == "max_run":
            return "max_run"
        return "shutdown" if self.stopping else "worker_exit"

    def _detach(self, group: GroupPool, child: ChildProcess) -> Slot | None:
        """Remove a dead child from wherever the pool holds it; its slot if any."""
        if child in group.retired:
            group.retired.remove(child)
            return None
        for slot in group.slots:
            if slot.child is child:
                slot.child = None
                return slot
            if slot.successor is child:
                slot.successor = None
                return None
        return None

    def _on_cannot_boot(self, group: GroupPool, child: ChildProcess, described: str) -> None:
        error = child.fatal or described
        if group.name in self.rolls:
            # A roll stops at the first child that cannot boot; old children keep serving.
            del self.rolls[group.name]
            self._reload_finished(False, [f"group {group.name} kept generation: {error}"])
            log.error("roll of group %s stopped: new child cannot boot: %s", group.name, error)
            return
        self.exit_causes.add("cannot_boot")
        self.metrics.child_restart(group.name, "boot_failure")
        group.mark_fatal(error)

    # -- deadlines -----------------------------------------------------------------------

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        sup = self.config.supervisor
        for group in self.groups.values():
            max_run = group.config.max_run
            for child in group.children():
                if child.abort_sent_at is not None:
                    if now - child.abort_sent_at > _KILL_GRACE_S:
                        child.signal(signal.SIGKILL)
                    continue
                if (
                    child.state == "starting"
                    and now - child.spawned_at > sup.boot_timeout.total_seconds()
                ):
                    self._abort(child, "boot_timeout")
                elif (
                    child.state != "starting"
                    and child.state != "db_wait"
                    and (now - child.last_heard > sup.heartbeat_timeout.total_seconds())
                ):
                    self._abort(child, "heartbeat_timeout")
                elif max_run is not None and any(
                    now - task["seen"] > max_run.total_seconds() + 10
                    for task in child.in_flight.values()
                ):
                    child.kill_reason = "max_run"
                    log.error("child %d exceeded max_run by 10s; killing it", child.pid)
                    child.signal(signal.SIGKILL)

    def _abort(self, child: ChildProcess, reason: str) -> None:
        log.error("child %d of %s: %s; sending SIGABRT", child.pid, child.group, reason)
        child.kill_reason = reason
        child.abort_sent_at = time.monotonic()
        child.signal(signal.SIGABRT)

    # -- pools ---------------------------------------------------------------------------

    def _keep_pools(self) -> None:
        now = time.monotonic()
        for group in self.groups.values():
            for slot in group.slots:
                if slot.child is None and group.may_spawn(slot, now):
                    slot.child = self._spawn(group.config, slot.index, self.generation)
            self.metrics.set_children(group.name, group.state_counts())
            self.metrics.set_group_state(group.name, group.state)

    # -- reload --------------------------------------------------------------------------

    def _request_reload(self, *, roll_all: bool) -> None:
        if self.stopping:
            log.info("stopping; reload ignored")
            return
        if self.rolls:
            self.pending_reload = bool(self.pending_reload) or roll_all
            log.info("a roll is in progress; reload queued")
            return
        self._reload(roll_all)

    def _reload(self, roll_all: bool) -> None:
        systemd.reloading("reloading configuration")
        try:
            new = load_config(self.config_path)
        except ConfigError as exc:
            errors = [str(p) for p in exc.problems]
            for line in errors:
                log.error("reload refused: %s", line)
            self._reload_finished(False, errors)
            return
        refused = restart_only_changes(self.config, new)
        if refused:
            errors = [f"{key} changed: needs a restart; still running generation "
                      f"{self.generation}" for key in refused]  # fmt: skip
            for line in errors:
                log.error("reload refused: %s", line)
            self._reload_finished(False, errors)
            return
        try:
            # First of the changes: a log file that cannot be opened refuses the whole
            # reload, and configure_logging leaves the old setup in place when it fails.
            configure_logging(new.logging, process_label=PARENT_LABEL)
        except LoggingSetupError as exc:
            log.error("reload refused: %s", exc)
            self._reload_finished(False, [str(exc)])
            return
        old, self.config = self.config, new
        self._forward_logging(new)
        self.generation += 1
        self.maintenance.reconfigure(new)
        self.metrics.apply_config(new)
        for name in list(self.groups):
            if name not in new.groups:
                self._retire_group(name)
        for name, group_config in new.groups.items():
            self._apply_group(name, group_config, old, roll_all)
        log.info("reloaded: generation %d", self.generation)
        if self.rolls:
            self.reload_in_flight = True
        else:
            self._reload_finished(True, [])

    def _forward_logging(self, config: Config) -> None:
        """Children apply the reloaded logging settings in place; children spawned
        later get them in their boot message."""
        settings = logging_settings(config.logging)
        for child in self._all_children():
            child.control.send("log_level", level=settings["level"], logging=settings)

    def _retire_group(self, name: str) -> None:
        group = self.groups.pop(name)
        log.info("group %s removed: draining its children", name)
        for child in group.children():
            child.state = "draining"
            child.signal(signal.SIGTERM)
        self.orphans.append(group)

    def _apply_group(self, name: str, config: GroupConfig, old: Config, roll_all: bool) -> None:
        fingerprint = self.config.group_fingerprint(name)
        group = self.groups.get(name)
        if group is None:
            self.groups[name] = GroupPool(config, fingerprint, self.config)
            return
        if group.state == "fatal":
            # Every reload retries a FATAL group with a fresh budget.
            self.groups[name] = GroupPool(config, fingerprint, self.config)
            return
        changed = roll_all or fingerprint != group.fingerprint
        group.config, group.fingerprint = config, fingerprint
        sup = self.config.supervisor
        group.budget.configure(sup.restart_budget, sup.restart_window.total_seconds())
        for child in group.resize(config.processes):
            child.signal(signal.SIGTERM)
        if changed:
            self.rolls[name] = [s.index for s in group.slots if s.child is not None]

    def _advance_rolls(self) -> None:
        """Replace up to `reload.max_surge` children per group at a time: spawn each
        successor, wait for it to be ready, TERM the old child (it drains with its old
        config), and start the next once the old one has exited. Capacity never drops
        below the configured size."""
        surge = self.config.reload.max_surge
        for name in list(self.rolls):
            group = self.groups[name]
            pending = self.rolls[name]
            self._promote_ready_successors(group)
            in_progress = sum(1 for s in group.slots if s.successor is not None)
            in_progress += len(group.retired)
            while pending and in_progress < surge:
                slot = group.slots[pending.pop(0)]
                if slot.child is None:
                    continue  # the slot died meanwhile; it restarts with the new config
                slot.successor = self._spawn(group.config, slot.index, self.generation)
                in_progress += 1
            if not pending and in_progress == 0:
                del self.rolls[name]
        if not self.rolls and self.reload_in_flight:
            self._reload_finished(True, [])
        if not self.rolls and self.pending_reload is not None:
            roll_all, self.pending_reload = self.pending_reload, None
            self._reload(roll_all)

    def _promote_ready_successors(self, group: GroupPool) -> None:
        for slot in group.slots:
            successor = slot.successor
            if successor is not None and successor.state == "ready":
                old, slot.child, slot.successor = slot.child, successor, None
                if old is not None:
                    old.state = "draining"
                    group.retired.append(old)
                    old.signal(signal.SIGTERM)
                    self.metrics.child_restart(group.name, "reload")

    def _reload_finished(self, ok: bool, errors: list[str]) -> None:
        self.reload_in_flight = False
        self.state = after_reload(self.state, ok=ok, errors=errors, generation=self.generation)
        self.metrics.reload_result(ok, self.generation)
        self._write_state()
        status = f"generation {self.generation}" if ok else f"reload failed: {errors[0]}"
        systemd.notify("READY=1", f"STATUS={status}")

    # -- stopping ------------------------------------------------------------------------

    def _begin_drain(self, why: str) -> None:
        if why != "SIGQUIT":  # QUIT stops at once; its own line says so
            log.info("%s: draining (stop claiming, finish in-flight tasks)", why)
        self.stopping = True
        systemd.stopping("draining")
        self.maintenance.pause_purge()
        timeout = max(
            [self.config.shutdown_timeout_for(n).total_seconds() for n in self.config.groups]
            or [self.config.shutdown_timeout.total_seconds()]
        )
        self.stop_deadline = time.monotonic() + timeout
        for child in self._all_children():
            child.state = "draining"
            child.signal(signal.SIGTERM)

    def _begin_hard_stop(self) -> None:
        self.hard_stop_at = time.monotonic()
        for child in self._all_children():
            child.signal(signal.SIGQUIT)

    def _stop_step(self) -> bool:
        """True once every child is gone."""
        children = self._all_children()
        if not children:
            return True
        now = time.monotonic()
        if (
            self.hard_stop_at is None
            and self.stop_deadline is not None
            and now > self.stop_deadline
        ):
            log.warning(
                "shutdown_timeout passed with %d child(ren) left; stopping them", len(children)
            )
            self._begin_hard_stop()
        if self.hard_stop_at is not None and now - self.hard_stop_at > _QUIT_GRACE_S:
            for child in children:
                child.signal(signal.SIGKILL)
        return False

    # -- reporting -----------------------------------------------------------------------

    def _report(self) -> None:
        now = time.monotonic()
        self.last_tick = now
        total = sum(len(g.slots) for g in self.groups.values())
        ready = sum(1 for c in self._all_children() if c.state == "ready")
        title = (
            f"cairnqd: master [{self.config_path}] gen={self.generation} children={ready}/{total}"
        )
        if title != self._title:
            self._title = title
            setproctitle(title)
        if not self.ready_sent and not self.stopping and self._pools_settled():
            self.ready_sent = True
            systemd.ready(f"generation {self.generation}: {ready}/{total} children ready")
        if self.watchdog_every is not None and now - self.last_watchdog >= self.watchdog_every:
            self.last_watchdog = now
            systemd.watchdog()

    def _pools_settled(self) -> bool:
        for group in self.groups.values():
            if group.state == "fatal":
                continue
            if any(s.child is None or s.child.state != "ready" for s in group.slots):
                return False
        return True

    def _healthy(self) -> bool:
        fresh = time.monotonic() - self.last_tick < 5.0
        return fresh and any(g.state != "fatal" for g in self.groups.values())

    def _write_state(self) -> None:
        try:
            self.statefile.write(self.state)
        except OSError as exc:
            log.error("cannot write the state file: %s", exc)

    def status_dump(self) -> str:
        lines = [f"generation {self.generation}, stopping={self.stopping}"]
        now = time.monotonic()
        for group in self.groups.values():
            lines.append(f"group {group.name}: {group.state} {group.fatal_error or ''}".rstrip())
            for slot in group.slots:
                child = slot.child
                if child is None:
                    wait = max(0.0, slot.restart_at - now)
                    lines.append(f"  slot {slot.index}: empty (restart in {wait:.1f}s)")
                    continue
                tasks = ", ".join(
                    f"{tid} ({now - t['seen']:.1f}s)" for tid, t in child.in_flight.items()
                )
                lines.append(
                    f"  slot {slot.index}: pid {child.pid} {child.state} gen {child.generation} "
                    f"rss {child.rss >> 20}MiB in flight: {tasks or 'none'}"
                )
        return "\n".join(lines)


def connection_budget(config: Config) -> int:
    """Postgres connections the configuration opens across all hosts: per child its
    pool plus the LISTEN connection; per parent the maintenance and metrics
    connections and the purge lock's session, plus the stats leader's session with
    `metrics.queue_stats: leader`."""
    per_child = config.database.connections_per_child + 1
    children = sum(g.processes for g in config.groups.values())
    parent = 3
    if config.metrics.queue_stats == "leader":
        parent += 1  # the stats collector holds its leader lock on a session of its own
    return config.database.expected_hosts * (children * per_child + parent)


def check_connection_budget(config: Config) -> str | None:
    """A refusal message when the budget exceeds the server's limit and
    `database.connection_check` is `refuse`; logs a warning for `warn`."""
    db = config.database
    if db.backend != "postgres" or db.connection_check == "off":
        return None
    try:
        limit, reserved = asyncio.run(_connection_limits(config))
    except Exception as exc:  # the children will wait for the database; say so and go on
        log.warning("could not check the connection budget: %s", exc)
        return None
    available = limit - reserved
    needed = connection_budget(config)
    if needed <= available:
        return None
    message = (
        f"the configuration opens up to {needed} Postgres connections "
        f"({db.expected_hosts} host(s)) but the server allows {available} "
        f"(max_connections {limit} - superuser_reserved_connections {reserved}); lower "
        "groups.*.processes or database.connections_per_child, raise max_connections, "
        "or set database.connection_check: warn"
    )
    if db.connection_check == "warn":
        log.warning("%s", message)
        return None
    return message


async def _connection_limits(config: Config) -> tuple[int, int]:
    from .store.postgres import PostgresStore

    assert config.database.dsn is not None
    store = PostgresStore(
        config.database.dsn,
        max_size=1,
        connect_timeout_s=config.database.connect_timeout.total_seconds(),
    )
    return await store.server_connection_limits()


def restart_only_changes(old: Config, new: Config) -> list[str]:
    """Settings a running parent cannot change in place."""
    changed = []
    if (old.database.path, old.database.dsn) != (new.database.path, new.database.dsn):
        changed.append("database")
    if old.metrics.listen != new.metrics.listen:
        changed.append("metrics.listen")
    if old.runtime_dir != new.runtime_dir:
        changed.append("runtime_dir")
    return changed


def run_daemon(config_path: str, config: Config) -> int:
    try:
        configure_logging(config.logging, process_label=PARENT_LABEL)
    except LoggingSetupError as exc:
        print(f"cairnqd: {exc}", file=sys.stderr)
        return CONFIG
    setproctitle(f"cairnqd: master [{os.path.abspath(config_path)}] starting")
    return Supervisor(config_path, config).run()
