"""A worker child: `python -m cairnqd.daemon.child --parent-pid P --events FD --control FD`.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import faulthandler
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from setproctitle import setproctitle

from cairnqd._lograte import Repeats
from cairnqd.daemon.boot import Boot, BootVersionMismatch, decode_boot
from cairnqd.daemon.child.loopwatch import LoopWatch, tick_for
from cairnqd.daemon.child.outbox import Outbox
from cairnqd.daemon.child.reporter import ChildReporter, RoomReport, RunningReport
from cairnqd.daemon.exitcodes import CONFIG, OK, TEMPFAIL
from cairnqd.daemon.handler_probe import describe_import_error, use_python_path
from cairnqd.daemon.logs import LoggingSetupError, configure_logging, reopen_logs
from cairnqd.daemon.otelsetup import ChildTracing, TracingSetupError, start_tracing
from cairnqd.daemon.starts import StartTable
from cairnqd.daemon.wakerole import WakeRole
from cairnqd.daemon.wire.messages import (
    PROTOCOL_VERSION,
    STALL_WARN_S,
    CancelStuck,
    Claiming,
    DatabaseTrouble,
    Fatal,
    Goodbye,
    Heartbeat,
    MessageError,
    Ready,
    ReopenLogs,
    SetCancelGrace,
    SetLimits,
    SetLogging,
    Wake,
    decode_control,
    encode,
)
from cairnqd.daemon.wire.pipes import MessageReader, PipeError, read_one
from cairnqd.errors import (
    DatabaseUnavailable,
    MigrationsPending,
    NotACairnqDatabase,
    ProtocolVersionMismatch,
    SchemaMismatch,
)
from cairnqd.registry import HandlerError, resolve_handlers
from cairnqd.store.base import QuarantinedRow, TaskStore
from cairnqd.store.blockers import postgres_blockers, sqlite_lock_holders
from cairnqd.store.errors import classify
from cairnqd.store.factory import build_store
from cairnqd.store.reachability import DAEMON_CALL_TIMEOUT_S, is_unreachable
from cairnqd.store.sqlite.files import DatabaseFile, existing_file_uri, is_plain_file
from cairnqd.tracing import end as end_span
from cairnqd.worker import Worker

if TYPE_CHECKING:
    from cairnqd.context import TaskContext
    from cairnqd.store.postgres import PostgresStore

log = logging.getLogger("cairnqd.child")

_PR_SET_PDEATHSIG = 1
_BOOT_TIMEOUT_S = 10.0
#: On QUIT, how long returned results may take to be written before we exit anyway.
_QUIT_FLUSH_S = 1.0
#: How long queued spans may take to be exported as the child exits (tracing.enabled).
_TRACE_FLUSH_S = 5.0
#: How many tasks of a stuck canceled handler `cancel_stuck` names (a batch may hold more).
_STUCK_NAMED = 20
#: How long after `cancel_stuck` the child waits for its parent to replace it before it
#: leaves by itself.
_STUCK_EXIT_S = 10.0
#: How often a SQLite child checks that its database path still names its file.
_FILE_CHECK_S = 1.0


def _die_with_parent() -> None:
    """Ask the kernel for SIGTERM when the spawning thread of the parent dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl failed")
    except (OSError, AttributeError) as exc:
        # The control pipe's EOF and the getppid check still catch a dead parent.
        log.warning("PR_SET_PDEATHSIG unavailable (%s); relying on the control pipe", exc)


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _within(names: list[str], budget: int) -> tuple[str, ...]:
    """As many names as fit in `budget` characters: a heartbeat must stay one atomic
    pipe write, and a child may serve many long queue names."""
    kept: list[str] = []
    for name in names:
        budget -= len(name) + 3
        if budget < 0:
            break
        kept.append(name)
    return tuple(kept)


class Child:
    def __init__(self, args: argparse.Namespace) -> None:
        self.parent_pid: int = args.parent_pid
        self.events = Outbox(args.events)
        self.control_fd: int = args.control
        self._starts_fd: int | None = args.starts
        self._boot: Boot | None = None
        self.state = "starting"
        self.worker: Worker | None = None
        self.bye_reason = "drain"
        self.stop_requested = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.reporter: ChildReporter | None = None
        #: Told of our room: the parent, when it relays our wake-ups (it routes them by
        #: room), or else the group's wake lock (one child answers wake-ups).
        self.room: RoomReport | WakeRole | None = None
        self.loop_watch = LoopWatch()
        self._control: MessageReader | None = None
        self._aborting = False
        self._file: DatabaseFile | None = None
        self._repeats = Repeats()
        self._stall_warned = False
        self.tracing: ChildTracing | None = None

    # -- boot --------------------------------------------------------------------------

    def run(self) -> int:
        _die_with_parent()
        if os.getppid() != self.parent_pid:
            return TEMPFAIL  # the parent died before we got here
        self._ignore_orchestrated_signals()
        faulthandler.enable()
        # The parent forwards SIGTTIN for a dump of every thread. Its default action
        # would stop the process, and a daemon started from a shell would find all
        # its workers stopped until the heartbeat deadline killed them.
        faulthandler.register(signal.SIGTTIN, all_threads=True)
        try:
            line, rest = read_one(self.control_fd, _BOOT_TIMEOUT_S)
        except PipeError as exc:
            self._send_final(Fatal(f"no boot message from the parent: {exc}"))
            return TEMPFAIL
        try:
            self._boot = decode_boot(line)
        except BootVersionMismatch as exc:
            self._send_final(Fatal(f"pipe protocol mismatch ({exc}): restart cairnqd"))
            return CONFIG
        except MessageError as exc:
            self._send_final(Fatal(f"bad boot message from the parent: {exc}"))
            return CONFIG
        self._control = MessageReader(self.control_fd, rest)
        self._configure_logging(dict(self.boot.logging))
        self._title("starting")
        if self.boot.tracing:
            # Before the worker: it decides once, as it starts, whether to trace.
            try:
                self.tracing = start_tracing(self.boot.group, self.boot.slot, self.boot.worker_id)
            except TracingSetupError as exc:
                self._send_final(Fatal(str(exc)))
                log.error("cannot boot: %s", exc)
                return CONFIG
        try:
            worker = self._build_worker()
        except Exception as exc:
            # A handler import names the file and line that broke, not only the path.
            reason = (
                describe_import_error(exc)
                if isinstance(exc, HandlerError)
                else f"{type(exc).__name__}: {exc}"
            )
            self._send_final(Fatal(reason))
            log.error("cannot boot: %s", reason)
            return CONFIG
        self.worker = worker
        # What boot built (modules, config, handlers, the worker) lives as long as the
        # process: move it out of the collector's way, or each full collection walks
        # it all again (about one a second at 20,000 tasks a second; a handler module
        # that makes cyclic garbage at import time keeps it, once).
        gc.freeze()
        threading.Thread(target=self._heartbeat_thread, name="cairnqd-hb", daemon=True).start()
        return asyncio.run(self._serve(worker))

    def _configure_logging(self, settings: dict[str, Any]) -> None:
        try:
            configure_logging(settings, process_label=self._label())
        except LoggingSetupError as exc:
            # The parent opened the same file a moment ago, so this is a race with
            # the operator (directory removed, permissions changed). Log to stderr
            # rather than refuse to boot: losing the worker over its log is worse.
            configure_logging({**settings, "file": None}, process_label=self._label())
            log.error("%s; logging to stderr instead", exc)

    @property
    def boot(self) -> Boot:
        """What the parent told us; read once, before anything else is set up."""
        if self._boot is None:
            raise RuntimeError("the boot message has not been read yet")
        return self._boot

    def _label(self) -> str:
        boot = self.boot
        return f"[{boot.group}] {boot.slot + 1}/{boot.nslots}"

    def _title(self, state: str) -> None:
        setproctitle(f"cairnqd: worker {self._label()} gen={self.boot.gen} {state}")

    def _ignore_orchestrated_signals(self) -> None:
        # The parent orchestrates; Ctrl-C on the terminal reaches the whole group.
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTSTP, signal.SIGTTOU, signal.SIGWINCH):
            signal.signal(sig, signal.SIG_IGN)

    def _make_store(self) -> TaskStore:
        db = self.boot.database
        return build_store(
            "worker",
            # The parent created the file before spawning us: open it, never create it.
            path=None if db.path is None else existing_file_uri(db.path),
            dsn=db.dsn,
            busy_timeout_ms=db.busy_timeout_ms,
            connect_timeout_s=db.connect_timeout_s,
            auto_migrate=db.auto_migrate,
            connections=db.connections,
            pooler=db.pooler,
            push=db.push,
            # Claims, lease renewals and settlements give up on a silent server in
            # time for the parent to see the outage (pg_connect's detection bound).
            call_timeout_s=DAEMON_CALL_TIMEOUT_S,
        )

    def _build_worker(self) -> Worker:
        group = self.boot.group_config
        use_python_path(self.boot.python_path)
        handlers = resolve_handlers(group.handlers)
        if not handlers:
            raise ValueError(f"no handlers found in {', '.join(group.handlers)}")
        worker = Worker(
            self._make_store(),
            list(group.queues),
            concurrency=group.concurrency,
            prefetch=group.prefetch,
            lease_ms=group.lease_ms,
            poll_interval_ms=group.poll_interval_ms,
            retry_backoff_ms=group.retry_backoff_ms,
            retry_backoff_max_ms=group.retry_backoff_max_ms,
            max_run_ms=group.max_run_ms,
            resources=dict(group.resources) or None,
            on_error=self._on_error,
            # A daemon child honours `cairnqd pause --queue`, on every host.
            honour_pauses=True,
            limits=dict(self.boot.limits) or None,
            cancel_grace=group.cancel_grace_ms / 1000,
        )
        for spec in handlers.values():
            worker.register(spec.name, spec.fn, batch=spec.batch, resource=spec.resource)
        worker.worker_id = self.boot.worker_id
        worker.on_lease_overrun = self._lease_overrun
        worker.on_cancel_overrun = self._cancel_overrun
        starts = StartTable.attach(self._starts_fd) if self._starts_fd is not None else None
        buckets = (self.boot.duration_buckets, self.boot.wait_buckets)
        # Without a task or memory limit there is nothing to check after each task.
        limits = self.boot.max_tasks or self.boot.max_memory
        self.reporter = ChildReporter(
            self.events,
            starts,
            buckets,
            self.after_task if limits else None,
            worker.in_flight.contexts,
        )
        worker.observer = self.reporter

        def may_claim() -> bool:
            return worker.claiming and not self.stop_requested

        if self.boot.database.push == "pipe":
            self.room = RoomReport(self.events, may_claim)
            worker.on_room = self.room.slots
        elif self.boot.database.push == "listen" and self.boot.wake_lock is not None:
            self.room = self._wake_role(self.boot.wake_lock, may_claim, worker.store.one_writer)
            if self.room is not None:
                worker.on_room = self.room.slots
                worker.wake_gate = self.room
        worker.store.on_undecodable = self._undecodable
        # Retire on the limits before claiming, not only after a task ends: a claim
        # (prefetch included) made after the limit is work the retiring child must
        # still finish.
        if self.boot.max_tasks:
            worker.claim_budget = self.boot.max_tasks
        if self.boot.max_memory:
            worker.before_claim = self._memory_allows_claim
        return worker

    def _wake_role(
        self, path: str, may_claim: Callable[[], bool], one_writer: bool
    ) -> WakeRole | None:
        let_go_after_s = (
            WakeRole.ONE_WRITER_LET_GO_AFTER_S if one_writer else WakeRole.LET_GO_AFTER_S
        )
        try:
            return WakeRole(path, may_claim, let_go_after_s=let_go_after_s)
        except OSError as exc:
            # Every child then answers every wake-up, as without the lock: more CPU.
            log.warning(
                "cannot open the group's wake lock %s (%s); answering every wake-up",
                path,
                exc.strerror or exc,
            )
            return None

    # -- running -----------------------------------------------------------------------

    async def _serve(self, worker: Worker) -> int:
        self.loop = loop = asyncio.get_running_loop()
        # Ticks often enough for the stall bound, and no more: each wakes an idle loop.
        self.loop_watch.tick_s = tick_for(self.boot.stall_timeout_s)
        self.loop_watch.start(loop)
        if self.reporter is not None:
            self.reporter.start(loop)
        if self.room is not None:
            self.room.start(loop)
        loop.add_signal_handler(signal.SIGTERM, self.request_stop, "drain")
        loop.add_signal_handler(signal.SIGQUIT, self._abort)
        loop.add_signal_handler(signal.SIGUSR1, self._quiet)
        assert self._control is not None
        loop.add_reader(self.control_fd, self._on_control)
        # Lines that came in one read with `boot` (a `claiming` off from a quiet parent)
        # wait in the reader's buffer, where no readiness event would find them.
        loop.call_soon(self._on_control)
        try:
            connected = await self._connect(worker.store)
        except (
            MigrationsPending,
            ProtocolVersionMismatch,
            SchemaMismatch,
            NotACairnqDatabase,
        ) as exc:
            # No restart can fix these; the group goes FATAL instead of looping.
            self._send_final(Fatal(str(exc)))
            log.error("cannot boot: %s", exc)
            return CONFIG
        if not connected:
            return OK if self.stop_requested else TEMPFAIL
        self._watch_file(loop)
        # Spawned while the parent is quiet (SIGTSTP): up, but not claiming.
        self.state = "run" if worker.claiming else "quiet"
        self._title("ready" if worker.claiming else "quiet")
        self._send(
            Ready(
                v=PROTOCOL_VERSION, pid=os.getpid(), worker_id=worker.worker_id,
                gen=self.boot.gen, rss=_rss_bytes(),
            )
        )  # fmt: skip
        log.info("ready: worker %s, generation %s", worker.worker_id, self.boot.gen)
        try:
            await worker.run()
        finally:
            if isinstance(self.room, WakeRole):
                self.room.close()  # a sibling answers wake-ups from now on
            with contextlib.suppress(Exception):
                await worker.store.close()
            # Past this point a second TERM (a process-group signal from a terminal or
            # a wrapper) must not kill us mid-goodbye; asyncio would otherwise restore
            # the default action when the loop closes.
            loop.remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self._flush_traces(_TRACE_FLUSH_S)
        self._final_tally()
        if self.state == "orphaned":
            return TEMPFAIL
        self._send_final(Goodbye(self.bye_reason))
        return OK

    async def _connect(self, store: TaskStore) -> bool:
        delay = 0.5
        while not self.stop_requested:
            try:
                await store.connect()
                return True
            except DatabaseUnavailable as exc:
                if self.state != "db_wait":
                    log.warning("database unavailable, retrying: %s", exc)
                self.state = "db_wait"
                self._send(DatabaseTrouble("connect"))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        return False

    def _watch_file(self, loop: asyncio.AbstractEventLoop) -> None:
        """On SQLite, check every second that the path still names the file we opened."""
        path = self.boot.database.path
        if path is None or not is_plain_file(path):
            return
        self._file = DatabaseFile(path)
        self._file.remember()
        loop.call_later(_FILE_CHECK_S, self._check_file, loop)

    def _check_file(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._file is not None
        lost = self._file.check()
        if lost is None:
            loop.call_later(_FILE_CHECK_S, self._check_file, loop)
            return
        # Whatever is claimed now would come from a file nobody else sees any more.
        # (The parent logs this as CRITICAL, once for the daemon.)
        log.warning("%s; this worker stopped claiming", lost)
        self._quiet()

    def request_stop(self, reason: str) -> None:
        """Stop claiming, finish in-flight work (leases keep renewing), then exit."""
        if self.stop_requested:
            return
        self.stop_requested = True
        self.bye_reason = reason
        if self.state == "run":
            self.state = "draining"
        self._title("draining")
        if self.worker is not None:
            self.worker.stop()
        self._room_check()

    def _memory_allows_claim(self) -> bool:
        # Only once this child has finished something: one that boots above the
        # limit must still make progress rather than be replaced forever.
        worker, limit = self.worker, self.boot.max_memory
        if worker and worker.handled and limit and _rss_bytes() > limit:
            self.request_stop("max_memory")
            return False
        return True

    def after_task(self, finished: int) -> None:
        limit = self.boot.max_tasks
        if limit and finished >= limit:
            self.request_stop("max_tasks")
            return
        max_memory = self.boot.max_memory
        if max_memory and _rss_bytes() > max_memory:
            self.request_stop("max_memory")

    def _quiet(self) -> None:
        if self.worker is not None:
            self.worker.claiming = False
        self.state = "quiet"
        self._title("quiet")
        self._room_check()

    def _room_check(self) -> None:
        """Claiming was switched on or off: the parent's view of our room may change."""
        if self.room is not None:
            self.room.check()

    def _set_claiming(self, on: bool) -> None:
        """The parent ends (or starts) a quiet: a reload after SIGTSTP resumes."""
        if not on:
            self._quiet()
            return
        if self.state != "quiet" or self.stop_requested:
            return  # only a quiet child resumes; a draining one keeps draining
        if self.worker is not None:
            self.worker.claiming = True
        self.state = "run"
        self._title("ready")
        self._room_check()
        log.info("claiming again: the quiet is over")

    def _abort(self) -> None:
        """QUIT: stop now. Results already returned are written first (bounded by
        `_QUIT_FLUSH_S`): without that, a finished task would run again. No other
        database write: a commit torn by the exit is worse than a lease the parent
        hands back."""
        if self._aborting:
            return
        self._aborting = True
        worker = self.worker
        held = [c.task_id for c in worker.in_flight.contexts()] if worker else []
        log.warning("QUIT: stopping with %d task(s) held: %s", len(held), held)
        assert self.loop is not None
        self.loop.create_task(self._abort_after_flush())

    async def _abort_after_flush(self) -> None:
        worker = self.worker
        if worker is not None:
            worker.claiming = False
            unwritten = await worker.flush_results(_QUIT_FLUSH_S)
            if unwritten:
                log.warning("QUIT: %d result(s) could not be written in time", unwritten)
        if self.tracing is not None and worker is not None:
            # The attempts cut short end their spans, so the trace shows where it stopped.
            for ctx in worker.in_flight.contexts():
                if ctx.trace_span is not None:
                    end_span(ctx, "interrupted", "QUIT: the child stopped at once")
        self._flush_traces(_QUIT_FLUSH_S)
        self._final_tally()
        os._exit(TEMPFAIL)

    def _flush_traces(self, timeout_s: float) -> None:
        if self.tracing is not None:
            self.tracing.flush(timeout_s)

    def _undecodable(self, row: QuarantinedRow) -> None:
        """The store failed a claimed row it could not decode (and logged it): count it
        as a failed attempt, reason `undecodable`."""
        if row.failed and self.reporter is not None:
            self.reporter.undecodable(row.queue, row.name)

    def _lease_overrun(self, contexts: Sequence[TaskContext]) -> None:
        """A handler did not stop when its lease could not be renewed (a sync handler's
        thread, or one that swallowed the cancel). Exit now, before the lease ends:
        then the task runs again only once this execution is over. Nothing is flushed,
        since the database is what stalled; the parent hands the other tasks back."""
        held = ", ".join(f"{c.task_id} ({c.name}) attempt {c.attempt}" for c in contexts)
        log.error(
            "exiting: the handler of %s is still running although its lease could not be "
            "renewed, and would run beside the next execution once the lease ends",
            held,
        )
        logging.shutdown()
        os._exit(TEMPFAIL)

    def _cancel_overrun(self, contexts: Sequence[TaskContext]) -> None:
        """A canceled handler is still running twice `cancel_grace` after its cancel
        was seen (a sync handler's thread, or one that swallowed the cancellation).
        Stop claiming and ask the parent to replace this child: its death stops the
        handler, and the hand-back ends the task canceled (the cancel wins) and gives
        the other tasks back. Until then the task stays held and renewed here."""
        worker = self.worker
        if worker is not None:
            worker.claiming = False
        self._room_check()
        named = [f"{c.task_id} attempt {c.attempt}" for c in contexts]
        log.error(
            "the canceled handler of %s did not stop within twice cancel_grace (%gs); "
            "asking the parent to replace this child",
            ", ".join(named), worker.cancel_grace if worker is not None else 0.0,
        )  # fmt: skip
        self._send(CancelStuck(tuple(named[:_STUCK_NAMED])))
        # A parent that does not act on it (one of older code, a stopped one): leave
        # by ourselves, as a lease overrun does; the hand-back is the same.
        assert self.loop is not None
        self.loop.call_later(_STUCK_EXIT_S, self._exit_stuck)

    def _exit_stuck(self) -> None:
        log.error(
            "exiting: the parent did not replace this child %gs after a canceled handler "
            "did not stop",
            _STUCK_EXIT_S,
        )
        self._abort()

    def _on_control(self) -> None:
        assert self._control is not None
        for line in self._control.read_lines():
            try:
                message = decode_control(line)
            except MessageError as exc:
                log.error("ignoring a bad control message from the parent: %s", exc)
                continue
            if isinstance(message, SetLogging):
                # A reload: format, file and per-logger levels change in place too.
                self._configure_logging(dict(message.logging))
            elif isinstance(message, ReopenLogs):
                reopen_logs()  # logrotate renamed the file; the parent got SIGUSR1
            elif isinstance(message, Claiming):
                self._set_claiming(message.on)
            elif isinstance(message, Wake):
                store = self._postgres_store()
                if store is not None:
                    store.relay_wake(message.queues)
            elif isinstance(message, SetLimits):
                self._set_limits(message.limits)
            elif isinstance(message, SetCancelGrace):
                self._set_cancel_grace(message.grace_s)
        if self._control.closed:
            assert self.loop is not None
            self.loop.remove_reader(self.control_fd)
            self._orphaned()

    def _set_cancel_grace(self, grace_s: float) -> None:
        """A reload changed the group's `cancel_grace`: kept from now on, for the
        cancels already under way too."""
        if self.worker is None:
            return  # still booting: it was spawned with the new config's value
        try:
            self.worker.cancel_grace = grace_s
        except ValueError as exc:
            log.error("kept the previous cancel_grace: %s", exc)
            return
        log.info("cancel_grace reloaded: %gs", grace_s)

    def _set_limits(self, specs: Mapping[str, Any]) -> None:
        """A reload changed `limits:`: keep the new ones from the next claim on. The
        parent checked them when it read the config; a child that cannot parse them
        (never expected) keeps the old ones and says so."""
        if self.worker is None:
            return  # still booting: it was spawned with the new config's limits
        try:
            self.worker.set_limits(dict(specs) or None)
        except ValueError as exc:
            log.error("kept the previous limits: the reloaded ones are invalid: %s", exc)
            return
        names = ", ".join(sorted(specs)) or "none"
        log.info("limits reloaded: %s", names)

    def _orphaned(self) -> None:
        """The parent is gone: finish what we hold, then leave; leases left over
        expire for the reapers of other hosts."""
        log.warning("parent went away; draining and exiting")
        self.request_stop("orphaned")
        self.state = "orphaned"
        assert self.loop is not None
        timeout = self.boot.shutdown_timeout_s
        self.loop.call_later(timeout, os._exit, TEMPFAIL)

    def _on_error(self, exc: BaseException, info: dict[str, Any]) -> None:
        self._send(DatabaseTrouble(classify(exc), str(info.get("phase", ""))))
        phase = info.get("phase", "worker")
        if is_unreachable(exc):
            # An outage: every retry fails the same way until the network returns,
            # and the parent says so once for the whole daemon (log, /healthz).
            log.debug("%s error: %s", phase, exc)
            return
        # A full disk or a stuck lock fails every call the same way: say it once, then
        # once per `Repeats.every_s` with the count (the metric counts every one).
        held = self._repeats.admit((phase, str(exc)))
        if held is None:
            return
        more = (
            f" (and {held} more like it in the last {self._repeats.every_s:.0f}s)" if held else ""
        )
        log.warning("%s error: %s%s", phase, exc, more)

    def _postgres_store(self) -> PostgresStore | None:
        """The worker's store if it is a Postgres one. Asked of the loaded modules: a
        SQLite child never imports the Postgres store, nor psycopg (~0.2 s at boot)."""
        postgres = sys.modules.get("cairnqd.store.postgres")
        store = self.worker.store if self.worker is not None else None
        return store if postgres is not None and isinstance(store, postgres.PostgresStore) else None

    def _db_down_s(self) -> float:
        store = self._postgres_store()
        return store.reachability.down_for() if store is not None else 0.0

    def _listen_deaf(self) -> bool:
        store = self._postgres_store()
        return store is not None and store.push_state == "deaf"

    def _heartbeat_thread(self) -> None:
        interval = self.boot.hb_interval_s
        max_run_ms = self.boot.group_config.max_run_ms
        max_run_s = None if max_run_ms is None else max_run_ms / 1000
        while True:
            time.sleep(interval)
            if os.getppid() != self.parent_pid and self.loop is not None:
                self.loop.call_soon_threadsafe(self._orphaned)
            beat = self._heartbeat(max_run_s)
            self._watch_stall(beat.stalled_s)
            if not self._send(beat):
                return

    def _watch_stall(self, stalled_s: float) -> None:
        """Warn once per stall (claims, renewals and result writes that have made no
        progress for `STALL_WARN_S`), naming what blocks the database when that can be
        learned; the look runs in a thread of its own so heartbeats go on meanwhile."""
        if stalled_s < STALL_WARN_S:
            if stalled_s == 0.0:
                self._stall_warned = False
            return
        if self._stall_warned:
            return
        self._stall_warned = True
        threading.Thread(
            target=self._warn_stall, args=(stalled_s,), name="cairnqd-stall", daemon=True
        ).start()

    def _warn_stall(self, stalled_s: float) -> None:
        database = self.boot.database
        if database.path is not None:
            blocking: str | None = sqlite_lock_holders(
                database.path, ours=frozenset({os.getpid(), self.parent_pid})
            )
        else:
            blocking = postgres_blockers(database.dsn) if database.dsn else None
        log.warning(
            "claims and lease renewals have made no progress for %.0fs%s; tasks whose "
            "leases cannot be renewed are stopped before they end",
            stalled_s, f": {blocking}" if blocking else "",
        )  # fmt: skip

    def _heartbeat(self, max_run_s: float | None) -> Heartbeat:
        worker, reporter = self.worker, self.reporter
        report = (
            reporter.running_report(max_run_s)
            if reporter is not None
            else RunningReport(0, (), None, ())
        )
        held = len(worker.in_flight.backlog) if worker is not None else 0
        paused = _within(sorted(worker.paused_queues), 1024) if worker is not None else ()
        lag = self.loop_watch.lag() if self.loop is not None else 0.0
        stalled = worker.in_flight.progress.stalled_s() if worker is not None else 0.0
        return Heartbeat(
            rss=_rss_bytes(), state=self.state, executing=report.executing, held=held,
            lag_s=round(lag, 3), overdue=report.overdue, longest=report.longest,
            running=report.running, paused=paused,
            db_down_s=round(self._db_down_s(), 1), listen_deaf=self._listen_deaf(),
            stalled_s=round(stalled, 1),
            empty_wakes=worker.empty_wakes if worker is not None else 0,
        )  # fmt: skip

    # -- the events pipe ---------------------------------------------------------------

    def _send(self, message: Any) -> bool:
        """Queue a message; never blocks. False once the parent has gone."""
        return self.events.send(encode(message))

    def _send_final(self, message: Any) -> None:
        """A last word before exiting: wait (briefly) until the parent has it."""
        self._send(message)
        deadline = time.monotonic() + 2.0
        while not self.events.flush() and not self.events.broken:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)

    def _final_tally(self) -> None:
        if self.reporter is not None:
            self.reporter.stop()
            self.reporter.send_tally(force=True)
        deadline = time.monotonic() + 2.0
        while not self.events.flush() and time.monotonic() < deadline:
            time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cairnqd.daemon.child")
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--control", type=int, required=True)
    parser.add_argument("--starts", type=int, default=None)
    return Child(parser.parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
