"""A release's numbers agree (docs/releasing.md): the package version has a dated
CHANGELOG section, and `cairnqd version` prints every number an operator compares."""

from __future__ import annotations

import re
import tomllib
from datetime import date
from pathlib import Path

from cairnqd import __version__
from cairnqd.daemon.wire.messages import PROTOCOL_VERSION
from cairnqd.store.migrate import STORAGE_PROTOCOL_VERSION
from tests.support.cli import REPO, run_cli

_SECTION = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?$", re.M)


def _project_version() -> str:
    with (REPO / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def _sections() -> list[tuple[str, str | None]]:
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    return [(m["version"], m["date"]) for m in _SECTION.finditer(text)]


def test_the_version_is_a_dated_changelog_section() -> None:
    version = _project_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    sections = _sections()
    assert sections[0] == ("Unreleased", None), "the newest section is [Unreleased]"
    released = dict(sections[1:])
    assert version in released, f"CHANGELOG.md has no section for {version}"
    when = released[version]
    assert when is not None and date.fromisoformat(when) <= date.today()
    # Newest first, each version once.
    versions = [tuple(map(int, v.split("."))) for v, _ in sections[1:]]
    assert versions == sorted(set(versions), reverse=True)


def test_the_installed_version_is_the_projects() -> None:
    assert __version__ == _project_version()


def test_version_prints_every_number(tmp_path: Path) -> None:
    done = run_cli("version", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"cairnqd {__version__}"
    assert f"storage protocol {STORAGE_PROTOCOL_VERSION}" in lines
    assert f"pipe protocol {PROTOCOL_VERSION}" in lines
    [ledger] = [line for line in lines if line.startswith("extension migrations ")]
    assert re.fullmatch(r"extension migrations \d+ \(newest cairnqd_\d{4}_\w+\.sql\)", ledger)
    flag = run_cli("--version", cwd=tmp_path)
    assert flag.returncode == 0 and flag.stdout.strip() == f"cairnqd {__version__}"
