"""The daemon's configuration: one schema, frozen dataclasses, every error at once.

The reasoning: docs/architecture.md, "Config design notes".
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

#: Where each name of the package lives. The package imports a module on first use of
#: one of its names: a daemon child or a store that needs a duration parser or a DSN
#: redactor no longer loads the schema, the YAML loader and the diff with it.
_HOME = {
    "ConfigChange": "diff",
    "diff_configs": "diff",
    "redact_dsn": "dsn",
    "render_example": "example",
    "default_runtime_dir": "finish",
    "load_config": "load",
    "setting_position": "load",
    "ConfigError": "problems",
    "ConfigProblem": "problems",
    "Config": "root",
    "SCHEMA": "schema",
    "Reload": "schema",
    "Setting": "schema",
    "DatabaseConfig": "sections",
    "GroupConfig": "sections",
    "ListenAddress": "sections",
    "LoggingConfig": "sections",
    "MetricsConfig": "sections",
    "PurgeRule": "sections",
    "ReaperConfig": "sections",
    "ReloadConfig": "sections",
    "RetentionConfig": "sections",
    "ScheduleConfig": "sections",
    "TracingConfig": "sections",
    "SupervisorConfig": "sections",
    "format_duration": "units",
    "format_size": "units",
    "parse_duration": "units",
    "parse_size": "units",
    "to_ms": "units",
}

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


if not TYPE_CHECKING:  # mypy sees the imports above; a module __getattr__ would blind it

    def __getattr__(name: str) -> object:
        home = _HOME.get(name)
        if home is None:
            raise AttributeError(f"module 'cairnqd.config' has no attribute {name!r}")
        value = getattr(importlib.import_module(f"cairnqd.config.{home}"), name)
        globals()[name] = value
        return value
