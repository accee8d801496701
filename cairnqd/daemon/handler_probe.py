"""Import handler registries the way a child does, in a process of their own.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cairnqd.daemon.systemd import child_environment
from cairnqd.registry import HandlerError, resolve_handlers

__all__ = [
    "ProbeResult",
    "child_argv_prefix",
    "describe_import_error",
    "probe_handlers",
    "use_python_path",
]


def child_argv_prefix() -> list[str]:
    """How a child or a probe starts: this interpreter, with `-P` so the working
    directory is never on `sys.path` (only `python_path` and PYTHONPATH are)."""
    return [sys.executable, "-P"]


def use_python_path(directories: Sequence[str]) -> None:
    """Put `directories` first on `sys.path`, in their order (the config made them
    absolute); a directory already there moves to the front."""
    for directory in reversed(directories):
        while directory in sys.path:
            sys.path.remove(directory)
        sys.path.insert(0, directory)


_OWN_FILES = ("/importlib/", "<frozen ", os.path.join("cairnqd", "registry.py"))


def describe_import_error(error: HandlerError) -> str:
    """`file:line: what` for a registry that failed to load: where the application's
    code broke (a syntax error's own position, else the innermost frame that is not
    the import machinery), or the module's file when an attribute is missing."""
    cause = error.__cause__
    where = None
    if isinstance(cause, SyntaxError) and cause.filename:
        where = f"{cause.filename}:{cause.lineno}"
    elif cause is not None:
        frames = [
            f
            for f in traceback.extract_tb(cause.__traceback__)
            if not any(own in f.filename for own in _OWN_FILES)
        ]
        if frames:
            where = f"{frames[-1].filename}:{frames[-1].lineno}"
    else:
        module = sys.modules.get(error.spec.partition(":")[0])
        if module is not None and getattr(module, "__file__", None):
            where = f"{module.__file__}:1"
    text = str(error)
    if isinstance(cause, ModuleNotFoundError) and where is None:
        text += f" (sys.path starts with {', '.join(sys.path[:3])})"
    return f"{where}: {text}" if where else text


@dataclass(frozen=True)
class ProbeResult:
    """One registry list's outcome: the task names it defines, or why it failed."""

    names: tuple[str, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _probe_here(handler_lists: Iterable[Sequence[str]]) -> list[ProbeResult]:
    results = []
    for specs in handler_lists:
        try:
            handlers = resolve_handlers(specs)
        except HandlerError as exc:
            results.append(ProbeResult(error=describe_import_error(exc)))
        else:
            results.append(ProbeResult(names=tuple(sorted(handlers))))
    return results


def probe_handlers(
    python_path: Sequence[str], handler_lists: Sequence[Sequence[str]], timeout_s: float = 60.0
) -> list[ProbeResult]:
    """Import each list of registries in a fresh process set up as a child is; one
    result per list, in order. A probe that crashes or hangs fails every list."""
    request = json.dumps({"python_path": list(python_path), "handlers": list(handler_lists)})
    argv = [*child_argv_prefix(), "-m", "cairnqd.daemon.handler_probe", str(os.getpid())]
    try:
        done = subprocess.run(
            argv,
            input=request,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=child_environment(),
            check=False,
        )
    except subprocess.TimeoutExpired:
        failure = f"importing the handlers took longer than {timeout_s:g}s"
        return [ProbeResult(error=failure) for _ in handler_lists]
    try:
        answers = json.loads(done.stdout.splitlines()[-1])
        return [ProbeResult(tuple(a["names"]), a["error"]) for a in answers]
    except (IndexError, ValueError, KeyError, TypeError):
        tail = " ".join(done.stderr.strip().splitlines()[-3:]) or "no output"
        failure = f"the handler import probe exited {done.returncode}: {tail}"
        return [ProbeResult(error=failure) for _ in handler_lists]


_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """SIGKILL from the kernel when our parent dies. A daemon killed (or stopped by a
    signal) during its preflight would otherwise leave the probe behind, for ever when
    a handler's import hangs. Nothing to clean up here: it only imports."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the parent's own stop still kills us (subprocess.run)
    if os.getppid() != parent:  # it died before the prctl took effect
        os._exit(1)


def main() -> int:
    if len(sys.argv) > 1:
        _die_with(int(sys.argv[1]))
    request = json.loads(sys.stdin.read())
    use_python_path(request["python_path"])
    results = _probe_here(request["handlers"])
    # Last line of stdout: an imported module may print on its own.
    answer = [{"names": list(r.names), "error": r.error} for r in results]
    sys.stdout.write("\n" + json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
