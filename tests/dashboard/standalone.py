"""`Standalone`: `cairnqd dashboard -c FILE` run as a real process, for the dashboard suites."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from tests.support.cli import REPO_ENV
from tests.support.waiting import wait_for


class Standalone:
    def __init__(self, config_path: Path, *args: str) -> None:
        self.log = config_path.parent / f"standalone-{len(args)}.log"
        self.out = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cairnqd.cli", "-c", str(config_path), "dashboard", *args],
            env=REPO_ENV,
            cwd=config_path.parent,
            stdout=self.out,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def port(self) -> int:
        def seen() -> int | None:
            assert self.proc.poll() is None, self.output()
            for line in self.output().splitlines():
                if "dashboard on http://" in line:
                    return int(line.rsplit(":", 1)[1].split("/")[0])
            return None

        return wait_for("the standalone dashboard's port", seen, 60)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
        self.out.close()
        return self.proc.returncode
