"""Fixtures for the store suite: an old public SDK release, installed once and cached."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.store import REPO

CAIRNQ_020_DIR = REPO / ".interop" / "cairnq-0.2.0"


def _installed(target: Path) -> bool:
    return (target / "cairnq" / "__init__.py").is_file() and any(
        target.glob("cairnq-0.2.0.dist-info")
    )


@pytest.fixture(scope="session")
def cairnq_020() -> Path:
    """A folder holding the public `cairnq==0.2.0` (import it with PYTHONPATH=<folder>).

    0.2.0 cannot live beside 0.15.1 in the venv, so it is installed with `--target`
    into a gitignored cache and only ever imported by child processes.
    """
    if _installed(CAIRNQ_020_DIR):
        return CAIRNQ_020_DIR
    CAIRNQ_020_DIR.parent.mkdir(parents=True, exist_ok=True)
    staging = CAIRNQ_020_DIR.with_name(f"cairnq-0.2.0.tmp-{os.getpid()}")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--target",
            str(staging),
            "cairnq==0.2.0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"could not install cairnq==0.2.0 into {staging}:\n{proc.stderr}")
    try:
        staging.rename(CAIRNQ_020_DIR)
    except OSError:
        # Another session won the race; its copy is as good as ours.
        shutil.rmtree(staging, ignore_errors=True)
        if not _installed(CAIRNQ_020_DIR):
            raise
    return CAIRNQ_020_DIR
