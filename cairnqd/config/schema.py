"""The `Setting` registry: every setting once, with its kind, default, doc comment
and reload class, plus the section kinds that give the settings their tree shape.

Validation, defaults, the canonical dump, the reload diff and the example file are
all driven from `SCHEMA`, so none of them can drift from the others."""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from cairnqd.config.bounds import (
    MAX_BUSY_TIMEOUT,
    MAX_CONCURRENCY,
    MAX_CONNECTIONS,
    MAX_MEMORY_BYTES,
    MAX_PREFETCH,
    MAX_PROCESSES,
    MAX_PURGE_BATCH,
    MAX_PURGE_BATCHES,
    MAX_RESTART_BUDGET,
    MAX_SEARCH_SCAN,
    MAX_TASKS_PER_CHILD,
    QUEUE_NAME_MAX_CHARS,
    STORED_TEXT_MAX_BYTES,
)
from cairnqd.config.checks import Checks
from cairnqd.config.finish import (
    finish_dashboard,
    finish_database,
    finish_group,
    finish_logging,
    finish_retention,
    finish_supervisor,
    finish_tracing,
)
from cairnqd.config.kinds import (
    INVALID,
    BoolKind,
    BucketsKind,
    DsnKind,
    DurationKind,
    EnumKind,
    HandlerPathKind,
    IntKind,
    Invalid,
    Kind,
    ListenKind,
    ListKind,
    MapKind,
    PathKind,
    PrefetchKind,
    SizeKind,
    StrKind,
    VersionKind,
    show_node,
)
from cairnqd.config.limit_kinds import NAME_GLOB, FieldKind, RateKind, finish_limit
from cairnqd.config.schedule_kinds import (
    CronKind,
    MisfireKind,
    PayloadKind,
    TimezoneKind,
    finish_schedule,
)
from cairnqd.config.sections import (
    DashboardConfig,
    DatabaseConfig,
    GroupConfig,
    LimitConfig,
    LoggingConfig,
    MetricsConfig,
    PurgeRule,
    ReaperConfig,
    ReloadConfig,
    RetentionConfig,
    ScheduleConfig,
    SupervisorConfig,
    TracingConfig,
)
from cairnqd.config.shadowing import check_rule_shadowing
from cairnqd.config.yamlload import YamlMapping, YamlNode, YamlPath, YamlScalar, YamlSequence
from cairnqd.limits import MAX_CAPACITY


class Reload(enum.Enum):
    """What a reload does with a changed setting."""

    RESTART = "restart-only"
    HOT = "parent-hot"
    SIZE = "size-only"
    ROLL = "roll"


REQUIRED: Any = object()
SAME: Any = object()


@dataclass(frozen=True)
class Setting:
    #: Dotted YAML path; `*` stands for any group name, `[]` for any list item.
    path: str
    kind: Kind
    #: The default as written in YAML (`"30s"`), parsed like user input.
    default: Any
    reload: Reload | None
    #: One sentence for the example file.
    doc: str = ""
    nullable: bool = False
    #: What the example file shows, when not the default.
    example: Any = SAME
    #: Shown commented out in the example: an alternative to a sibling.
    alternative: bool = False
    #: A bound that depends on another setting ("longer than heartbeat_interval"), for
    #: the reference; its section's finish function checks it.
    rule: str = ""

    @property
    def key(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def parent(self) -> str:
        return self.path.rpartition(".")[0]

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


class SectionKind(Kind):
    """A mapping of settings, built into a dataclass."""

    expected = "a mapping"

    def __init__(self, cls: type, finish: _Finish | None = None) -> None:
        self.cls = cls
        self.finish = finish
        self.pattern = ""  # set when SCHEMA is indexed

    def check(self, ck: Checks, node: YamlNode, path: YamlPath) -> Any:
        return self.build(ck, node, path, {})

    def build(self, ck: Checks, node: YamlNode, path: YamlPath, extra: dict[str, Any]) -> Any:
        if isinstance(node, YamlScalar) and node.value is None:  # `metrics:` left empty
            node = YamlMapping({}, node.position)
        if not isinstance(node, YamlMapping):
            raise self.fail(show_node(node))
        values = {**extra, **ck.section(node, self.pattern, path)}
        if self.finish is not None:
            values = self.finish(ck, values, path)
        if INVALID in values.values():
            return INVALID
        return self.cls(**values)

    def dump(self, value: Any) -> Any:
        return dump_section(value, self.pattern)


class GroupsKind(SectionKind):
    """Named sections, `groups: {name: {...}}` and `schedules: {name: {...}}`, in file
    order: each name matches ^[a-z][a-z0-9_-]*$ and goes into its section as `name_key`
    (a schedule's own `name` key is its task name, so its name goes in as `schedule`)."""

    NAME = re.compile(r"[a-z][a-z0-9_-]*")

    def __init__(
        self,
        cls: type,
        finish: _Finish | None = None,
        *,
        noun: str = "group",
        name_key: str = "name",
        required: bool = True,
    ) -> None:
        super().__init__(cls, finish)
        self.noun = noun
        self.name_key = name_key
        #: Whether at least one entry must be defined.
        self.required = required

    def check(self, ck: Checks, node: YamlNode, path: YamlPath) -> Any:
        if isinstance(node, YamlScalar) and node.value is None:
            node = YamlMapping({}, node.position)
        if not isinstance(node, YamlMapping):
            raise self.fail(show_node(node))
        if self.required and not node.entries:
            raise Invalid(f"define at least one {self.noun}")
        built: dict[str, Any] = {}
        for name, entry in node.entries.items():
            built[name] = ck.guard(self.build, entry.node, (*path, name), {self.name_key: name})
            if not self.NAME.fullmatch(name):
                message = f"{self.noun} name {name!r} must match ^[a-z][a-z0-9_-]*$"
                ck.error(entry.key_position, (*path, name), message)
                built[name] = INVALID
        return INVALID if INVALID in built.values() else MappingProxyType(built)

    def dump(self, value: Any) -> Any:
        return {name: dump_section(group, self.pattern) for name, group in value.items()}


class RulesKind(SectionKind):
    """A list of sections: `rules: [{...}, ...]`. `across` checks the items against one
    another, given every item, INVALID for those that failed their own checks: it runs
    on the rest even then, so one bad rule does not hide a problem between two others."""

    def __init__(self, cls: type, *, across: _Across | None = None) -> None:
        super().__init__(cls)
        self.across = across

    def check(self, ck: Checks, node: YamlNode, path: YamlPath) -> Any:
        if not isinstance(node, YamlSequence):
            raise Invalid(f"expected a list, got {show_node(node)}")
        rules = [ck.guard(self.build, item, (*path, i), {}) for i, item in enumerate(node.items)]
        if self.across is not None:
            self.across(ck, rules, path)
        return INVALID if INVALID in rules else tuple(rules)

    def dump(self, value: Any) -> Any:
        return [dump_section(rule, self.pattern) for rule in value]


_Finish = Callable[["Checks", dict[str, Any], YamlPath], dict[str, Any]]
_Across = Callable[["Checks", Sequence[Any], YamlPath], None]

_QUEUE = StrKind(
    r"[^\s\x00-\x1f]+",
    "a queue name without spaces",
    max_chars=QUEUE_NAME_MAX_CHARS,
    max_bytes=STORED_TEXT_MAX_BYTES,
)
_TASK_NAME = StrKind(max_bytes=STORED_TEXT_MAX_BYTES)
_RESOURCE = StrKind(r"[A-Za-z_][A-Za-z0-9_.-]*", "a name like gpu or db_writer")
_LOGGER = StrKind(r"[A-Za-z0-9_.-]+", "a logger name")
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_R, _H, _S, _L = Reload.RESTART, Reload.HOT, Reload.SIZE, Reload.ROLL
_DEFAULT_RULES = [
    {"status": "succeeded", "older_than": "7d"},
    {"status": "canceled", "older_than": "7d"},
    {"status": "failed", "older_than": "30d"},
]
# Histogram bounds in seconds, from a 5 ms task to an hour-long one.
_DURATION_BUCKETS = [
    0.005, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600
]  # fmt: skip
_WAIT_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800]
_EXAMPLE_SCHEDULES = {
    "nightly-echo": {
        "name": "demo.echo", "queue": "default", "payload": {"report": "nightly"},
        "cron": "0 3 * * *", "every": "1h", "timezone": "Europe/Berlin",
    },
}  # fmt: skip
_EXAMPLE_LIMITS = {
    "smtp": {"queues": ["email"], "concurrency": 3, "rate": "100/10s"},
}
_EXAMPLE_GROUPS = {
    "default": {"queues": ["default"]},
    "slow": {"queues": ["slow"], "concurrency": 2, "lease": "1m", "max_run": "30s"},
}

# One line of facts, one of documentation (rendered into the example file).
# fmt: off
SCHEMA: tuple[Setting, ...] = (
    Setting("version", VersionKind(), REQUIRED, None, example=1, doc=
            "Config format version; required."),
    Setting("instance", StrKind(r"[^\x00-\x1f\x7f]{1,100}", "a name of 1 to 100 printable "
            "characters"), None, _R, nullable=True, doc=
            "This daemon's name on the dashboard's Workers page and in its reports; null: "
            "host:pid."),
    Setting("database", SectionKind(DatabaseConfig, finish_database), {}, None,
            "Where the tasks live."),
    Setting("database.path", PathKind(), None, _R, nullable=True, example="./cairnq.db", doc=
            "SQLite database file, relative to this file's directory (the daemon and `cairnqd "
            "migrate` create it); set exactly one of path, dsn, dsn_file."),
    Setting("database.dsn", DsnKind(), None, _R, nullable=True, alternative=True,
            example="postgresql://cairnq@localhost/cairnq", doc=
            "Postgres connection string (postgresql://user:pass@host/db or key=value pairs); "
            "its password is never logged."),
    Setting("database.dsn_file", PathKind(), None, _R, nullable=True, alternative=True,
            example="${CREDENTIALS_DIRECTORY}/cairnq-dsn", doc=
            "File holding the Postgres DSN, read by the parent, trailing newline stripped; "
            "with systemd's LoadCredential= use ${CREDENTIALS_DIRECTORY}/<name>."),
    Setting("database.connect_timeout", DurationKind("1s"), "10s", _L,
            "Give up on one connection attempt after this long."),
    Setting("database.busy_timeout", DurationKind("1ms", MAX_BUSY_TIMEOUT), "5s", _L,
            "SQLite: how long a writer waits for the database lock."),
    Setting("database.connections_per_child", IntKind(1, ceiling=MAX_CONNECTIONS), 1, _L,
            "Database connections each child opens. On Postgres, 2 lets a child write its "
            "results beside its claims: lower pickup latency under a steady stream, for one "
            "more connection per child in the connection budget."),
    Setting("database.expected_hosts", IntKind(1, ceiling=MAX_CONNECTIONS), 1, _H,
            "Hosts running cairnqd on this database, for the Postgres connection budget."),
    Setting("database.connection_check", EnumKind("refuse", "warn", "off"), "refuse", _H,
            "When the Postgres connection budget exceeds the server's limits (or pool_size "
            "under a session pooler): refuse to start, warn, or off."),
    Setting("database.auto_migrate", BoolKind(), None, _H, nullable=True, doc=
            "Apply pending migrations at startup; null: true on SQLite, false on Postgres."),
    Setting("database.pooler", EnumKind("none", "session", "transaction"), "none", _R,
            "What sits between cairnqd and Postgres: none, or a pooler such as PgBouncer in "
            "session or transaction mode (no prepared statements, no session settings)."),
    Setting("database.direct_dsn", DsnKind(), None, _R, nullable=True, alternative=True,
            example="postgresql://cairnq@db-primary:5432/cairnq", doc=
            "Behind a pooler: a DSN that reaches Postgres directly, for the parent's one LISTEN "
            "connection (wake-ups are passed to the children), leadership and migrations."),
    Setting("database.direct_dsn_file", PathKind(), None, _R, nullable=True, alternative=True,
            example="${CREDENTIALS_DIRECTORY}/cairnq-direct-dsn", doc=
            "File holding direct_dsn, read like dsn_file."),
    Setting("database.pool_size", IntKind(1, ceiling=MAX_CONNECTIONS), None, _H, nullable=True,
            doc=
            "Under pooler: session, the server connections the pooler keeps for this database "
            "(PgBouncer's pool_size), for the connection check; null: not checked."),
    Setting("database.lock_namespace", IntKind(-(2**31), 2**31 - 1), 0x63716E64, _R,
            "First key of the Postgres advisory locks for purge and stats leadership "
            "(0x63716e64); the same on every host."),
    Setting("handlers", ListKind(HandlerPathKind()), [], _L, example=["cairnqd.demo:registry"], doc=
            "Handler registries for every group: module:attribute of a cairnqd TaskRegistry "
            "or of a cairnq Worker."),
    # -- python_path: where handler modules are imported from --------------------------
    Setting("python_path", ListKind(PathKind()), ["."], _L, doc=
            "Directories put first on sys.path to import the handlers from, relative to this "
            "file's directory ([.]: the directory of this file); used alike by every child "
            "and `cairnqd check --handlers`. The working directory is not on the path."),
    # ----------------------------------------------------------------------------------
    Setting("groups", GroupsKind(GroupConfig, finish_group), REQUIRED, None,
            example=_EXAMPLE_GROUPS, doc=
            "Pools of identical worker processes, by name (^[a-z][a-z0-9_-]*$); at least one."),
    Setting("groups.*.queues", ListKind(_QUEUE, non_empty=True), REQUIRED, _L,
            "Queues this group claims from; groups may share a queue."),
    Setting("groups.*.handlers", ListKind(HandlerPathKind()), None, _L, nullable=True, doc=
            "Handler registries for this group, replacing the top-level list; null inherits it."),
    Setting("groups.*.processes", IntKind(1, ceiling=MAX_PROCESSES), 1, _S,
            "Child processes in the pool."),
    Setting("groups.*.concurrency", IntKind(1, ceiling=MAX_CONCURRENCY), 4, _L,
            "Tasks in flight per child."),
    Setting("groups.*.prefetch", PrefetchKind(MAX_PREFETCH), "auto", _L,
            "Tasks each child claims beyond its free slots: auto sizes it from the "
            "handlers' pace; 0 claims only free slots."),
    Setting("groups.*.lease", DurationKind("1s"), "30s", _L,
            "Task lease; children renew it every lease/3."),
    Setting("groups.*.stall_timeout", DurationKind("100ms"), None, _L, nullable=True, doc=
            "Abort a child whose event loop is blocked this long (a sync call in an async "
            "handler) and hand its tasks back before their leases expire; null: lease/3."),
    Setting("groups.*.max_run", DurationKind("1s"), None, _L, nullable=True, doc=
            "Abort an attempt that runs longer than this; null: no limit."),
    Setting("groups.*.cancel_grace", DurationKind(), "10s", _H,
            "After a cancel of a running task: how long its handler may take to return by "
            "itself before an async one is cancelled, and then to stop before its child is "
            "replaced (docs/operations.md, \"Cancelling a running task\")."),
    Setting("groups.*.max_tasks_per_child", IntKind(1, ceiling=MAX_TASKS_PER_CHILD), None, _L,
            nullable=True, doc=
            "Replace a child after about this many tasks (up to 10% jitter); null: never."),
    Setting("groups.*.max_memory", SizeKind(maximum=MAX_MEMORY_BYTES), None, _L, nullable=True,
            doc=
            "Replace a child whose RSS exceeds this, checked between tasks; null: no limit."),
    Setting("groups.*.shutdown_timeout", DurationKind(), None, _L, nullable=True, doc=
            "How long this group's children may drain; null: the top-level shutdown_timeout."),
    Setting("groups.*.poll_interval", DurationKind("10ms"), "1s", _L,
            "Idle children look for new tasks this often."),
    Setting("groups.*.retry_backoff", DurationKind(), "1s", _L,
            "Retry delay after a first failed attempt; doubles per attempt, with jitter."),
    Setting("groups.*.retry_backoff_max", DurationKind(), "30s", _L,
            "Ceiling of the retry delay."),
    # A resource's units are calls in flight in one child: concurrency bounds them.
    Setting("groups.*.resources", MapKind(_RESOURCE, IntKind(1, ceiling=MAX_CONCURRENCY)), {}, _L,
            "Shared ceilings that handlers registered with resource= draw from, e.g. {gpu: 1}."),
    # -- schedules: recurring tasks (docs/schedules.md) --
    Setting("schedules", GroupsKind(ScheduleConfig, finish_schedule, noun="schedule",
            name_key="schedule", required=False), {}, None,
            example=_EXAMPLE_SCHEDULES, doc=
            "Recurring tasks, by name (^[a-z][a-z0-9_-]*$): the daemon enqueues each slot "
            "once across every host sharing the database (docs/schedules.md)."),
    Setting("schedules.*.name", _TASK_NAME, REQUIRED, _H,
            "Task name each slot submits (required)."),
    Setting("schedules.*.queue", _QUEUE, "default", _H,
            "Queue the task is submitted to."),
    Setting("schedules.*.payload", PayloadKind(), None, _H, doc=
            "The task's payload, any JSON value written as YAML."),
    Setting("schedules.*.priority", IntKind(-(2**31), 2**31 - 1), 0, _H,
            "The task's priority (higher runs first)."),
    Setting("schedules.*.max_attempts", IntKind(1, 2**31 - 1), 3, _H,
            "The task's attempts, retries included."),
    Setting("schedules.*.cron", CronKind(), None, _H, nullable=True, doc=
            "Five cron fields (minute hour day-of-month month day-of-week) or @hourly, "
            "@daily, @weekly, @monthly, @yearly; set exactly one of cron and every."),
    Setting("schedules.*.every", DurationKind("1s"), None, _H, nullable=True, alternative=True,
            doc="Fire every this long, counted from the Unix epoch (1h: on the hour)."),
    Setting("schedules.*.timezone", TimezoneKind(), None, _H, nullable=True, doc=
            "IANA zone the cron fields are read in (DST rule: docs/schedules.md); "
            "null: UTC."),
    Setting("schedules.*.jitter", DurationKind(), "0s", _H,
            "Delay each slot's task by up to this long (the same on every host)."),
    Setting("schedules.*.misfire", MisfireKind(), "once", _H,
            "Slots missed while no daemon ran: skip, once (the newest of them) or "
            "{catch_up: N} (the newest N)."),
    Setting("schedules.*.enabled", BoolKind(), True, _H,
            "false keeps the schedule configured but never fires it."),
    # -- end of schedules --
    # -- limits: flow control across hosts (docs/limits.md) --
    Setting("limits", GroupsKind(LimitConfig, finish_limit, noun="limit", required=False), {},
            None, example=_EXAMPLE_LIMITS, doc=
            "Flow-control limits, by name (^[a-z][a-z0-9_-]*$): how many of the tasks "
            "each covers may execute at once and how often they may start, across every "
            "cairnqd worker on the database (docs/limits.md)."),
    Setting("limits.*.queues", ListKind(_QUEUE, non_empty=True), None, _H, nullable=True, doc=
            "The queues whose tasks it covers; with names, a task must match both."),
    Setting("limits.*.names", ListKind(NAME_GLOB, non_empty=True), None, _H, nullable=True,
            doc=
            "Task names (globs with * and ?) it covers; set queues, names, or both."),
    Setting("limits.*.concurrency", IntKind(1, MAX_CAPACITY), None, _H, nullable=True, doc=
            "At most this many of its tasks claimed and not yet settled at once."),
    Setting("limits.*.rate", RateKind(), None, _H, nullable=True, doc=
            "At most COUNT starts in any window of DURATION, e.g. 100/10s."),
    Setting("limits.*.partition_by", FieldKind(), None, _H, nullable=True, doc=
            "A payload field (payload.tenant): each of its values gets a budget of its "
            "own; tasks without it share the partition (none)."),
    # -- end of limits --
    Setting("shutdown_timeout", DurationKind(), "30s", _H,
            "On TERM, how long children may finish in-flight tasks before they are stopped "
            "and their tasks handed back."),
    Setting("metrics", SectionKind(MetricsConfig), {}, None,
            "Prometheus metrics, served by the parent."),
    Setting("metrics.listen", ListenKind(), "127.0.0.1:9464", _R,
            "host:port to serve /metrics on (port 0 picks a free one), or off."),
    Setting("metrics.stats_ttl", DurationKind(), "10s", _H,
            "Reuse the database statistics for this long across scrapes."),
    Setting("metrics.queue_stats", EnumKind("all", "leader"), "all", _H,
            "Hosts that export per-queue database gauges: all, or one leader (Postgres)."),
    Setting("metrics.task_name_label", BoolKind(), False, _H,
            "Label task counters with the task name too."),
    Setting("metrics.duration_buckets", BucketsKind(), _DURATION_BUCKETS, _H,
            "Histogram bounds of task durations, in seconds."),
    Setting("metrics.wait_buckets", BucketsKind(), _WAIT_BUCKETS, _H,
            "Histogram bounds of queue waits, in seconds."),
    Setting("dashboard", SectionKind(DashboardConfig, finish_dashboard), {}, None,
            "The web dashboard (docs/dashboard.md), served by the parent or by "
            "`cairnqd dashboard`."),
    Setting("dashboard.listen", ListenKind(), "off", _R,
            "host:port to serve the dashboard on (port 0 picks a free one), or off; "
            "beyond loopback it needs token_file."),
    Setting("dashboard.token_file", PathKind(), None, _R, nullable=True, doc=
            "A file holding the token operators log in with (16 characters or more); "
            "null: no login, read-only, loopback only."),
    Setting("dashboard.viewer_token_file", PathKind(), None, _R, nullable=True, doc=
            "A file holding a second token (16 characters or more, not the operators'), "
            "for read-only logins: every page, no action; needs token_file."),
    Setting("dashboard.search_scan", IntKind(1, ceiling=MAX_SEARCH_SCAN), 50_000, _R,
            "The search box looks through at most this many of the newest tasks for a "
            "key, name or payload text, and says so when the table holds more."),
    Setting("dashboard.actions", BoolKind(), False, _R,
            "Offer retry, cancel, discard, pause/resume and schedule triggers (needs "
            "token_file); false: read-only, with no action endpoint at all."),
    Setting("dashboard.refresh", DurationKind("250ms"), "2s", _R,
            "How often the shared snapshot is read from the database, however many "
            "browsers watch."),
    Setting("dashboard.report", BoolKind(), False, _R,
            "Write this daemon's groups and children to the database every few seconds "
            "even when it serves no dashboard, for the Workers page of dashboards on other "
            "hosts (a daemon serving one always does)."),
    Setting("retention", SectionKind(RetentionConfig, finish_retention), {}, None,
            "Purging of finished tasks."),
    Setting("retention.interval", DurationKind("1s"), "10m", _H,
            "Time between purge sweeps; the first runs one interval after startup."),
    Setting("retention.batch", IntKind(1, ceiling=MAX_PURGE_BATCH), None, _H, nullable=True, doc=
            "Tasks deleted per purge transaction; null: 500 on SQLite, 1000 on Postgres."),
    Setting("retention.max_batches", IntKind(1, ceiling=MAX_PURGE_BATCHES), 100, _H,
            "Batches per rule per sweep; the rest waits for the next sweep."),
    Setting("retention.rules", RulesKind(PurgeRule, across=check_rule_shadowing), _DEFAULT_RULES,
            _H,
            "Purge rules. A task is kept for the shortest rule that matches it, so a rule "
            "inside a shorter one is an error; [] disables purging."),
    Setting("retention.rules[].older_than", DurationKind(), REQUIRED, _H,
            "delete tasks finished longer ago than this (required)"),
    Setting("retention.rules[].status", EnumKind("succeeded", "failed", "canceled"), None, _H,
            nullable=True, doc="only tasks that ended so"),
    Setting("retention.rules[].queue", _QUEUE, None, _H, nullable=True, doc=
            "only this queue"),
    Setting("retention.rules[].name", _TASK_NAME, None, _H, nullable=True, doc=
            "only this task name"),
    Setting("reaper", SectionKind(ReaperConfig), {}, None,
            "Recovery of expired leases."),
    Setting("reaper.interval", DurationKind("1s"), "15s", _H,
            "Recover expired leases this often, also on queues no child polls."),
    Setting("supervisor", SectionKind(SupervisorConfig, finish_supervisor), {}, None,
            "How the parent restarts children that die."),
    Setting("supervisor.restart_budget", IntKind(1, ceiling=MAX_RESTART_BUDGET), 10, _H,
            "Crash restarts a group may spend per restart_window before crashloop."),
    Setting("supervisor.restart_window", DurationKind("1s"), "5m", _H,
            "The sliding window restart_budget is counted over."),
    Setting("supervisor.backoff_max", DurationKind("100ms"), "60s", _H,
            "Cap of a slot's restart delay (1s doubling per consecutive crash, jittered)."),
    Setting("supervisor.boot_timeout", DurationKind("1s"), "60s", _H,
            "A child not ready this long after spawning is killed (db_wait excluded)."),
    Setting("supervisor.heartbeat_timeout", DurationKind("1s"), "30s", _H,
            "A ready child silent this long is aborted (SIGABRT, then SIGKILL).",
            rule="longer than heartbeat_interval"),
    Setting("supervisor.heartbeat_interval", DurationKind("100ms"), "5s", _H,
            "How often each child reports its state and memory."),
    Setting("supervisor.fatal_cooldown", DurationKind("1s"), "5m", _H,
            "A FATAL group (its children cannot boot) is started again after this long; "
            "a reload retries it at once."),
    Setting("reload", SectionKind(ReloadConfig), {}, None,
            "Rolling restarts on reload, and binary upgrades."),
    # More extra children than a group can have processes would never be spawned.
    Setting("reload.max_surge", IntKind(1, ceiling=MAX_PROCESSES), 1, _H,
            "Extra children a group may run while it rolls."),
    Setting("reload.upgrade_timeout", DurationKind("1s"), "2m", _H,
            "A binary upgrade (cairnqd upgrade) gives up, and the running parent carries "
            "on, unless the new parent's groups are all ready this long after it started."),
    Setting("logging", SectionKind(LoggingConfig, finish_logging), {}, None,
            "Logs go to stderr (the journal under systemd)."),
    Setting("logging.level", EnumKind(*_LEVELS, fold=True), "info", _H,
            "debug, info, warning, error or critical."),
    Setting("logging.format", EnumKind("text", "json"), "text", _H,
            "text, or json: one object per line."),
    Setting("logging.file", PathKind(), None, _H, nullable=True, doc=
            "Append logs to this file instead of stderr (SIGUSR1 reopens it); null: stderr."),
    Setting("logging.loggers", MapKind(_LOGGER, EnumKind(*_LEVELS, fold=True)), {}, _H,
            "Levels of single loggers, e.g. {psycopg: warning}."),
    Setting("tracing", SectionKind(TracingConfig, finish_tracing), {}, None,
            "OpenTelemetry traces of tasks (docs/observability.md, \"Traces\")."),
    Setting("tracing.enabled", BoolKind(), False, _L,
            "Each worker child sets up the OpenTelemetry SDK from the OTEL_* environment "
            "(needs opentelemetry-sdk and the exporter OTEL_TRACES_EXPORTER names)."),
    Setting("runtime_dir", PathKind(), None, _R, nullable=True, doc=
            "Directory of the state file, ours alone (0700 when created); null: "
            "$RUNTIME_DIRECTORY, else $XDG_RUNTIME_DIR/cairnqd, else $TMPDIR/cairnqd-<uid>."),
)
# fmt: on


def _section_pattern(setting: Setting) -> str:
    if isinstance(setting.kind, GroupsKind):  # schedules too
        return setting.path + ".*"
    if isinstance(setting.kind, RulesKind):
        return setting.path + "[]"
    return setting.path


def _index_schema() -> tuple[dict[str, list[Setting]], dict[str, Setting]]:
    children: dict[str, list[Setting]] = {"": []}
    by_path: dict[str, Setting] = {}
    for setting in SCHEMA:
        by_path[setting.path] = setting
        children.setdefault(setting.parent, []).append(setting)
        if isinstance(setting.kind, SectionKind):
            setting.kind.pattern = _section_pattern(setting)
            children.setdefault(setting.kind.pattern, [])
    return children, by_path


_CHILDREN, BY_PATH = _index_schema()


def child_settings(pattern: str) -> list[Setting]:
    return _CHILDREN[pattern]


def dump_section(obj: Any, pattern: str | None = None) -> dict[str, Any]:
    """A built section as YAML-level values, driven by the schema. Without a pattern,
    the section's own; `Config` passes the top level's, `""`, as it is defined in
    `root`, which imports this module."""
    if pattern is None:
        pattern = _PATTERN_OF[type(obj)]
    data: dict[str, Any] = {}
    for setting in child_settings(pattern):
        value = getattr(obj, setting.key)
        # None is "not set" for a nullable setting, but may mean more (listen: off).
        null = value is None and setting.nullable
        data[setting.key] = None if null else setting.kind.dump(value)
    return data


_PATTERN_OF: dict[type, str] = {
    s.kind.cls: s.kind.pattern for s in SCHEMA if isinstance(s.kind, SectionKind)
}
