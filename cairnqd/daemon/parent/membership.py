"""This daemon's row in the fleet registry (store/tables/fleet.py): written when the
maintenance thread first runs, stamped every `BEAT_S` with the groups it runs, marked
stopped when the daemon stops cleanly. A daemon that dies goes silent instead, and
`cairnqd fleet` counts it gone once its stamp is older than the live window."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable

from cairnqd.config import Config
from cairnqd.daemon.wire.messages import PROTOCOL_VERSION
from cairnqd.store.base import TaskStore
from cairnqd.store.tables.fleet import HONOURED_FEATURES

log = logging.getLogger("cairnqd.fleet")


def daemon_id() -> str:
    """How a daemon names itself in the registry: its host and pid, as the dashboard's
    reports name it."""
    return f"{socket.gethostname()}/{os.getpid()}"


class Membership:
    def __init__(self, config: Callable[[], Config], version: str) -> None:
        self._config = config
        self._version = version
        self.daemon = daemon_id()
        source = config().source
        self._config_path = os.path.abspath(source) if source else ""
        self._joined = False
        self._told_ahead = False

    async def beat(self, store: TaskStore) -> None:
        """Join (first time, or when the row was forgotten), else stamp the row."""
        groups = sorted(self._config().groups)
        if self._joined and await store.fleet.beat(self.daemon, groups):
            return
        await store.fleet.join(
            self.daemon,
            host=socket.gethostname(),
            pid=os.getpid(),
            config=self._config_path,
            version=self._version,
            pipe_protocol=PROTOCOL_VERSION,
            features=HONOURED_FEATURES,
            groups=groups,
        )
        if not self._joined:
            self._joined = True
            await store.fleet.prune()
            await self._say_what_is_ahead(store)

    async def leave(self, store: TaskStore) -> None:
        """Mark this daemon stopped, if it ever joined."""
        if self._joined:
            await store.fleet.leave(self.daemon)
            self._joined = False

    async def _say_what_is_ahead(self, store: TaskStore) -> None:
        """Once: the features the database uses that this code does not honour, as
        after a rollback to an older release."""
        if self._told_ahead:
            return
        self._told_ahead = True
        unknown = [f for f in await store.fleet.features() if f.name not in HONOURED_FEATURES]
        if unknown:
            named = ", ".join(f"{f.name} (since {f.since})" for f in unknown)
            log.warning(
                "this database uses features this cairnqd %s does not honour: %s; "
                "upgrade this daemon, or expect them to be ignored by it",
                self._version,
                named,
            )
