"""The web dashboard: served by the daemon's parent (`dashboard.listen`) or on its own
(`cairnqd dashboard -c FILE`). See docs/dashboard.md.

`markup` escapes, `params` reads requests, `data` does the database work on a thread
of its own with one shared snapshot (`reads` keeps the values of rows other clients
wrote as stored), `pages` renders (`values` shows any stored value), `auth` checks logins and CSRF,
`actions` does and logs what an operator asks, `server` serves it all over HTTP,
`standalone` runs it without a daemon.
"""

from cairnqd.dashboard.data import DashboardData
from cairnqd.dashboard.server import DashboardBindError, DashboardServer

__all__ = ["DashboardBindError", "DashboardData", "DashboardServer"]
