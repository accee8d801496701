"""`cairnqd init [DIR]`: a starter config an operator can run at once.

It writes DIR/cairnq.yaml (DIR is created if missing), or the file itself when the
argument names a `.yaml`/`.yml` file: SQLite beside the file, one
group on the `default` queue, the demo handlers with a commented line for the
operator's own, and the shipped files' location in its header. It never overwrites:
an existing file is left alone (exit 1). It then prints the two commands that create
the database and start the daemon, written so they work from the current directory.
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import TYPE_CHECKING

from cairnqd.cli.admin import CliError
from cairnqd.cli.shipped import shipped_root
from cairnqd.daemon import exitcodes

if TYPE_CHECKING:
    from cairnqd.cli.admin import Subparsers

__all__ = ["STARTER", "add_parser", "cmd_init"]

STARTER = """\
# cairnqd starter config, written by `cairnqd init`. Every setting, its default and
# what it does: {example}
# (the systemd unit and the monitoring rules are beside it, under {root}).
# Relative paths are taken from this file's directory.
version: 1

database:
  # The SQLite file; `cairnqd migrate` creates it. For Postgres, replace the line
  # with `dsn: postgresql://user@host/db` (or `dsn_file:`) and run migrate.
  path: cairnq.db

# Handler registries, module:attribute. The demo handlers (demo.echo, demo.sleep,
# demo.fail) let you try submit, list and inspect at once; replace them with yours.
handlers:
  - cairnqd.demo:registry
  # - myapp.tasks:registry

# Where `myapp` above is imported from: directories relative to this file.
python_path: [.]

# One pool of worker processes; add groups to give queues processes of their own.
groups:
  default:
    queues: [default]
    processes: 1
    concurrency: 4

metrics:
  # Prometheus /metrics and /healthz; `off` to disable.
  listen: 127.0.0.1:9464
"""


def _target(argument: str) -> tuple[str, str]:
    """The directory to create and the file to write for `init ARGUMENT`. A name ending
    in .yaml or .yml is the file (a directory of that name was made before, a surprise);
    an existing file is neither."""
    if argument.endswith((".yaml", ".yml")) and not os.path.isdir(argument):
        return os.path.dirname(argument) or ".", argument
    if os.path.exists(argument) and not os.path.isdir(argument):
        raise CliError(
            exitcodes.USAGE,
            f"{argument} is a file, not a directory: give the directory to write "
            "cairnq.yaml in, or a new file name ending in .yaml",
        )
    return argument, os.path.join(argument, "cairnq.yaml")


def cmd_init(args: argparse.Namespace) -> int:
    directory, path = _target(args.directory)
    root = shipped_root()
    text = STARTER.format(example=root / "config" / "cairnq.example.yaml", root=root)
    try:
        os.makedirs(directory, exist_ok=True)
        # O_EXCL: never overwrite, not even a file created a moment ago.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise CliError(
            exitcodes.NOTHING_DONE, f"{path} already exists; not overwriting it"
        ) from None
    except OSError as exc:
        raise CliError(exitcodes.NOINPUT, f"cannot write {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    config = shlex.quote(path)
    print(f"wrote {path}")
    print("next:")
    print(f"  cairnqd -c {config} migrate    # create the SQLite database")
    print(f"  cairnqd -c {config}            # run the daemon (Ctrl-C stops it)")
    return exitcodes.OK


def add_parser(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "init",
        parents=parents,
        help="write a starter cairnq.yaml (SQLite, one group, demo handlers)",
        description=__doc__.split("\n\n")[1],
    )
    p.add_argument(
        "directory",
        nargs="?",
        default=".",
        metavar="DIR|FILE.yaml",
        help="where to write cairnq.yaml (default: the current directory), or the config "
        "file to write",
    )
    p.set_defaults(func=cmd_init)
