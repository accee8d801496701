"""The upper bounds of the config's numbers, durations and names, and where each comes
from.

A value past what the daemon can use must be refused by `load_config` (and so by
`cairnqd check`), not by a child's boot or a store call long after the daemon started.
Some bounds are the runtime's own: the config may not import the store or the daemon
(pyproject.toml, the import contract "config"), so those are repeated here, and
tests/config/test_value_ranges.py checks each copy against its source. The others are
sane ceilings on counts the runtime would take but no deployment needs, far below the
64-bit integers the parent's pipe to its children refuses past (`wire.messages`).
"""

from __future__ import annotations

from datetime import timedelta

# -- durations

#: The longest duration the task store takes (`MAX_DURATION_MS` of
#: cairnqd/store/arguments.py: 100 years of 365 days): a longer lease fails every
#: claim, a longer jitter or retry delay every submit or retry, a longer `older_than`
#: every purge. No other duration needs more, so it bounds every duration setting.
MAX_DURATION = timedelta(days=36_500)
#: SQLite keeps busy_timeout in a 32-bit count of milliseconds (24d20h31m): a larger
#: `pragma busy_timeout` silently reads as 0, and a busy database then fails at once.
MAX_BUSY_TIMEOUT = timedelta(days=24)

# -- names the store keeps

#: A queue name's most characters: the queue pause table's CHECK and `QUEUE_MAX` of
#: cairnqd/store/operator.py, which `cairnqd pause` and the dashboard apply.
QUEUE_NAME_MAX_CHARS = 255
#: The most UTF-8 bytes of a task's name or queue the store takes in a submit
#: (`MAX_TEXT_BYTES` of cairnqd/store/arguments.py).
STORED_TEXT_MAX_BYTES = 1000

# -- counts

#: Child processes per group: each is a Python process with its slot, pipes and start
#: table in the parent; past this, a typo (`processes: 100000000000`) would exhaust the
#: parent's memory before the first spawn.
MAX_PROCESSES = 1024
#: Tasks in flight per child, and the fixed prefetch beyond them. Every task a child
#: holds takes a slot of its start table (`CAPACITY` = 4096 in cairnqd/daemon/starts.py),
#: which also keeps results waiting to be written: both at their ceiling hold half of it.
MAX_CONCURRENCY = 1024
MAX_PREFETCH = 1024
#: Tasks before a child is replaced; the boot adds up to 10% jitter on top.
MAX_TASKS_PER_CHILD = 1_000_000_000
#: A child's RSS: far beyond any host's memory, well inside the pipe's integers.
MAX_MEMORY_BYTES = 1024 * 2**40
#: Postgres's own ceiling of max_connections (2^18 - 1): no count of hosts, pooled server
#: connections or connections of one child can usefully exceed it.
MAX_CONNECTIONS = 262_143
#: Tasks deleted per purge transaction (one statement holding the write lock), and
#: batches per rule per sweep.
MAX_PURGE_BATCH = 100_000
MAX_PURGE_BATCHES = 1_000_000
#: Tasks the dashboard's search looks through per search.
MAX_SEARCH_SCAN = 10_000_000
#: Crash restarts per window before a group is in crashloop.
MAX_RESTART_BUDGET = 1_000_000
#: A histogram bound of the metrics, in seconds: no task runs or waits longer than the
#: longest duration the store takes.
MAX_BUCKET_S = int(MAX_DURATION.total_seconds())
