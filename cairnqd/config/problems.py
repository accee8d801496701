"""What a failed load reports: one `ConfigProblem` per reason, raised together as
`ConfigError`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cairnqd.errors import CairnQError


@dataclass(frozen=True, order=True)
class ConfigProblem:
    file: str
    line: int
    col: int
    path: str
    message: str

    def __str__(self) -> str:
        where = self.file if self.line == 0 else f"{self.file}:{self.line}:{self.col}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class ConfigError(CairnQError):
    """The config cannot be used; `problems` holds every reason, sorted by position."""

    def __init__(
        self, problems: Sequence[ConfigProblem], warnings: Sequence[ConfigProblem] = ()
    ) -> None:
        self.problems = list(problems)
        self.warnings = list(warnings)
        super().__init__("\n".join(str(p) for p in self.problems))
