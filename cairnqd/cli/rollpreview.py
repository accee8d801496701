"""What a reload would cut short, said by `reload --wait` before it signals.

The running daemon's control snapshot gives each group's config fingerprint and the
tasks its children run; the edited config file says which groups roll (a changed
fingerprint, or every group with `--all`), shrink or go. The children those leave
drain: a task still running at its group's `shutdown_timeout` is cut short and handed
back with its attempt given back (docs/operations.md, "What a deploy does to running
tasks"). Best effort: a file that does not load or a daemon that does not answer
previews nothing, and the reload itself then says what is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cairnqd.config import Config, load_config
from cairnqd.config.units import elapsed_text
from cairnqd.daemon.parent.control import DaemonUnreachable, ask_daemon, control_path


def load_edited(config_path: str) -> Config | None:
    """The config file as the reload will read it; None when it does not load."""
    try:
        return load_config(config_path)
    except Exception:  # the daemon refuses it, and `reload --wait` prints why
        return None


def ask_running(state_path: str) -> Mapping[str, Any] | None:
    """The running daemon's snapshot; None when its control socket does not answer."""
    try:
        return ask_daemon(control_path(state_path), timeout_s=2.0)
    except DaemonUnreachable:
        return None


def preview_lines(snapshot: Mapping[str, Any], edited: Config, *, roll_all: bool) -> list[str]:
    """One paragraph per group whose children the reload replaces or stops while they
    run tasks: the tasks, longest-running first."""
    lines: list[str] = []
    for group in snapshot.get("groups", []):
        found = _leaving(group, edited, roll_all)
        if found is None:
            continue
        change, children = found
        tasks = sorted(
            (t for c in children for t in c.get("running", [])),
            key=lambda t: -float(t.get("age_s", 0.0)),
        )
        executing = sum(int(c.get("executing", 0)) for c in children)
        if executing == 0 and not tasks:
            continue
        count = max(executing, len(tasks))
        timeout = elapsed_text(float(group.get("shutdown_timeout_s", 0.0)))
        noun, finish = ("tasks", "they finish") if count != 1 else ("task", "it finishes")
        lines.append(
            f"group {group['name']}: {change} will interrupt {count} running {noun} "
            f"unless {finish} within its shutdown_timeout ({timeout}):"
        )
        lines += [
            f"  {t['id']} {t['name']} (running {elapsed_text(float(t['age_s']))})" for t in tasks
        ]
        if count > len(tasks):
            lines.append(f"  and {count - len(tasks)} more")
    return lines


def _leaving(
    group: Mapping[str, Any], edited: Config, roll_all: bool
) -> tuple[str, Sequence[Mapping[str, Any]]] | None:
    """What the reload does to `group` that stops running children, and which."""
    name = group["name"]
    serving = [c for c in group.get("children", []) if c.get("role") == "slot"]
    if name not in edited.groups:
        return "removing it", serving
    fingerprint = group.get("fingerprint")
    if roll_all or (fingerprint is not None and edited.group_fingerprint(name) != fingerprint):
        return "rolling it", serving
    processes = edited.groups[name].processes
    if processes < int(group.get("processes", 0)):
        return "shrinking it", [c for c in serving if int(c.get("slot", 0)) >= processes]
    return None


__all__ = ["ask_running", "load_edited", "preview_lines"]
