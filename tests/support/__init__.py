"""What the test suites share, imported from here and never from a test module.

- databases: the test databases (SQLite file, fresh Postgres database) and their fixtures
- waiting: condition waits with deadlines, how every test waits
- cli: the `cairnqd` command line run as a real process, and the `run` fixture
- daemon: the real daemon in a subprocess (`Daemon`), and the `daemon_factory` fixture
- harness: daemon configs, a client on a daemon's database, /metrics scrapes
- daemon_faults: the daemon's fault-path suites' config and task helpers
- executions: the execution log the fault handlers write
- worker: task-state waits, a worker run for a block, `ErrorLog`, worker subprocesses
- store: plain database access beside a store, processes that start together
- undecodable: rows another client wrote that this runtime cannot decode
- locks: another client holding the write lock (a database stall)
- monitoring_files: the files under monitoring/ and the metric names in them

databases, daemon and cli are pytest plugins: tests/conftest.py registers them, so their
fixtures reach every test. The handler modules a daemon under test loads by dotted path
("tests.daemon.handlers:registry" and the like) stay beside the suites that name them.
"""
