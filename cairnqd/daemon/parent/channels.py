"""The children's events pipes in the supervisor's selector, and their exits.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import time
from collections.abc import Callable, Iterator

from cairnqd.daemon.parent.metrics import Metrics
from cairnqd.daemon.parent.pool import ChildProcess
from cairnqd.daemon.wire.messages import (
    CancelStuck,
    Fatal,
    Goodbye,
    Heartbeat,
    MessageError,
    Ready,
    Room,
    decode_child,
)
from cairnqd.daemon.wire.pipes import PipeError

log = logging.getLogger("cairnqd.supervisor")

#: A child that keeps writing garbage gets one log line per this many seconds.
MALFORMED_LOG_EVERY_S = 10.0
# Messages that change what the loop must do next (the rest are task events).
_STATE_MESSAGES = (Ready, Goodbye, Fatal, CancelStuck)


def _never(_child: ChildProcess) -> bool:
    return False


class ChildChannels:
    def __init__(
        self,
        selector: selectors.BaseSelector,
        metrics: Metrics,
        alarming: Callable[[ChildProcess], bool] = _never,
    ) -> None:
        self._selector = selector
        self._metrics = metrics
        #: Whether a child's last heartbeat calls for the loop's steps now (a stall
        #: or an overrun the deadlines act on), rather than at the next tick.
        self._alarming = alarming
        self._by_fd: dict[int, ChildProcess] = {}
        self._by_pid: dict[int, ChildProcess] = {}
        #: Other processes of ours whose exit someone waits for (a successor parent).
        self._watched: dict[int, Callable[[int], None]] = {}
        #: Called when a child said whether it has room (`ChildProcess.room`), and when
        #: one is reaped (no room): relayed wake-ups are routed by it (wakerouting.py).
        self.on_room: Callable[[ChildProcess], None] | None = None

    def add(self, child: ChildProcess) -> None:
        """Watch a child just spawned."""
        self._by_fd[child.events.fd] = child
        self._by_pid[child.pid] = child
        self._selector.register(child.events.fd, selectors.EVENT_READ)

    def watch(self, pid: int, on_exit: Callable[[int], None]) -> None:
        """Call `on_exit(returncode)` when `pid`, a child process that is no worker,
        is reaped: the reaping here takes every exited child."""
        self._watched[pid] = on_exit

    def live(self) -> list[ChildProcess]:
        """Every child spawned and not yet reaped."""
        return list(self._by_pid.values())

    def read(self, fd: int) -> bool:
        """Handle what the child on `fd` sent; True if its state changed (ready, bye,
        fatal, closed pipe, a heartbeat that is `alarming`), which the loop acts on at
        once rather than next tick."""
        child = self._by_fd.get(fd)
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
            try:
                message = decode_child(line)
            except MessageError as exc:
                self._malformed(child, exc)
                continue
            child.on_message(message, time.monotonic())
            if isinstance(message, Room) and self.on_room is not None:
                self.on_room(child)
            self._metrics.record_event(child.group, child.slot, message, child=child.worker_id)
            changed |= isinstance(message, _STATE_MESSAGES)
            if isinstance(message, Heartbeat):
                changed |= self._alarming(child)
        if child.events.closed:
            self._forget_fd(child)
            changed = True
        return changed

    def reap(self) -> Iterator[tuple[ChildProcess, int]]:
        """Every child that has exited, with its `Popen.returncode` (status, or
        -signal); its last words read and its pipes closed. Other processes
        reparented to us (a handler's grandchildren) are reaped and ignored."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self._by_pid.pop(pid, None)
            if child is None:
                on_exit = self._watched.pop(pid, None)
                if on_exit is not None:
                    on_exit(os.waitstatus_to_exitcode(status))
                continue
            code = child.proc.returncode = os.waitstatus_to_exitcode(status)
            self.read(child.events.fd)
            self._forget_fd(child)
            child.close_pipes()
            self._metrics.forget_incarnation(child.worker_id)
            child.said_room = False
            if self.on_room is not None:
                self.on_room(child)  # what it was sent alone goes to another
            yield child, code

    def _forget_fd(self, child: ChildProcess) -> None:
        if self._by_fd.pop(child.events.fd, None) is not None:
            self._selector.unregister(child.events.fd)

    def _malformed(self, child: ChildProcess, error: MessageError) -> None:
        if child.count_malformed(time.monotonic(), MALFORMED_LOG_EVERY_S):
            log.warning(
                "child %d of %s wrote a malformed message (%d so far): %s",
                child.pid, child.group, child.malformed, error,
            )  # fmt: skip
