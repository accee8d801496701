"""Every command and option explains itself; the top-level help has examples and
every exit code."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator

from cairnqd import __version__
from cairnqd.cli.main import build_parser
from cairnqd.daemon import exitcodes


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("cairnqd",)
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_command_has_a_description_and_every_option_help() -> None:
    missing = []
    for path, parser in _parsers(build_parser()):
        if len(path) > 1 and not (parser.description or "").strip():
            missing.append(f"{' '.join(path)}: no description")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    if not (choice.help or "").strip():
                        missing.append(f"{' '.join(path)} {choice.dest}: no help line")
            elif not (action.help or "").strip() or action.help == argparse.SUPPRESS:
                name = "/".join(action.option_strings) or action.dest
                missing.append(f"{' '.join(path)} {name}: no help")
    assert missing == []
    assert len(list(_parsers(build_parser()))) >= 15  # the walk did reach the commands


def test_top_level_help_has_examples_and_every_exit_code() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cairnqd.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    text = done.stdout
    assert "examples:\n  cairnqd init" in text
    codes = text.split("exit codes:\n", 1)[1]
    for name in exitcodes.__all__:
        assert f"\n  {getattr(exitcodes, name):<3} " in "\n" + codes, name
    assert "no such task" in codes and "wrong state" in codes and "--conflict reject" in codes
    assert "(submit --wait)" in codes


def test_version_flag() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cairnqd.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, f"cairnqd {__version__}\n")
