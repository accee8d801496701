"""Read YAML config files without losing where each value came from.

The reasoning: docs/architecture.md, "Config design notes".
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = [
    "Position",
    "ScalarValue",
    "YamlDocument",
    "YamlEntry",
    "YamlMapping",
    "YamlNode",
    "YamlPath",
    "YamlProblem",
    "YamlScalar",
    "YamlSequence",
    "YamlSyntaxError",
    "format_path",
    "interpolate",
    "load_yaml",
    "locate",
    "parse_yaml",
    "resolve_plain",
    "to_plain",
]

ScalarValue = str | int | float | bool | None
YamlPath = tuple[str | int, ...]

#: A config file larger than this is refused unread.
MAX_DOCUMENT_BYTES = 1 << 20
#: Nodes that aliases may expand to, over the whole document.
MAX_ALIAS_NODES = 10_000
#: Mappings and lists nested deeper than this are refused.
MAX_DEPTH = 64


@dataclass(frozen=True, order=True)
class Position:
    """A 1-based line and column in a named file; line 0 means "the whole file"."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        if self.line == 0:
            return self.file
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True)
class YamlProblem:
    position: Position
    path: YamlPath
    message: str
    #: The value at `path` is unusable (already reported), as opposed to a duplicate
    #: key, where the first value stands and can still be checked.
    value_lost: bool = True


class YamlSyntaxError(Exception):
    """The parser stopped: nothing after `position` was read."""

    def __init__(self, position: Position, message: str) -> None:
        self.position = position
        self.message = message
        super().__init__(f"{position}: {message}")


@dataclass(frozen=True)
class YamlScalar:
    value: ScalarValue
    position: Position
    #: Written without quotes or an explicit tag, so the value was typed from its
    #: text, and is typed again after interpolation (`processes: ${N:-4}` is an int).
    plain: bool = False
    #: The scalar exactly as written (quotes included), to place errors inside it.
    source: str = ""

    def position_at(self, offset: int) -> Position:
        """Position of `source[offset]`, for an error in the middle of a scalar."""
        before = self.source[:offset]
        newlines = before.count("\n")
        if newlines == 0:
            return replace(self.position, col=self.position.col + offset)
        return replace(
            self.position,
            line=self.position.line + newlines,
            col=offset - before.rfind("\n"),
        )


@dataclass(frozen=True)
class YamlEntry:
    key_position: Position
    node: YamlNode


@dataclass(frozen=True)
class YamlMapping:
    entries: Mapping[str, YamlEntry]
    position: Position


@dataclass(frozen=True)
class YamlSequence:
    items: tuple[YamlNode, ...]
    position: Position


YamlNode = YamlScalar | YamlMapping | YamlSequence


def format_path(path: YamlPath) -> str:
    """`("groups", "mail", "queues", 0)` -> `groups.mail.queues[0]`."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


@dataclass(frozen=True)
class YamlDocument:
    root: YamlNode
    problems: tuple[YamlProblem, ...] = ()

    @property
    def value(self) -> Any:
        return to_plain(self.root)

    def node(self, path: Sequence[str | int]) -> YamlNode | None:
        node: YamlNode | None = self.root
        for part in path:
            node = _child(node, part)
        return node

    def position(self, path: Sequence[str | int]) -> Position:
        return locate(self.root, path)


def locate(root: YamlNode, path: Sequence[str | int]) -> Position:
    """Where `path` is written: a scalar's own position; for a mapping or list, the
    position of its key (the line an operator looks for); for a missing key, its
    nearest parent's."""
    node, position = root, root.position
    for part in path:
        if isinstance(node, YamlMapping) and isinstance(part, str) and part in node.entries:
            entry = node.entries[part]
            node, position = entry.node, entry.key_position
        elif isinstance(node, YamlSequence) and isinstance(part, int) and part < len(node.items):
            node = node.items[part]
            position = node.position
        else:
            break
    return node.position if isinstance(node, YamlScalar) else position


def _child(node: YamlNode | None, part: str | int) -> YamlNode | None:
    if isinstance(node, YamlMapping) and isinstance(part, str):
        entry = node.entries.get(part)
        return None if entry is None else entry.node
    if isinstance(node, YamlSequence) and isinstance(part, int):
        return node.items[part] if 0 <= part < len(node.items) else None
    return None


def to_plain(node: YamlNode) -> Any:
    """The tree as plain Python values: dict, list, str, int, float, bool, None."""
    if isinstance(node, YamlScalar):
        return node.value
    if isinstance(node, YamlSequence):
        return [to_plain(item) for item in node.items]
    return {key: to_plain(entry.node) for key, entry in node.entries.items()}


# --- typing plain scalars: the YAML 1.2 core schema, minus octal and hex ---------

_TAG = "tag:yaml.org,2002:"
_CORE_RESOLVERS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    (_TAG + "null", re.compile(r"^(?:~|null|Null|NULL|)$"), "~nN"),
    (_TAG + "bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), "tTfF"),
    # No leading zeros: YAML 1.1 reads 0750 as octal, so it stays a string and the
    # schema can say so instead of guessing.
    (_TAG + "int", re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), "-+0123456789"),
    (
        _TAG + "float",
        re.compile(
            r"^(?:[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*|[0-9]+(?=[eE]))(?:[eE][-+]?[0-9]+)?"
            r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
        ),
        "-+0123456789.",
    ),
    (_TAG + "merge", re.compile(r"^<<$"), "<"),
)


class _CoreLoader(yaml.SafeLoader):
    """SafeLoader whose implicit typing is the core table above, nothing more, and
    whose composer refuses deep nesting and aliases that expand too far."""

    yaml_implicit_resolvers: dict[Any, list[tuple[str, re.Pattern[str]]]] = {}

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._alias_nodes = 0
        self._depth = 0
        self._sizes: dict[int, int] = {}

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]  # untyped upstream
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)
            if node is not None:
                self._alias_nodes += _expanded_size(node, self._sizes, set())
            if self._alias_nodes > MAX_ALIAS_NODES:
                raise _refusal(
                    f"aliases expand to more than {MAX_ALIAS_NODES} nodes (a billion-laughs "
                    "file?); write the values out or use fewer aliases",
                    event.start_mark,
                )
            return node
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _refusal(f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _refusal(message: str, mark: Any) -> yaml.MarkedYAMLError:
    return yaml.composer.ComposerError(None, None, message, mark)


def _expanded_size(node: Node, sizes: dict[int, int], active: set[int]) -> int:
    """Nodes in `node`'s tree as a reader walking it sees them, aliases expanded
    (memoized by identity: each anchor is counted once, then charged per use)."""
    key = id(node)
    known = sizes.get(key)
    if known is not None:
        return known
    if key in active:  # a recursive alias, reported later by the converter
        return 1
    active.add(key)
    size = 1
    if isinstance(node, SequenceNode):
        size += sum(_expanded_size(item, sizes, active) for item in node.value)
    elif isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            size += _expanded_size(key_node, sizes, active)
            size += _expanded_size(value_node, sizes, active)
    active.discard(key)
    sizes[key] = size
    return size


for _tag, _pattern, _first in _CORE_RESOLVERS:
    # The empty string resolves to null, and PyYAML files it under the key "".
    _CoreLoader.add_implicit_resolver(_tag, _pattern, [*_first, ""] if "~" in _first else _first)


def _core_tag(text: str) -> str:
    for tag, pattern, _ in _CORE_RESOLVERS:
        if pattern.match(text):
            return tag
    return _TAG + "str"


def _show_tag(tag: str) -> str:
    return "!!" + tag.removeprefix(_TAG) if tag.startswith(_TAG) else tag


def _scalar_from_tag(tag: str, text: str) -> ScalarValue:
    """Build a core-schema value; ValueError when the text does not fit the tag."""
    kind = tag.removeprefix(_TAG) if tag.startswith(_TAG) else tag
    if kind == "str":
        return text
    if kind == "null":
        return None
    if kind == "bool":
        if text.lower() not in ("true", "false"):
            raise ValueError(f"cannot read {text!r} as a boolean")
        return text.lower() == "true"
    if kind == "int":
        return int(text, 10)
    if kind == "float":
        special = {".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf, ".nan": math.nan}
        return special[text.lower()] if text.lower() in special else float(text)
    raise ValueError(
        f"unsupported tag {_show_tag(tag)}: only str, int, float, bool and null are allowed"
    )


def resolve_plain(text: str) -> ScalarValue:
    """Type an unquoted scalar's text the way the loader does."""
    tag = _core_tag(text)
    return text if tag == _TAG + "merge" else _scalar_from_tag(tag, text)


# --- composing and converting -----------------------------------------------------


def _position(filename: str, mark: yaml.Mark | None) -> Position:
    if mark is None:
        return Position(filename, 0, 0)
    return Position(filename, mark.line + 1, mark.column + 1)


def _syntax_error(filename: str, text: str, exc: yaml.YAMLError) -> YamlSyntaxError:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        message = ": ".join(part for part in (exc.context, exc.problem) if part)
        return YamlSyntaxError(_position(filename, mark), message or "invalid YAML")
    if isinstance(exc, yaml.reader.ReaderError):
        before = text[: exc.position]
        line = before.count("\n") + 1
        col = exc.position - before.rfind("\n")
        return YamlSyntaxError(
            Position(filename, line, col), f"invalid character {chr(exc.character)!r}"
        )
    return YamlSyntaxError(Position(filename, 0, 0), str(exc))


class _Converter:
    """Turns a composed PyYAML graph into our tree, collecting soft problems.

    Aliases point at the same composed node, so conversions are memoized by node
    identity: an anchor used a thousand times is converted once, and its problems
    reported once."""

    def __init__(self, filename: str, text: str) -> None:
        self.filename = filename
        self.text = text
        self.problems: list[YamlProblem] = []
        self._done: dict[int, YamlNode] = {}
        self._active: set[int] = set()

    def problem(self, node: Node, path: YamlPath, message: str) -> None:
        self.problems.append(YamlProblem(self.pos(node), path, message))

    def pos(self, node: Node) -> Position:
        return _position(self.filename, node.start_mark)

    def convert(self, node: Node, path: YamlPath) -> YamlNode:
        key = id(node)
        if key in self._done:
            return self._done[key]
        if key in self._active:
            self.problem(node, path, "recursive alias: a node cannot contain itself")
            return YamlScalar(None, self.pos(node))
        self._active.add(key)
        try:
            result = self._convert(node, path)
        finally:
            self._active.discard(key)
        self._done[key] = result
        return result

    def _convert(self, node: Node, path: YamlPath) -> YamlNode:
        if isinstance(node, ScalarNode):
            return self._scalar(node, path)
        if isinstance(node, SequenceNode):
            self._check_tag(node, path, "seq")
            items = tuple(self.convert(item, (*path, i)) for i, item in enumerate(node.value))
            return YamlSequence(items, self.pos(node))
        assert isinstance(node, MappingNode)
        self._check_tag(node, path, "map")
        return YamlMapping(self._entries(node, path), self.pos(node))

    def _check_tag(self, node: Node, path: YamlPath, expected: str) -> None:
        if node.tag != _TAG + expected:
            self.problem(node, path, f"unsupported tag {_show_tag(node.tag)}")

    def _scalar(self, node: ScalarNode, path: YamlPath) -> YamlScalar:
        source = self.text[node.start_mark.index : node.end_mark.index]
        plain = node.style is None and node.tag == _core_tag(node.value)
        # `<<` only means "merge" as a key; as a value it is just text.
        tag = _TAG + "str" if node.tag == _TAG + "merge" else node.tag
        try:
            value = _scalar_from_tag(tag, node.value)
        except ValueError as exc:
            self.problem(node, path, str(exc))
            value = None
        return YamlScalar(value, self.pos(node), plain, source)

    def _entries(self, node: MappingNode, path: YamlPath) -> dict[str, YamlEntry]:
        explicit: dict[str, YamlEntry] = {}
        merged: dict[str, YamlEntry] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, ScalarNode) and key_node.tag == _TAG + "merge":
                self._merge(value_node, path, merged)
                continue
            if not isinstance(key_node, ScalarNode):
                self.problem(key_node, path, "a mapping key must be a plain string")
                continue
            key = key_node.value
            first = explicit.get(key)
            if first is not None:
                seen = first.key_position
                message = f"duplicate key {key!r} (first at line {seen.line}, column {seen.col})"
                self.problems.append(
                    YamlProblem(self.pos(key_node), (*path, key), message, value_lost=False)
                )
                continue
            explicit[key] = YamlEntry(self.pos(key_node), self.convert(value_node, (*path, key)))
        # A key written out overrides a merged one (YAML merge-key spec).
        return {**merged, **explicit}

    def _merge(self, value: Node, path: YamlPath, merged: dict[str, YamlEntry]) -> None:
        sources = value.value if isinstance(value, SequenceNode) else [value]
        for source in sources:
            converted = self.convert(source, path)
            if not isinstance(converted, YamlMapping):
                self.problem(source, path, "<< needs a mapping or a list of mappings")
                continue
            for key, entry in converted.entries.items():
                # Of several merged mappings, the first to name a key wins.
                merged.setdefault(key, entry)


def parse_yaml(text: str, filename: str) -> YamlDocument:
    """Parse one YAML document held in `text`; `filename` only labels positions."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise _too_large(filename, text[:MAX_DOCUMENT_BYTES])
    try:
        loader = _CoreLoader(text)  # the reader rejects control characters right here
        try:
            composed = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise _syntax_error(filename, text, exc) from None
    if composed is None:  # an empty file, or only comments
        return YamlDocument(YamlScalar(None, Position(filename, 1, 1)))
    converter = _Converter(filename, text)
    root = converter.convert(composed, ())
    return YamlDocument(root, tuple(converter.problems))


def load_yaml(path: str | os.PathLike[str]) -> YamlDocument:
    """Read and parse a file. OSError propagates; bad UTF-8 is a syntax error."""
    filename = os.fspath(path)
    with open(filename, "rb") as f:
        raw = f.read(MAX_DOCUMENT_BYTES + 1)
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise _too_large(filename, raw[:MAX_DOCUMENT_BYTES].decode(errors="replace"))
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        col = exc.start - raw.rfind(b"\n", 0, exc.start)
        raise YamlSyntaxError(Position(filename, line, col), "the file is not UTF-8") from None
    return parse_yaml(text, filename)


def _too_large(filename: str, head: str) -> YamlSyntaxError:
    """Refuse a file at the point where it crosses the size limit."""
    line = head.count("\n") + 1
    col = len(head) - head.rfind("\n")
    limit = f"{MAX_DOCUMENT_BYTES >> 20} MiB"
    return YamlSyntaxError(
        Position(filename, line, col), f"the file is larger than {limit}; no config needs that"
    )


# --- interpolation ----------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = (":-", ":?", "-", "?")
_FORMS = "${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?message} or ${NAME?message}"


class _Substitution:
    """Compose-spec interpolation over one string.

    `${VAR}` must be set (an empty DSN is worse than a failed check), `${VAR:-d}`
    falls back when unset or empty, `${VAR-d}` only when unset, `${VAR:?msg}` and
    `${VAR?msg}` fail with `msg`, and `$$` is a literal `$`. A `$` before a name
    without braces is an error rather than Compose's implicit `$VAR`: it is far more
    often a password character, and the fix (`$$` or `${VAR}`) is one keystroke.
    Any other `$` is kept as written. Defaults may nest (`${A:-${B}}`) and are
    expanded only when used."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        #: (the offending text as written, message)
        self.errors: list[tuple[str, str]] = []

    def expand(self, text: str) -> str:
        out: list[str] = []
        i = 0
        while (dollar := text.find("$", i)) >= 0:
            out.append(text[i:dollar])
            i = self._one(text, dollar, out)
        out.append(text[i:])
        return "".join(out)

    def _one(self, text: str, at: int, out: list[str]) -> int:
        """Expand the `$` at `at` into `out`; return where scanning resumes."""
        nxt = text[at + 1 : at + 2]
        if nxt == "$":
            out.append("$")
            return at + 2
        if nxt != "{":
            name = _NAME.match(text, at + 1)
            if name is None:
                out.append("$")
                return at + 1
            hint = f"write ${{{name.group()}}} for the variable, or $$ for a literal $"
            self.errors.append((text[at : name.end()], hint))
            return name.end()
        end = _closing_brace(text, at + 2)
        if end < 0:
            self.errors.append((text[at:], f"unterminated {text[at:]!r}: expected {_FORMS}"))
            return len(text)
        out.append(self._braced(text[at : end + 1]))
        return end + 1

    def _braced(self, token: str) -> str:
        body = token[2:-1]
        name = _NAME.match(body)
        rest = body[name.end() :] if name else body
        operator = next((op for op in _OPERATORS if rest.startswith(op)), None)
        if name is None or (rest and operator is None):
            self.errors.append((token, f"invalid interpolation {token}: expected {_FORMS}"))
            return ""
        var = name.group()
        value = self.env.get(var)
        if operator is None:
            if value is None:
                hint = f"${{{var}:-default}} gives a fallback"
                self.errors.append((token, f"environment variable {var} is not set ({hint})"))
            return value or ""
        unset = value is None or (operator.startswith(":") and value == "")
        if not unset:
            return value or ""
        word = self.expand(rest[len(operator) :])
        if operator.endswith("?"):
            why = "is not set" if operator == "?" else "is not set or empty"
            self.errors.append((token, f"{var}: {word}" if word else f"{var} {why}"))
            return ""
        return word


def _closing_brace(text: str, start: int) -> int:
    """Index of the `}` closing a `${` whose body starts at `start`, nesting allowed."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{" and text[i - 1] == "$":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def interpolate(
    node: YamlNode, env: Mapping[str, str], path: YamlPath = ()
) -> tuple[YamlNode, list[YamlProblem]]:
    """Substitute `${...}` in every string scalar value (never in keys)."""
    problems: list[YamlProblem] = []
    return _interpolate(node, env, path, problems), problems


def _interpolate(
    node: YamlNode, env: Mapping[str, str], path: YamlPath, problems: list[YamlProblem]
) -> YamlNode:
    if isinstance(node, YamlSequence):
        items = tuple(
            _interpolate(item, env, (*path, i), problems) for i, item in enumerate(node.items)
        )
        return replace(node, items=items)
    if isinstance(node, YamlMapping):
        entries = {
            key: replace(entry, node=_interpolate(entry.node, env, (*path, key), problems))
            for key, entry in node.entries.items()
        }
        return replace(node, entries=entries)
    if not isinstance(node.value, str) or "$" not in node.value:
        return node
    substitution = _Substitution(env)
    text = substitution.expand(node.value)
    for token, message in substitution.errors:
        problems.append(YamlProblem(_locate(node, token), path, message))
    value = resolve_plain(text) if node.plain else text
    return replace(node, value=value)


def _locate(node: YamlScalar, token: str) -> Position:
    """Point at the token in the source. Quotes, escapes and folding shift offsets in
    the value, so search the source; if the token is not there verbatim, fall back to
    the scalar's start."""
    found = node.source.find(token)
    return node.position_at(found) if found >= 0 else node.position
