"""systemd/cairnqd.service: systemd itself accepts it, and it holds what its comments say.

`systemd-analyze verify` exits 0 on unknown keys and unparsable values and only warns on stderr,
so any stderr fails the test. It also checks that each Exec* binary exists, so it runs on a copy
whose Exec* lines point at a stand-in script; the shipped file is parsed as is for the values.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "cairnqd.service"
SYSUSERS = REPO / "systemd" / "cairnqd.sysusers"
SHIPPED_BINARY = "/usr/bin/cairnqd"

# Known-benign stderr lines from `verify`, each a full-line regex with its reason. Empty on
# systemd 252 as root and as an unprivileged user: add an entry only with a reason, never a
# catch-all, or the test stops catching misspelled keys.
BENIGN_VERIFY_STDERR: tuple[tuple[str, str], ...] = ()

Unit = dict[str, dict[str, list[str]]]


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is required in CI")
        pytest.skip(f"{name} not installed")
    return path


def parse_unit(text: str) -> Unit:
    """Sections -> key -> every assignment in order (SystemCallFilter= may repeat)."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not logical and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        line, logical = logical + line, ""
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        assert section is not None, f"assignment outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not an assignment: {line!r}"
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


@pytest.fixture(scope="module")
def unit() -> Unit:
    return parse_unit(UNIT.read_text())


def _verifiable_copy(tmp_path: Path, text: str) -> Path:
    stand_in = tmp_path / "cairnqd"
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    rewritten = []
    for line in text.splitlines(keepends=True):
        if line.startswith(("ExecStart=", "ExecReload=")):
            assert SHIPPED_BINARY in line
            line = line.replace(SHIPPED_BINARY, str(stand_in))
        rewritten.append(line)
    # Keep the file name: verify derives the unit name and type from it.
    copy = tmp_path / UNIT.name
    copy.write_text("".join(rewritten))
    return copy


def _verify(tmp_path: Path, text: str) -> tuple[int, list[str]]:
    copy = _verifiable_copy(tmp_path, text)
    proc = subprocess.run(
        [_tool("systemd-analyze"), "verify", "--man=no", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    unexplained = [
        line
        for line in proc.stderr.splitlines()
        if line.strip()
        and not any(re.fullmatch(pattern, line) for pattern, _ in BENIGN_VERIFY_STDERR)
    ]
    return proc.returncode, unexplained


def test_verify_is_clean(tmp_path: Path) -> None:
    rc, stderr = _verify(tmp_path, UNIT.read_text())
    assert rc == 0
    assert stderr == []


def test_verify_catches_a_bad_key(tmp_path: Path) -> None:
    # Proves the check above has teeth: a typo is rc 0 plus a warning, and the warning counts.
    broken = UNIT.read_text().replace("KillMode=mixed", "KillMode=mixed\nKilMode=mixed")
    rc, stderr = _verify(tmp_path, broken)
    assert rc == 0
    assert any("KilMode" in line for line in stderr), stderr


def test_security_exposure_under_threshold(tmp_path: Path) -> None:
    # threshold is 10x the exposure score; 20 keeps the ~1.4 we ship from drifting past 2.0.
    copy = _verifiable_copy(tmp_path, UNIT.read_text())
    proc = subprocess.run(
        [_tool("systemd-analyze"), "security", "--offline=true", "--threshold=20", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr


def test_sysusers_creates_cairnq(tmp_path: Path) -> None:
    proc = subprocess.run(
        [_tool("systemd-sysusers"), "--dry-run", f"--root={tmp_path}", str(SYSUSERS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Creating user 'cairnq'" in proc.stderr


EXPECTED: dict[str, dict[str, list[str]]] = {
    "Unit": {
        "Description": ["cairnqd task queue supervisor"],
        "After": ["network-online.target postgresql.service"],
        "Wants": ["network-online.target"],
        "StartLimitIntervalSec": ["300"],
        "StartLimitBurst": ["5"],
    },
    "Service": {
        "Type": ["notify"],
        "NotifyAccess": ["main"],
        "ExecStart": ["/usr/bin/cairnqd -c /etc/cairnq/cairnq.yaml"],
        "ExecReload": [
            "/usr/bin/cairnqd -c /etc/cairnq/cairnq.yaml reload --pid $MAINPID --wait 60s"
        ],
        "TimeoutStartSec": ["90"],
        "KillMode": ["mixed"],
        "KillSignal": ["SIGTERM"],
        "TimeoutStopSec": ["75"],
        "Restart": ["on-failure"],
        "RestartSec": ["2s"],
        "RestartPreventExitStatus": ["64 78"],
        "WatchdogSec": ["30s"],
        "User": ["cairnq"],
        "Group": ["cairnq"],
        "StateDirectory": ["cairnq"],
        "StateDirectoryMode": ["0750"],
        "WorkingDirectory": ["/var/lib/cairnq"],
        "RuntimeDirectory": ["cairnq"],
        "ConfigurationDirectory": ["cairnq"],
        "LoadCredential": ["cairnq-dsn:/etc/cairnq/dsn"],
        "Environment": ["PYTHONUNBUFFERED=1"],
        "SyslogIdentifier": ["cairnqd"],
        "UMask": ["0027"],
        "LimitNOFILE": ["65536"],
        "NoNewPrivileges": ["yes"],
        "ProtectSystem": ["strict"],
        "ProtectHome": ["yes"],
        "PrivateTmp": ["yes"],
        "PrivateDevices": ["yes"],
        "ProtectKernelTunables": ["yes"],
        "ProtectKernelModules": ["yes"],
        "ProtectKernelLogs": ["yes"],
        "ProtectControlGroups": ["yes"],
        "ProtectClock": ["yes"],
        "ProtectHostname": ["yes"],
        "ProtectProc": ["invisible"],
        "ProcSubset": ["pid"],
        "RestrictAddressFamilies": ["AF_UNIX AF_INET AF_INET6"],
        "RestrictNamespaces": ["yes"],
        "RestrictRealtime": ["yes"],
        "RestrictSUIDSGID": ["yes"],
        "LockPersonality": ["yes"],
        "MemoryDenyWriteExecute": ["yes"],
        "SystemCallArchitectures": ["native"],
        "SystemCallFilter": ["@system-service", "~@privileged @resources"],
        "CapabilityBoundingSet": [""],
        "DevicePolicy": ["closed"],
        "RemoveIPC": ["yes"],
    },
    "Install": {"WantedBy": ["multi-user.target"]},
}


@pytest.mark.parametrize(("section", "key"), [(s, k) for s, keys in EXPECTED.items() for k in keys])
def test_directive(unit: Unit, section: str, key: str) -> None:
    assert unit.get(section, {}).get(key) == EXPECTED[section][key]


def test_no_unexpected_directives(unit: Unit) -> None:
    # A directive added without its reason in the unit's comments (or left over from an edit).
    assert {s: sorted(keys) for s, keys in unit.items()} == {
        s: sorted(keys) for s, keys in EXPECTED.items()
    }


def test_reload_wait_fits_in_the_job_timeout(unit: Unit) -> None:
    # TimeoutStartSec= also bounds the reload job: systemd would kill ExecReload= first.
    (reload_cmd,) = unit["Service"]["ExecReload"]
    wait = re.search(r"--wait (\d+)s\b", reload_cmd)
    assert wait is not None
    assert int(wait.group(1)) < int(unit["Service"]["TimeoutStartSec"][0])


def test_newer_restart_keys_stay_commented() -> None:
    # RestartSteps=/RestartMaxDelaySec= are 254+; 252 warns on them, which fails verify in CI.
    text = UNIT.read_text()
    assert re.search(r"^#RestartSteps=", text, re.MULTILINE)
    assert not re.search(r"^\s*Restart(Steps|MaxDelaySec)=", text, re.MULTILINE)
