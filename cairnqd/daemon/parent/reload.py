"""Config reload (SIGHUP, SIGUSR2): validate, plan, then let the supervisor apply it.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from cairnqd.config import Config, ConfigError, Reload, diff_configs, load_config
from cairnqd.daemon import systemd
from cairnqd.daemon.logs import LoggingSetupError, configure_logging

# The reload is part of the parent's story in the log: same logger as the supervisor.
log = logging.getLogger("cairnqd.supervisor")

#: A config load still running after this long refuses the reload, so that
#: `reload --wait` gets an answer; a later reload starts a fresh load.
LOAD_TIMEOUT_S = 30.0


def restart_only_changes(old: Config, new: Config) -> list[str]:
    """Settings a running parent cannot change in place."""
    changed = []

    def where(c: Config) -> tuple[object, ...]:
        db = c.database
        return (db.path, db.dsn, db.direct_dsn, db.pooler)

    if where(old) != where(new):
        changed.append("database")
    if old.metrics.listen != new.metrics.listen:
        changed.append("metrics.listen")
    if old.runtime_dir != new.runtime_dir:
        changed.append("runtime_dir")
    return changed


@dataclass(frozen=True)
class Resize:
    group: str
    before: int
    after: int


@dataclass(frozen=True)
class ReloadPlan:
    """What one reload does; the supervisor applies it (`Supervisor.apply_reload`)."""

    config: Config
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    resized: tuple[Resize, ...] = ()
    #: Groups whose children are replaced: their config changed, or SIGUSR2.
    rolled: tuple[str, ...] = ()
    #: FATAL groups that get a fresh start.
    revived: tuple[str, ...] = ()
    #: Parent-hot settings that changed, by YAML path.
    hot: tuple[str, ...] = ()
    #: A new config generation: anything changed, or every group rolls.
    new_generation: bool = False

    def describe(self) -> list[str]:
        """One log line per change."""
        lines = [f"group {name} added" for name in self.added]
        lines += [f"group {name} removed: draining its children" for name in self.removed]
        lines += [f"group {r.group} resized: {r.before} -> {r.after}" for r in self.resized]
        lines += [f"group {name} rolls: its config changed" for name in self.rolled]
        lines += [f"group {name} was FATAL: starting it again" for name in self.revived]
        if self.hot:
            lines.append(f"settings applied in place: {', '.join(self.hot)}")
        return lines


def plan_reload(old: Config, new: Config, *, fatal: Collection[str], roll_all: bool) -> ReloadPlan:
    """The plan that takes a supervisor running `old` (with groups `fatal` FATAL) to
    `new`. `roll_all` (SIGUSR2) rolls every group that stays."""
    kept = [name for name in new.groups if name in old.groups]
    resized = tuple(
        Resize(name, old.groups[name].processes, new.groups[name].processes)
        for name in kept
        if old.groups[name].processes != new.groups[name].processes
    )
    rolled = tuple(
        name
        for name in kept
        if roll_all or old.group_fingerprint(name) != new.group_fingerprint(name)
    )
    changes = diff_configs(old, new)
    return ReloadPlan(
        config=new,
        added=tuple(name for name in new.groups if name not in old.groups),
        removed=tuple(name for name in old.groups if name not in new.groups),
        resized=resized,
        rolled=rolled,
        revived=tuple(name for name in kept if name in fatal),
        hot=tuple(c.path for c in changes if c.reload is Reload.HOT),
        new_generation=bool(changes) or roll_all,
    )


class ReloadTarget(Protocol):
    """What a reload needs of the supervisor."""

    config_path: str
    config: Config
    generation: int
    stopping: bool

    def fatal_groups(self) -> list[str]: ...

    def rolling(self) -> bool: ...

    def apply_reload(self, plan: ReloadPlan) -> None: ...

    def record_reload(self, ok: bool, errors: list[str], changes: Sequence[str] = ()) -> None: ...


class ConfigLoad:
    """`load_config` on a thread of its own, so that a slow or hostile file (a FIFO,
    a hung network mount, a file that is expensive to check) never stalls the
    supervisor's loop: it keeps reaping, ticking and answering while this runs, and
    takes the result once `done()`."""

    def __init__(self, path: str, roll_all: bool) -> None:
        self.path = path
        self.roll_all = roll_all
        self.started = time.monotonic()
        self._result: concurrent.futures.Future[Config] = concurrent.futures.Future()
        thread = threading.Thread(target=self._run, name="cairnqd-config-load", daemon=True)
        thread.start()

    def _run(self) -> None:
        try:
            config = load_config(self.path)
        except Exception as exc:  # reported on the loop, with the rest of the reload
            self._result.set_exception(exc)
        else:
            self._result.set_result(config)

    def done(self) -> bool:
        return self._result.done()

    def result(self) -> Config:
        """The new config; ConfigError, or whatever else loading raised."""
        return self._result.result(timeout=0)


class ConfigReload:
    """The supervisor's reloads: the file being loaded (off the loop), the reload
    being applied (until its rolls end) and the one queued behind them. Runs on the
    supervisor's loop, like everything it touches; `advance()` is its tick."""

    def __init__(self, target: ReloadTarget, *, process_label: str) -> None:
        self._target = target
        self._process_label = process_label
        self.pending: bool | None = None  # None, or "roll every group?"
        self.loading: ConfigLoad | None = None
        self.in_flight = False  # applied; waiting for its rolls to finish
        self._roll_failures: list[str] = []
        #: What the reload in flight changed (`ReloadPlan.describe`), for `reload --wait`.
        self._changes: list[str] = []

    @property
    def busy(self) -> bool:
        return self.loading is not None or self.in_flight

    def request(self, *, roll_all: bool) -> None:
        if self._target.stopping:
            log.info("stopping; reload ignored")
            return
        if self.busy:
            self.pending = bool(self.pending) or roll_all
            log.info("a reload is in progress; this one is queued behind it")
            return
        self._start(roll_all)

    def _start(self, roll_all: bool) -> None:
        systemd.reloading("reloading configuration")
        self.loading = ConfigLoad(self._target.config_path, roll_all)

    def advance(self) -> None:
        """The reload's step in each tick: take a finished load, report a reload whose
        rolls are over, and start the one queued behind."""
        self._poll_load()
        if self.in_flight and not self._target.rolling():
            self.in_flight = False
            failures, self._roll_failures = self._roll_failures, []
            self._target.record_reload(not failures, failures, self._changes)
        if self.pending is not None and not self.busy and not self._target.stopping:
            roll_all, self.pending = self.pending, None
            self._start(roll_all)

    def _poll_load(self) -> None:
        load = self.loading
        if load is None:
            return
        if not load.done():
            waited = time.monotonic() - load.started
            if waited > LOAD_TIMEOUT_S:
                self.loading = None  # its thread is left to finish; its result is dropped
                self._refuse([f"{load.path}: still loading after {waited:.0f}s; reload refused"])
            return
        self.loading = None
        if self._target.stopping:
            return
        try:
            new = load.result()
        except ConfigError as exc:
            self._refuse([str(p) for p in exc.problems])
        except Exception as exc:
            log.exception("loading %s failed", load.path)
            self._refuse([f"{load.path}: cannot load: {type(exc).__name__}: {exc}"])
        else:
            self._validated(new, load.roll_all)

    def _validated(self, new: Config, roll_all: bool) -> None:
        target = self._target
        refused = restart_only_changes(target.config, new)
        if refused:
            generation = target.generation
            self._refuse(
                [f"{key} changed: needs a restart; still running generation {generation}"
                 for key in refused]
            )  # fmt: skip
            return
        try:
            # First of the changes: a log file that cannot be opened refuses the whole
            # reload, and configure_logging leaves the old setup in place when it fails.
            configure_logging(new.logging, process_label=self._process_label)
        except LoggingSetupError as exc:
            self._refuse([str(exc)])
            return
        plan = plan_reload(target.config, new, fatal=target.fatal_groups(), roll_all=roll_all)
        self._apply(plan)

    def _apply(self, plan: ReloadPlan) -> None:
        target = self._target
        target.apply_reload(plan)
        self._changes = plan.describe()
        for line in self._changes:
            log.info("reload: %s", line)
        if plan.new_generation:
            log.info("reloaded: generation %d", target.generation)
        else:
            log.info("reloaded: nothing changed; still generation %d", target.generation)
        self.in_flight = True
        self._roll_failures = []

    def _refuse(self, errors: list[str]) -> None:
        for line in errors:
            log.error("reload refused: %s", line)
        self._target.record_reload(False, errors)

    def roll_failed(self, error: str) -> None:
        """A group's roll stopped (a new child could not boot): the reload fails."""
        if self.in_flight:
            self._roll_failures.append(error)
