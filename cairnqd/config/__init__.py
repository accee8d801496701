"""The daemon's configuration: one schema, frozen dataclasses, every error at once.

Design note. `SCHEMA` lists every setting once: its YAML path, kind, default, doc
comment and reload class (`Reload`). That one table drives validation, the
defaults, the canonical dump behind `config dump` and fingerprints, the reload diff
and `config/cairnq.example.yaml` (`render_example()`), so none of them can drift from
the others (gunicorn's `Setting` registry does the same for its CLI and docs).

Loading never stops at the first problem. Each setting is checked where it is
written; a bad one becomes `INVALID` and checks that depend on it are skipped, so
one typo yields one message. Every problem carries `file:line:col` and the YAML
path, and `load_config` raises them together as `ConfigError` (exit 78 in the CLI).
Only a YAML syntax error, which stops the parser, comes alone.

Decisions worth knowing:
- Durations need a unit (`250ms`, `30s`, `5m`, `1h`, `7d`, `1h30m`); a bare number
  is an error, because `lease: 30` could mean seconds or milliseconds. They load as
  `timedelta`; `to_ms()` gives the SDK's integer milliseconds exactly.
- `handlers` lists `module:attribute` registries. A group's own `handlers` list
  *replaces* the top-level one (null inherits it): a group serving a dedicated queue
  should not import, or claim for, every other group's handlers.
- Relative paths (`database.path`, `database.dsn_file`, `logging.file`,
  `runtime_dir`, `python_path`) are taken from the config file's directory, never the
  working directory, and held absolute: every command and every child reads the same
  files wherever it was started.
- Backend-dependent defaults (`database.auto_migrate`, `retention.batch`) and
  `runtime_dir` are resolved at load, so a dump shows what actually runs.

Where things are, in import order (each module imports only those above it; the
checker's type in annotations aside):
- `units`, `dsn`, `problems`: durations and sizes, DSN text, `ConfigError`.
- `sections`: the frozen dataclass of each section.
- `kinds`: how one setting is read from YAML and written back.
- `shadowing`, `finish`: cross-field checks, run once a section's settings are read.
- `schema`: `SCHEMA`, the `Setting` registry, and the kinds that build sections.
- `root`: `Config`, with its schema-driven dump and fingerprints.
- `checker`, `load`: the walk over the document, and `load_config`.
- `diff`, `example`: the reload diff, and `render_example()` (`python -m cairnqd.config`).
"""

from cairnqd.config.diff import ConfigChange, diff_configs
from cairnqd.config.dsn import redact_dsn
from cairnqd.config.example import render_example

# `x as x`: re-exported for cairnqd's own modules (mypy --strict) but not in __all__.
from cairnqd.config.finish import default_runtime_dir as default_runtime_dir
from cairnqd.config.load import load_config, setting_position
from cairnqd.config.problems import ConfigError, ConfigProblem
from cairnqd.config.root import Config
from cairnqd.config.schema import SCHEMA, Reload, Setting
from cairnqd.config.sections import (
    DatabaseConfig,
    GroupConfig,
    ListenAddress,
    LoggingConfig,
    MetricsConfig,
    PurgeRule,
    ReaperConfig,
    ReloadConfig,
    RetentionConfig,
    ScheduleConfig,
)
from cairnqd.config.sections import SupervisorConfig as SupervisorConfig  # `x as x`: as above
from cairnqd.config.units import format_duration, format_size, parse_duration, parse_size, to_ms

__all__ = [
    "SCHEMA",
    "Config",
    "ConfigChange",
    "ConfigError",
    "ConfigProblem",
    "DatabaseConfig",
    "GroupConfig",
    "ListenAddress",
    "LoggingConfig",
    "MetricsConfig",
    "PurgeRule",
    "ReaperConfig",
    "Reload",
    "ReloadConfig",
    "RetentionConfig",
    "ScheduleConfig",
    "Setting",
    "diff_configs",
    "format_duration",
    "format_size",
    "load_config",
    "parse_duration",
    "parse_size",
    "redact_dsn",
    "render_example",
    "setting_position",
    "to_ms",
]
