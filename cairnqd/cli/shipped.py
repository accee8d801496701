"""The files cairnqd ships beside its code: the example config, the systemd unit and
the monitoring rules and dashboard.

A wheel carries them under `cairnqd/_shipped/` (pyproject's force-include), laid out
as in the repository (`config/`, `systemd/`, `monitoring/`); a source checkout reads
the repository's own copies, so an edit is seen without a rebuild.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SHIPPED", "shipped_path", "shipped_root"]

#: What each shipped file is, by its path under the root.
SHIPPED = {
    "config/cairnq.example.yaml": "every config setting with its default and a comment",
    "systemd/cairnqd.service": "the systemd unit (install notes: systemd/README.md)",
    "systemd/cairnqd.sysusers": "the service user, for systemd-sysusers",
    "monitoring/alerts.yaml": "Prometheus alert rules",
    "monitoring/grafana/cairnqd.json": "the Grafana dashboard",
}


def shipped_root() -> Path:
    package = Path(__file__).resolve().parents[1]
    installed = package / "_shipped"
    return installed if installed.is_dir() else package.parent


def shipped_path(name: str) -> Path:
    """The file `name` (a key of SHIPPED); FileNotFoundError if this install lacks it."""
    path = shipped_root() / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not part of this cairnqd installation")
    return path
