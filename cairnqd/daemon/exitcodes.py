"""Process exit codes, from BSD `sysexits.h`.

systemd's `RestartPreventExitStatus=64 78` keys on these, so a usage or config error
never restart-loops while a database outage (69) or a crash (70) does.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CONFIG",
    "DATAERR",
    "NOINPUT",
    "NOTHING_DONE",
    "OK",
    "SOFTWARE",
    "TEMPFAIL",
    "UNAVAILABLE",
    "USAGE",
]

OK: Final = 0  # success; a clean shutdown
NOTHING_DONE: Final = 1  # ran, but nothing to act on: not found, no state change, task failed
USAGE: Final = 64  # bad command line (argparse's 2, remapped)
DATAERR: Final = 65  # bad input data: invalid JSON, not a cairnq database, protocol mismatch
NOINPUT: Final = 66  # an input file does not exist or cannot be read
UNAVAILABLE: Final = 69  # the database or the daemon cannot be reached
SOFTWARE: Final = 70  # internal error: a bug
TEMPFAIL: Final = 75  # try again later: lock held by another daemon, a wait timed out
CONFIG: Final = 78  # invalid config, refused reload, or no group can boot
