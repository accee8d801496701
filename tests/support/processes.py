"""Processes seen from /proc: which live processes a given one started, by command line.

For tests that must find a helper process (the daemon's handler import probe, say) that
carries no title of its own."""

from __future__ import annotations

from pathlib import Path


def parent_of(pid: int) -> int | None:
    """The parent pid of `pid`, or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def command_line(pid: int) -> str:
    """`pid`'s command line with spaces between the arguments; empty once it is gone
    (or a zombie)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def children_running(parent: int, needle: str) -> list[int]:
    """Live children of `parent` whose command line contains `needle`."""
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit()
        and parent_of(int(entry.name)) == parent
        and needle in command_line(int(entry.name))
    ]


def running(needle: str) -> list[int]:
    """Every live process whose command line contains `needle`."""
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and needle in command_line(int(entry.name))
    ]
