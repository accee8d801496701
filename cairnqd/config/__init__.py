"""The daemon's configuration: one schema, frozen dataclasses, every error at once.

The reasoning: docs/architecture.md, "Config design notes".
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
    TracingConfig,
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
    "TracingConfig",
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
