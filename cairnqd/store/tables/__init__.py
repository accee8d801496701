"""Tables above the protocol's: cairnqd's own state and reads, each a class over an
`Executor` (store/executor.py), reached from a store as `store.pauses`, `store.bulk`,
`store.dashboard`, `store.reports`, or built on one (`ScheduleTable(store)`)."""
