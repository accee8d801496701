"""`load_config`: read, interpolate and validate a file into a `Config`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

from cairnqd.config.checker import Checker
from cairnqd.config.finish import finish_root
from cairnqd.config.kinds import INVALID
from cairnqd.config.problems import ConfigError, ConfigProblem
from cairnqd.config.root import Config
from cairnqd.config.schema import SectionKind
from cairnqd.config.yamlload import (
    YamlDocument,
    YamlSyntaxError,
    interpolate,
    load_yaml,
    locate,
)

# The top level is a section too; built here, since `root` imports the schema.
_ROOT = SectionKind(Config, finish_root)


def _by_position(problem: ConfigProblem) -> tuple[str, int, int]:
    return problem.file, problem.line, problem.col


def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Config:
    """Read, interpolate and validate a config file.

    Raises ConfigError with every problem found. `env` (default `os.environ`) feeds
    `${VAR}` interpolation and the default `runtime_dir`. Relative paths in the file
    are resolved against the file's directory."""
    filename = os.fspath(path)
    environ = os.environ if env is None else env
    try:
        document = load_yaml(filename)
    except OSError as exc:
        message = f"cannot read the config file: {exc.strerror or exc}"
        raise ConfigError([ConfigProblem(filename, 0, 0, "", message)]) from None
    except YamlSyntaxError as exc:
        at = exc.position
        raise ConfigError([ConfigProblem(at.file, at.line, at.col, "", exc.message)]) from None
    root, interpolation_problems = interpolate(document.root, environ)
    ck = Checker(root, environ, os.path.dirname(os.path.abspath(filename)))
    for problem in (*document.problems, *interpolation_problems):
        ck.error(problem.position, problem.path, problem.message)
        if problem.value_lost:
            ck.lost.add(problem.path)
    config = ck.guard(_ROOT.check, root, ())
    # Stable, so problems at one position keep schema order.
    warnings = sorted(ck.warnings, key=_by_position)
    if ck.problems or config is INVALID:
        raise ConfigError(sorted(ck.problems, key=_by_position), warnings)
    assert isinstance(config, Config)
    return replace(config, source=filename, warnings=tuple(warnings))


def setting_position(filename: str, path: tuple[str, ...]) -> str | None:
    """`file:line:col` where the setting at `path` is written in `filename`, or None
    when the file does not set it (its default applies) or cannot be read again. For
    errors found after the load (a port already in use), which the config no longer
    knows the position of."""
    try:
        root = load_yaml(filename).root
    except (OSError, YamlSyntaxError):
        return None
    if YamlDocument(root).node(path) is None:
        return None
    return str(locate(root, path))
