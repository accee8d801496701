"""Kinds: how one setting is read from a YAML node and written back.

A kind raises `Invalid` for a bad value; the checker reports it at the node and
stores `INVALID` instead, so checks that depend on the value can skip it."""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Sequence
from datetime import timedelta
from types import MappingProxyType
from typing import Any

from cairnqd.config.bounds import MAX_BUCKET_S, MAX_DURATION
from cairnqd.config.checks import Checks
from cairnqd.config.dsn import dsn_problem
from cairnqd.config.handler_path import parse_handler_path
from cairnqd.config.sections import ListenAddress
from cairnqd.config.units import (
    format_duration,
    format_size,
    parse_duration,
    parse_duration_ms,
    parse_size,
    to_ms,
)
from cairnqd.config.yamlload import (
    ScalarValue,
    YamlMapping,
    YamlNode,
    YamlPath,
    YamlScalar,
    YamlSequence,
)


class _InvalidType:
    def __repr__(self) -> str:
        return "<invalid>"


#: Stands in for a value that failed its check, so dependent checks can skip it.
INVALID: Any = _InvalidType()


class Invalid(Exception):
    def __init__(self, message: str, node: YamlNode | None = None, suffix: YamlPath = ()):
        super().__init__(message)
        self.message = message
        self.node = node
        self.suffix = suffix


def show_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def show_node(node: YamlNode) -> str:
    if isinstance(node, YamlMapping):
        return "a mapping"
    if isinstance(node, YamlSequence):
        return "a list"
    return show_value(node.value)


def suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class Kind:
    expected = "a value"
    #: A bound kept out of `expected` (the words of the type errors), for the reference.
    bound = ""

    @property
    def reference(self) -> str:
        """The type column of docs/configuration.md: `expected`, and `bound` if any."""
        return f"{self.expected}, {self.bound}" if self.bound else self.expected

    def check(self, ck: Checks, node: YamlNode, path: YamlPath) -> Any:
        raise NotImplementedError

    def dump(self, value: Any) -> Any:
        return value

    def fail(self, got: str, hint: str = "") -> Invalid:
        return Invalid(f"expected {self.expected}, got {got}{hint}")


class _Scalar(Kind):
    def check(self, ck: Checks, node: YamlNode, path: YamlPath) -> Any:
        if not isinstance(node, YamlScalar):
            raise self.fail(show_node(node))
        return self.convert(node.value)

    def convert(self, value: ScalarValue) -> Any:
        raise NotImplementedError


class StrKind(_Scalar):
    expected = "a string"

    def __init__(
        self,
        pattern: str | None = None,
        what: str = "",
        *,
        max_chars: int | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self.pattern = re.compile(pattern) if pattern else None
        self.what = what
        #: For a name the task store keeps (a queue, a task name): past these, or with
        #: what the store cannot hold (NUL, a lone surrogate), every submit, claim or
        #: pause that uses it would fail instead.
        self.max_chars, self.max_bytes = max_chars, max_bytes
        bounds = []
        if max_chars is not None:
            bounds.append(f"1 to {max_chars} characters")
        if max_bytes is not None:
            bounds.append(f"at most {max_bytes} bytes in UTF-8")
        self.bound = " and ".join(bounds)

    def convert(self, value: ScalarValue) -> Any:
        if not isinstance(value, str):
            hint = f' (quote it: "{show_value(value)}")' if value is not None else ""
            raise self.fail(show_value(value), hint)
        if not value.strip():
            raise Invalid("must not be empty")
        self.check_stored(value)  # first: the pattern's message quotes the whole value
        if self.pattern is not None and not self.pattern.fullmatch(value):
            raise Invalid(f"expected {self.what}, got {value!r}")
        return value

    def check_stored(self, value: str) -> None:
        """The store's limits on its text (cairnqd/store/arguments.py, `check_text`)."""
        if self.max_chars is not None and len(value) > self.max_chars:
            raise Invalid(f"must be 1 to {self.max_chars} characters, got {len(value)}")
        if self.max_bytes is None:
            return
        if "\x00" in value:
            raise Invalid("must not contain a NUL character (\\x00)")
        try:
            size = len(value.encode())
        except UnicodeEncodeError:
            raise Invalid(
                "contains a lone UTF-16 surrogate, which is not valid Unicode text"
            ) from None
        if size > self.max_bytes:
            raise Invalid(f"must be at most {self.max_bytes} bytes in UTF-8, got {size}")


class ParsedStrKind(StrKind):
    """A string that a parser must accept (`parse`); the parser's ValueError is the
    error the user sees."""

    def parse(self, text: str) -> None:
        raise NotImplementedError

    def convert(self, value: ScalarValue) -> Any:
        text = super().convert(value)
        try:
            self.parse(text)
        except ValueError as exc:
            raise Invalid(str(exc)) from None
        return text


class HandlerPathKind(ParsedStrKind):
    def parse(self, text: str) -> None:
        parse_handler_path(text)


class PathKind(StrKind):
    """A file or directory path. A relative one is taken from the config file's
    directory, so the file means the same thing whatever directory a command runs in
    (`cairnqd -c ../app/cairnq.yaml stats` reads the app's database, not a new one
    beside the shell); the loaded config holds it absolute."""

    expected = "a file path"

    def check(self, ck: Checks, node: YamlNode, path: YamlPath) -> Any:
        return ck.resolve_path(super().check(ck, node, path))


def _integers(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an integer from {minimum} to {maximum}"
    if minimum is not None:
        return f"an integer ≥ {minimum}"
    return "an integer" if maximum is None else f"an integer ≤ {maximum}"


class IntKind(_Scalar):
    """An integer from `minimum` to `maximum`, both in `expected`. `ceiling` is an upper
    bound kept out of it: a value past the ceiling is told the whole range, while a
    value of another type or below the minimum keeps the shorter words ("an integer
    ≥ 1") that scripts and tests match."""

    def __init__(
        self, minimum: int | None = None, maximum: int | None = None, *, ceiling: int | None = None
    ) -> None:
        assert maximum is None or ceiling is None, "one upper bound"
        self.minimum, self.maximum, self.ceiling = minimum, maximum, ceiling
        self.expected = _integers(minimum, maximum)

    @property
    def reference(self) -> str:
        return _integers(self.minimum, self.ceiling) if self.ceiling is not None else self.expected

    def convert(self, value: ScalarValue) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            hint = ""
            if isinstance(value, str) and re.fullmatch(r"0[0-9]+", value):
                hint = f" (a leading zero reads as octal in YAML 1.1; write {int(value)})"
            raise self.fail(show_value(value), hint)
        if (self.minimum is not None and value < self.minimum) or (
            self.maximum is not None and value > self.maximum
        ):
            raise self.fail(str(value))
        if self.ceiling is not None and value > self.ceiling:
            raise Invalid(f"expected {self.reference}, got {value}")
        return value


class VersionKind(_Scalar):
    expected = "1"

    def convert(self, value: ScalarValue) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value != 1:
            raise self.fail(show_value(value), " (this cairnqd reads config version 1)")
        return value


YAML11_BOOLS = {"yes", "no", "on", "off", "y", "n"}


class BoolKind(_Scalar):
    expected = "true or false"

    def convert(self, value: ScalarValue) -> Any:
        if not isinstance(value, bool):
            hint = ""
            if isinstance(value, str) and value.lower() in YAML11_BOOLS:
                hint = " (YAML 1.2 reads yes/no/on/off as strings)"
            raise self.fail(show_value(value), hint)
        return value


class EnumKind(_Scalar):
    def __init__(self, *choices: str, fold: bool = False) -> None:
        self.choices = choices
        self.fold = fold
        self.expected = "one of " + ", ".join(c.lower() if fold else c for c in choices)

    def convert(self, value: ScalarValue) -> Any:
        key = value.upper() if self.fold and isinstance(value, str) else value
        if isinstance(key, str) and key in self.choices:
            return key
        word = str(value).lower() if self.fold else str(value)
        raise self.fail(show_value(value), suggest(word, [c.lower() for c in self.choices]))

    def dump(self, value: Any) -> Any:
        return value.lower() if self.fold else value


class DurationKind(_Scalar):
    """A duration from `minimum` to `maximum`: by default the longest the task store
    takes, which the reference states once for all durations (bounds.MAX_DURATION)."""

    expected = "a duration like 30s, 5m, 1h"

    def __init__(self, minimum: str = "0s", maximum: timedelta = MAX_DURATION) -> None:
        self.minimum = parse_duration(minimum)
        self.maximum = maximum
        if maximum != MAX_DURATION:
            self.bound = f"at most {format_duration(maximum)}"

    def convert(self, value: ScalarValue) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise self.fail(show_value(value), f": add a unit, e.g. {value}s")
        if not isinstance(value, str):
            raise self.fail(show_value(value))
        try:
            ms = parse_duration_ms(value)
        except ValueError:
            hint = ""
            if re.fullmatch(r"\d+:\d+(:\d+)?", value):
                hint = " (YAML 1.1 reads 1:30 as 90 seconds; write 1m30s)"
            raise self.fail(show_value(value), hint) from None
        # Compared in milliseconds: past 999999999 days no timedelta can even hold it.
        if ms > to_ms(self.maximum):
            raise Invalid(f"must be at most {format_duration(self.maximum)}, got {value}")
        duration = timedelta(milliseconds=ms)
        if duration < self.minimum:
            raise Invalid(f"must be at least {format_duration(self.minimum)}, got {value}")
        return duration

    def dump(self, value: Any) -> Any:
        return format_duration(value)


class SizeKind(_Scalar):
    expected = "a size like 512MiB, 1GiB, 500MB"

    def __init__(self, minimum: str = "1MiB", maximum: int | None = None) -> None:
        self.minimum = parse_size(minimum)
        self.maximum = maximum
        if maximum is not None:
            self.bound = f"at most {format_size(maximum)}"

    def convert(self, value: ScalarValue) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            raise self.fail(show_value(value), ": add a unit, e.g. 512MiB")
        if not isinstance(value, str):
            raise self.fail(show_value(value))
        try:
            size = parse_size(value)
        except ValueError:
            raise self.fail(show_value(value)) from None
        if size < self.minimum:
            raise Invalid(f"must be at least {format_size(self.minimum)}, got {value}")
        if self.maximum is not None and size > self.maximum:
            raise Invalid(f"must be at most {format_size(self.maximum)}, got {value}")
        return size

    def dump(self, value: Any) -> Any:
        return format_size(value)


_HOSTNAME = re.compile(
    r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
)


class ListenKind(_Scalar):
    expected = "host:port (e.g. 127.0.0.1:9464) or off"

    def convert(self, value: ScalarValue) -> Any:
        if value == "off":
            return None
        if not isinstance(value, str):
            raise self.fail(show_value(value))
        host, sep, port = value.rpartition(":")
        bracketed = host.startswith("[") and host.endswith("]")
        host = host[1:-1] if bracketed else host
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise self.fail(show_value(value))
        if bracketed or ":" in host:
            if not bracketed or not _is_ipv6(host):
                raise self.fail(show_value(value), " (write an IPv6 address as [::1]:9464)")
        elif not _HOSTNAME.fullmatch(host):
            raise self.fail(show_value(value))
        return ListenAddress(host, int(port))

    def dump(self, value: Any) -> Any:
        return "off" if value is None else str(value)


def _is_ipv6(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False


class DsnKind(StrKind):
    def convert(self, value: ScalarValue) -> Any:
        if not isinstance(value, str):  # do not echo: it may be a secret
            raise Invalid("expected a string")
        text = super().convert(value)
        problem = dsn_problem(text)
        if problem:
            raise Invalid(problem)
        return text


class ListKind(Kind):
    def __init__(self, item: _Scalar, *, non_empty: bool = False) -> None:
        self.item = item
        self.non_empty = non_empty
        self.expected = f"a list of {item.expected.removeprefix('a ').removeprefix('an ')}s"
        if item.bound:
            self.bound = f"each {item.bound}"

    def check(self, ck: Checks, node: YamlNode, path: YamlPath) -> Any:
        if not isinstance(node, YamlSequence):
            raise self.fail(show_node(node))
        if self.non_empty and not node.items:
            raise Invalid("must list at least one entry")
        values = [ck.value(self.item, item, (*path, i)) for i, item in enumerate(node.items)]
        for i, value in enumerate(values):
            if value is not INVALID and value in values[:i]:
                raise Invalid(f"{show_value(value)} is listed twice", node.items[i], (i,))
        return INVALID if INVALID in values else tuple(values)

    def dump(self, value: Any) -> Any:
        return [self.item.dump(v) for v in value]


class BucketsKind(ListKind):
    def __init__(self) -> None:
        super().__init__(_Number(MAX_BUCKET_S))
        self.expected = "an increasing list of numbers > 0"

    def check(self, ck: Checks, node: YamlNode, path: YamlPath) -> Any:
        values = super().check(ck, node, path)
        if values is not INVALID and list(values) != sorted(set(values)):
            raise Invalid("bucket bounds must increase")
        return values


class _Number(_Scalar):
    expected = "a number > 0"

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.bound = f"at most {maximum}"

    def convert(self, value: ScalarValue) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise self.fail(show_value(value))
        # Before float(): .inf is a number > 0 too, and an integer past a float's range
        # would raise OverflowError out of the check.
        if not value <= self.maximum:
            raise Invalid(f"must be at most {self.maximum}, got {show_value(value)}")
        return float(value)


class PrefetchKind(_Scalar):
    expected = "auto or an integer ≥ 0"

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling

    @property
    def reference(self) -> str:
        return f"auto or {_integers(0, self.ceiling)}"

    def convert(self, value: ScalarValue) -> Any:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(show_value(value))
        if value > self.ceiling:
            raise Invalid(f"expected {self.reference}, got {value}")
        return value


class MapKind(Kind):
    def __init__(self, key: StrKind, value: _Scalar) -> None:
        self.key, self.value = key, value
        self.expected = "a mapping"

    def check(self, ck: Checks, node: YamlNode, path: YamlPath) -> Any:
        if not isinstance(node, YamlMapping):
            raise self.fail(show_node(node))
        result: dict[str, Any] = {}
        for name, entry in node.entries.items():
            try:
                self.key.convert(name)
            except Invalid as exc:
                ck.error(entry.key_position, (*path, name), exc.message)
                result[name] = INVALID
                continue
            result[name] = ck.value(self.value, entry.node, (*path, name))
        return INVALID if INVALID in result.values() else MappingProxyType(result)

    def dump(self, value: Any) -> Any:
        return {k: self.value.dump(v) for k, v in value.items()}
