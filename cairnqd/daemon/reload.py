"""Config reload (SIGHUP, SIGUSR2): validate, apply, then roll the groups that changed.

Design note. The new file is parsed and validated first; on any error the old config
keeps running and the refusal is reported (state file, metrics, systemd STATUS).
Settings a running parent cannot change in place (`restart_only_changes`) refuse the
whole reload rather than half-apply it. SIGHUP then rolls only the groups whose
fingerprint changed; SIGUSR2 rolls every group. A roll replaces up to
`reload.max_surge` children of a group at a time, each old child leaving only once its
successor is ready, and a reload asked for during a roll waits for it to end.
"""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING

from cairnqd.config import Config, ConfigError, GroupConfig, load_config
from cairnqd.daemon import systemd
from cairnqd.daemon.logs import LoggingSetupError, configure_logging, logging_settings
from cairnqd.daemon.messages import SetLogging, encode
from cairnqd.daemon.pool import GroupPool
from cairnqd.daemon.statefile import after_reload

if TYPE_CHECKING:
    from cairnqd.daemon.supervisor import Supervisor

# The reload is part of the parent's story in the log: same logger as the supervisor.
log = logging.getLogger("cairnqd.supervisor")


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


class ConfigReload:
    """The supervisor's reloads: the one being applied, the rolls it started and the
    one queued behind them. Runs on the supervisor's loop, like everything it touches."""

    def __init__(self, supervisor: Supervisor, *, process_label: str) -> None:
        self._sup = supervisor
        self._process_label = process_label
        self.rolls: dict[str, list[int]] = {}
        self.pending: bool | None = None  # None, or "roll every group?"
        self.in_flight = False  # a reload waiting for its rolls to finish

    def request(self, *, roll_all: bool) -> None:
        if self._sup.stopping:
            log.info("stopping; reload ignored")
            return
        if self.rolls:
            self.pending = bool(self.pending) or roll_all
            log.info("a roll is in progress; reload queued")
            return
        self._reload(roll_all)

    def _reload(self, roll_all: bool) -> None:
        sup = self._sup
        systemd.reloading("reloading configuration")
        try:
            new = load_config(sup.config_path)
        except ConfigError as exc:
            errors = [str(p) for p in exc.problems]
            for line in errors:
                log.error("reload refused: %s", line)
            self._finished(False, errors)
            return
        refused = restart_only_changes(sup.config, new)
        if refused:
            errors = [f"{key} changed: needs a restart; still running generation "
                      f"{sup.generation}" for key in refused]  # fmt: skip
            for line in errors:
                log.error("reload refused: %s", line)
            self._finished(False, errors)
            return
        try:
            # First of the changes: a log file that cannot be opened refuses the whole
            # reload, and configure_logging leaves the old setup in place when it fails.
            configure_logging(new.logging, process_label=self._process_label)
        except LoggingSetupError as exc:
            log.error("reload refused: %s", exc)
            self._finished(False, [str(exc)])
            return
        self._apply(new, roll_all)

    def _apply(self, new: Config, roll_all: bool) -> None:
        sup = self._sup
        old, sup.config = sup.config, new
        self._forward_logging(new)
        sup.generation += 1
        sup.maintenance.reconfigure(new)
        sup.metrics.apply_config(new)
        for name in list(sup.groups):
            if name not in new.groups:
                self._retire_group(name)
        for name, group_config in new.groups.items():
            self._apply_group(name, group_config, old, roll_all)
        log.info("reloaded: generation %d", sup.generation)
        if self.rolls:
            self.in_flight = True
        else:
            self._finished(True, [])

    def _forward_logging(self, config: Config) -> None:
        """Children apply the reloaded logging settings in place; children spawned
        later get them in their boot message."""
        settings = logging_settings(config.logging)
        for child in self._sup.all_children():
            child.control.send_whole(encode(SetLogging(settings)))

    def _retire_group(self, name: str) -> None:
        group = self._sup.groups.pop(name)
        log.info("group %s removed: draining its children", name)
        for child in group.children():
            child.state = "draining"
            child.signal(signal.SIGTERM)
        self._sup.orphans.append(group)

    def _apply_group(self, name: str, config: GroupConfig, old: Config, roll_all: bool) -> None:
        sup = self._sup
        fingerprint = sup.config.group_fingerprint(name)
        group = sup.groups.get(name)
        if group is None:
            sup.groups[name] = GroupPool(config, fingerprint, sup.config)
            return
        if group.state == "fatal":
            # Every reload retries a FATAL group with a fresh budget.
            sup.groups[name] = GroupPool(config, fingerprint, sup.config)
            return
        changed = roll_all or fingerprint != group.fingerprint
        group.config, group.fingerprint = config, fingerprint
        settings = sup.config.supervisor
        group.budget.configure(settings.restart_budget, settings.restart_window.total_seconds())
        for child in group.resize(config.processes):
            child.signal(signal.SIGTERM)
        if changed:
            self.rolls[name] = [s.index for s in group.slots if s.child is not None]

    # -- rolling --------------------------------------------------------------------------

    def advance_rolls(self) -> None:
        """Replace up to `reload.max_surge` children per group at a time: spawn each
        successor, wait for it to be ready, TERM the old child (it drains with its old
        config), and start the next once the old one has exited. Capacity never drops
        below the configured size."""
        sup = self._sup
        surge = sup.config.reload.max_surge
        for name in list(self.rolls):
            group = sup.groups[name]
            pending = self.rolls[name]
            self._promote_ready_successors(group)
            in_progress = sum(1 for s in group.slots if s.successor is not None)
            in_progress += len(group.retired)
            while pending and in_progress < surge:
                slot = group.slots[pending.pop(0)]
                if slot.child is None:
                    continue  # the slot died meanwhile; it restarts with the new config
                slot.successor = sup.spawn(group.config, slot.index, sup.generation)
                in_progress += 1
            if not pending and in_progress == 0:
                del self.rolls[name]
        if not self.rolls and self.in_flight:
            self._finished(True, [])
        if not self.rolls and self.pending is not None:
            roll_all, self.pending = self.pending, None
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
                    self._sup.metrics.child_restart(group.name, "reload")

    def stop_roll(self, group: str, error: str) -> bool:
        """End the roll of `group`, whose new child cannot boot; False if it was not
        rolling. A roll stops at the first such child; old children keep serving."""
        if group not in self.rolls:
            return False
        del self.rolls[group]
        self._finished(False, [f"group {group} kept generation: {error}"])
        log.error("roll of group %s stopped: new child cannot boot: %s", group, error)
        return True

    def _finished(self, ok: bool, errors: list[str]) -> None:
        sup = self._sup
        self.in_flight = False
        sup.state = after_reload(sup.state, ok=ok, errors=errors, generation=sup.generation)
        sup.metrics.reload_result(ok, sup.generation)
        sup.write_state()
        status = f"generation {sup.generation}" if ok else f"reload failed: {errors[0]}"
        systemd.notify("READY=1", f"STATUS={status}")
