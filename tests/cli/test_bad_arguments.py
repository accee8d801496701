"""Bad arguments to the database commands: an empty id, key, filter or reason, bytes that
are not UTF-8, an integer or a duration past what the store takes, a payload nested
too deep, `--conflict` without `--key`. Each is refused with a line naming the option
and what is wrong (exit 64; 65 for the payload's data), never an internal error.

One migrated SQLite database serves the whole module: each refusal must come before
anything is written, and the few commands that do write only add tasks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support.cli import GROUPS, cli, database_line, write_config

# A limit `limits set` may change; `tasks.db` is created by `migrate` below.
LIMITS = """\
limits:
  api:
    queues: [default]
    rate: 5/1s
"""
#: What Python makes of the argument bytes `x\xff` (not UTF-8): a lone surrogate, which
#: the subprocess call turns back into the same bytes.
NOT_UTF8 = "x\udcff"
#: Past every 64-bit integer column.
HUGE = "99999999999999999999"
INT8_MAX = 2**63 - 1
INT4_MAX = 2**31 - 1
INT4_MIN = -(2**31)


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("bad-arguments")
    path = write_config(
        directory, database_line("sqlite", str(directory / "tasks.db")), LIMITS, GROUPS
    )
    migrated = cli(path, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    return path


def refused(config: Path, *args: str, code: int = 64) -> str:
    """Run the command, expect `code` without a traceback, return its stderr."""
    result = cli(config, *args)
    assert result.returncode == code, (args, result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    return result.stderr


def last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


def case(value: object) -> str | None:
    """A case's id: its command line (pytest escapes what is not ASCII)."""
    return " ".join(value) if isinstance(value, list) else None


# -- empty strings -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["inspect", ""], "argument TASK_ID"),
        (["cancel", ""], "argument TASK_ID"),
        (["retry", ""], "argument TASK_ID"),
        (["inspect", "--key", ""], "argument --key"),
        (["cancel", "--key", ""], "argument --key"),
        (["retry", "--key", ""], "argument --key"),
        (["pause", "--queue", "default", "--reason", ""], "argument --reason"),
        (["limits", "set", "api", "--rate", "1/1ms", "--reason", ""], "argument --reason"),
        # The same kinds of argument on the commands beside them.
        (["stats", "--queue", ""], "argument --queue"),
        (["list", "--queue", ""], "argument --queue"),
        (["list", "--name", ""], "argument --name"),
        (["cancel", "--queue", "", "--dry-run"], "argument --queue"),
        (["retry", "--name", "", "--dry-run"], "argument --name"),
        (["purge", "--queue", "", "--dry-run"], "argument --queue"),
        (["purge", "--name", "", "--dry-run"], "argument --name"),
        (["submit", ""], "argument NAME"),
        (["submit", "demo.echo", "--queue", ""], "argument --queue"),
        (["submit", "demo.echo", "--key", ""], "argument --key"),
        (["submit", "demo.echo", "--after", ""], "argument --after"),
        (["limits", "set", "", "--rate", "1/1s"], "argument name"),
    ],
    ids=case,
)
def test_an_empty_argument_is_refused_by_name(config: Path, args: list[str], named: str) -> None:
    assert last_line(refused(config, *args)).endswith(f"{named}: must not be empty")


# -- bytes that are not UTF-8 --------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["inspect", NOT_UTF8], "argument TASK_ID"),
        (["cancel", NOT_UTF8], "argument TASK_ID"),
        (["cancel", "--key", NOT_UTF8], "argument --key"),
        (["list", "--queue", NOT_UTF8], "argument --queue"),
        (["list", "--name", NOT_UTF8], "argument --name"),
        (["cancel", "--queue", NOT_UTF8, "--dry-run"], "argument --queue"),
        (["pause", "--queue", NOT_UTF8], "argument --queue"),
        (["purge", "--queue", NOT_UTF8, "--dry-run"], "argument --queue"),
        # The same kinds of argument on the commands beside them.
        (["retry", "--key", NOT_UTF8], "argument --key"),
        (["retry", "--name", NOT_UTF8, "--dry-run"], "argument --name"),
        (["inspect", "--key", NOT_UTF8], "argument --key"),
        (["stats", "--queue", NOT_UTF8], "argument --queue"),
        (["resume", "--queue", NOT_UTF8], "argument --queue"),
        (["pause", "--queue", "default", "--reason", NOT_UTF8], "argument --reason"),
        (["purge", "--name", NOT_UTF8, "--dry-run"], "argument --name"),
        (["submit", NOT_UTF8], "argument NAME"),
        (["submit", "demo.echo", "--queue", NOT_UTF8], "argument --queue"),
        (["submit", "demo.echo", "--key", NOT_UTF8], "argument --key"),
        (["submit", "demo.echo", "--after", NOT_UTF8], "argument --after"),
        (["limits", "set", "api", "--rate", "1/1s", "--reason", NOT_UTF8], "argument --reason"),
        (["limits", "set", NOT_UTF8, "--rate", "1/1s"], "argument name"),
        (["limits", "reset", NOT_UTF8], "argument name"),
    ],
    ids=case,
)
def test_an_argument_that_is_not_utf8_is_refused_by_name(
    config: Path, args: list[str], named: str
) -> None:
    # The bytes as the operator typed them, escaped: never a lone surrogate.
    expected = f"{named}: not valid UTF-8: 'x\\xff'"
    assert last_line(refused(config, *args)).endswith(expected)


def test_text_that_is_utf8_is_taken_whatever_its_script(config: Path) -> None:
    refused(config, "submit", "demo.echo", "--queue", "ünï", "--key", NOT_UTF8)
    made = cli(config, "submit", "demo.echo", "--queue", "ünï", "--key", "ключ")
    assert made.returncode == 0, made.stderr
    task_id = made.stdout.strip()
    shown = json.loads(cli(config, "inspect", "--key", "ключ", "--json").stdout)
    assert shown["id"] == task_id and shown["queue"] == "ünï"
    listed = cli(config, "list", "--queue", "ünï", "--name", "demo.echo", "--json")
    assert [t["id"] for t in json.loads(listed.stdout)] == [task_id]


# -- integers and durations out of range ---------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected", "bound"),
    [
        (
            ["list", "--limit", HUGE],
            f"argument --limit: must be 1 to {INT8_MAX}, got {HUGE}",
            ["list", "--limit", str(INT8_MAX)],
        ),
        # An empty page said "N more (next page: --offset 0)".
        (
            ["list", "--limit", "0"],
            f"argument --limit: must be 1 to {INT8_MAX}, got 0",
            ["list", "--limit", "1"],
        ),
        (
            ["list", "--offset", HUGE],
            f"argument --offset: must be 0 to {INT8_MAX}, got {HUGE}",
            ["list", "--offset", str(INT8_MAX)],
        ),
        (
            ["purge", "--limit", HUGE, "--queue", "q", "--dry-run"],
            f"argument --limit: must be 1 to 100000, got {HUGE}",
            ["purge", "--limit", "100000", "--queue", "q", "--dry-run"],
        ),
        (
            ["purge", "--limit", HUGE],
            f"argument --limit: must be 1 to 100000, got {HUGE}",
            ["purge", "--limit", "100000"],
        ),
        (
            ["purge", "--older-than", "36501d", "--dry-run"],
            "argument --older-than: must be at most 36500d, got 36501d",
            ["purge", "--older-than", "36500d", "--dry-run"],
        ),
        (
            ["submit", "demo.echo", "--delay", "36501d"],
            "argument --delay: must be at most 36500d, got 36501d",
            ["submit", "demo.echo", "--delay", "36500d"],
        ),
        (
            ["submit", "demo.echo", "--max-attempts", "99999999999"],
            f"argument --max-attempts: must be 1 to {INT4_MAX}, got 99999999999",
            ["submit", "demo.echo", "--max-attempts", str(INT4_MAX)],
        ),
        (
            ["submit", "demo.echo", "--priority", "99999999999"],
            f"argument --priority: must be {INT4_MIN} to {INT4_MAX}, got 99999999999",
            ["submit", "demo.echo", "--priority", str(INT4_MIN)],
        ),
    ],
    ids=case,
)
def test_a_number_out_of_range_is_refused_with_the_range(
    config: Path, args: list[str], expected: str, bound: list[str]
) -> None:
    assert last_line(refused(config, *args)).endswith(expected)
    taken = cli(config, *bound)  # the bound itself is in range
    assert taken.returncode == 0, (bound, taken.stderr)


# -- submit --------------------------------------------------------------------------------


def test_a_payload_nested_past_the_stack_gets_the_nesting_message(config: Path) -> None:
    deep = config.parent / "deep.json"
    # 900 levels parse, and the store refuses them; 100,000 went past Python's stack.
    for text in ("[" * 900 + "]" * 900, "[" * 100_000 + "]" * 100_000, "[" * 100_000):
        deep.write_text(text)
        stderr = refused(config, "submit", "demo.echo", "--payload-file", str(deep), code=65)
        assert last_line(stderr).endswith("JSON values may nest at most 512 levels")


def test_a_wait_past_100_years_is_refused_before_the_submit(config: Path) -> None:
    """The wait's deadline is checked while the arguments are parsed: no task is left
    behind by a submit whose wait then failed."""
    stderr = refused(config, "submit", "demo.echo", "--wait", "--timeout", "36501d")
    assert last_line(stderr).endswith("argument --timeout: must be at most 36500d, got 36501d")


def test_conflict_without_a_key_is_refused(config: Path) -> None:
    stderr = refused(config, "submit", "demo.echo", "--conflict", "replace")
    assert last_line(stderr) == (
        "cairnqd: submit: --conflict needs --key (it says what to do when the key is taken)"
    )
    first = cli(config, "submit", "demo.echo", "--key", "k1", "--conflict", "replace")
    assert first.returncode == 0, first.stderr
    again = cli(config, "submit", "demo.echo", "--key", "k1", "--conflict", "reject")
    assert again.returncode == 1 and "already exists" in again.stderr


def test_a_zero_timeout_waits_no_longer(config: Path) -> None:
    began = time.monotonic()
    result = cli(config, "submit", "demo.echo", "--wait", "--timeout", "0s")
    assert result.returncode == 75, result.stderr
    assert "did not finish within 0ms" in result.stderr
    assert time.monotonic() - began < 20  # not the 30 s of no --timeout
