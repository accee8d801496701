"""The YAML loader: positions, duplicate keys, YAML 1.2 typing, tags, interpolation."""

from __future__ import annotations

import math
import textwrap
import time
from pathlib import Path

import pytest

from cairnqd.config.yamlload import (
    MAX_ALIAS_NODES,
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    Position,
    YamlDocument,
    YamlMapping,
    YamlSyntaxError,
    format_path,
    interpolate,
    load_yaml,
    parse_yaml,
    resolve_plain,
    to_plain,
)


def parse(text: str) -> YamlDocument:
    return parse_yaml(textwrap.dedent(text), "c.yaml")


def problems(doc: YamlDocument) -> list[str]:
    return [f"{p.position}: {format_path(p.path)}: {p.message}" for p in doc.problems]


def test_yaml_1_1_surprises_stay_strings() -> None:
    doc = parse(
        """\
        words: [yes, no, on, off, y, n, Yes]
        octal: 0750
        sexagesimal: 1:30
        date: 2024-01-01
        hex: 0x1F
        """
    )
    assert doc.value == {
        "words": ["yes", "no", "on", "off", "y", "n", "Yes"],
        "octal": "0750",
        "sexagesimal": "1:30",
        "date": "2024-01-01",
        "hex": "0x1F",
    }
    assert doc.problems == ()


def test_core_schema_types() -> None:
    doc = parse(
        """\
        ints: [0, 7, -3, +4]
        floats: [1.5, .5, 1e3, -2.5E-1]
        bools: [true, True, FALSE]
        nulls: [null, ~, Null]
        empty:
        quoted: ["true", '4', "null"]
        tagged: !!str 12
        """
    )
    value = doc.value
    assert value["ints"] == [0, 7, -3, 4]
    assert value["floats"] == [1.5, 0.5, 1000.0, -0.25]
    assert value["bools"] == [True, True, False]
    assert value["nulls"] == [None, None, None]
    assert value["empty"] is None
    assert value["quoted"] == ["true", "4", "null"]
    assert value["tagged"] == "12"
    assert math.isinf(parse("x: -.inf\n").value["x"])
    assert resolve_plain("42") == 42
    assert resolve_plain("042") == "042"


def test_positions_are_one_based_and_point_at_values() -> None:
    doc = parse(
        """\
        groups:
          mail:
            queues: [mail, bulk]
            lease: soon
        """
    )
    assert doc.position(("groups", "mail", "lease")) == Position("c.yaml", 4, 12)
    assert doc.position(("groups", "mail", "queues", 1)) == Position("c.yaml", 3, 20)
    # A mapping or list is found at its key; a missing key at its nearest parent.
    assert doc.position(("groups", "mail")) == Position("c.yaml", 2, 3)
    assert doc.position(("groups", "mail", "nope")) == Position("c.yaml", 2, 3)
    assert doc.position(("groups", "mail", "queues", 9)) == Position("c.yaml", 3, 5)
    assert doc.node(("groups", "mail", "queues", 0)) is not None
    assert doc.node(("groups", "x")) is None


def test_duplicate_keys_are_reported_at_the_second_with_the_first_line() -> None:
    doc = parse(
        """\
        a: 1
        b:
          x: 1
          y: 2
          x: 3
        a: 2
        """
    )
    assert problems(doc) == [
        "c.yaml:5:3: b.x: duplicate key 'x' (first at line 3, column 3)",
        "c.yaml:6:1: a: duplicate key 'a' (first at line 1, column 1)",
    ]
    # The first value stands, so it can still be checked.
    assert doc.value == {"a": 1, "b": {"x": 1, "y": 2}}
    assert not any(p.value_lost for p in doc.problems)


def test_merge_keys_explicit_wins_and_is_no_duplicate() -> None:
    doc = parse(
        """\
        base: &base {lease: 30s, processes: 2}
        more: &more {processes: 5, concurrency: 8}
        mail:
          <<: [*base, *more]
          lease: 1m
        """
    )
    assert doc.problems == ()
    # An explicit key beats a merged one; of merged mappings, the first wins.
    assert doc.value["mail"] == {"lease": "1m", "processes": 2, "concurrency": 8}
    # Only as a key does << merge.
    assert parse("a: <<\n").value == {"a": "<<"}


def test_merge_of_a_scalar_is_a_problem() -> None:
    doc = parse("a:\n  <<: 3\n")
    assert problems(doc) == ["c.yaml:2:7: a: << needs a mapping or a list of mappings"]


def test_tags_outside_the_core_schema_are_refused() -> None:
    doc = parse(
        """\
        a: !!python/object/apply:os.system ["echo hi"]
        b: !!binary aGVsbG8=
        c: !custom x
        d: !!int nope
        """
    )
    assert problems(doc) == [
        "c.yaml:1:4: a: unsupported tag !!python/object/apply:os.system",
        "c.yaml:2:4: b: unsupported tag !!binary: only str, int, float, bool and null are allowed",
        "c.yaml:3:4: c: unsupported tag !custom: only str, int, float, bool and null are allowed",
        "c.yaml:4:4: d: invalid literal for int() with base 10: 'nope'",
    ]
    assert doc.value["b"] is None


def test_recursive_alias_is_a_problem_not_a_hang() -> None:
    doc = parse("a: &x [1, *x]\n")
    assert problems(doc) == ["c.yaml:1:4: a[1]: recursive alias: a node cannot contain itself"]


def test_aliases_are_shared_not_copied() -> None:
    doc = parse("a: &x {k: [1, 2]}\nb: *x\nc: *x\n")
    root = doc.root
    assert isinstance(root, YamlMapping)
    assert root.entries["b"].node is root.entries["c"].node
    assert to_plain(root) == {"a": {"k": [1, 2]}, "b": {"k": [1, 2]}, "c": {"k": [1, 2]}}


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("a: [1,\nb: 2\n", "c.yaml:3:1", "while parsing a flow sequence: expected ',' or ']'"),
        ("a: 1\n---\nb: 2\n", "c.yaml:2:1", "expected a single document in the stream"),
        ("a: b: c\n", "c.yaml:1:5", "mapping values are not allowed here"),
        ("a: 1\nb: \x07\n", "c.yaml:2:4", "invalid character '\\x07'"),
        ("a: *nope\n", "c.yaml:1:4", "found undefined alias 'nope'"),
    ],
)
def test_syntax_errors_carry_a_position(text: str, where: str, message: str) -> None:
    with pytest.raises(YamlSyntaxError) as info:
        parse_yaml(text, "c.yaml")
    assert str(info.value.position) == where
    assert info.value.message.startswith(message)


def test_load_yaml_reads_files_and_rejects_bad_utf8(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_bytes(b"\xef\xbb\xbfname: caf\xc3\xa9\n")  # a BOM is fine
    assert load_yaml(good).value == {"name": "café"}
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"a: 1\nb: \xff\n")
    with pytest.raises(YamlSyntaxError) as info:
        load_yaml(bad)
    assert info.value.position == Position(str(bad), 2, 4)
    with pytest.raises(FileNotFoundError):
        load_yaml(tmp_path / "missing.yaml")


def test_empty_document_is_null() -> None:
    doc = parse_yaml("# only a comment\n", "c.yaml")
    assert doc.value is None
    assert doc.root.position == Position("c.yaml", 1, 1)


def test_format_path() -> None:
    assert format_path(("groups", "mail", "queues", 0)) == "groups.mail.queues[0]"
    assert format_path((0, "a")) == "[0].a"
    assert format_path(()) == ""


# --- interpolation -----------------------------------------------------------------


def interpolated(text: str, env: dict[str, str]) -> tuple[object, list[str]]:
    doc = parse(text)
    root, found = interpolate(doc.root, env)
    return to_plain(root), [f"{p.position}: {format_path(p.path)}: {p.message}" for p in found]


@pytest.mark.parametrize(
    ("written", "env", "expected"),
    [
        ("${A}", {"A": "x"}, "x"),
        ("${A}", {"A": ""}, ""),
        ("${A:-d}", {}, "d"),
        ("${A:-d}", {"A": ""}, "d"),
        ("${A:-d}", {"A": "x"}, "x"),
        ("${A-d}", {}, "d"),
        ("${A-d}", {"A": ""}, ""),
        ("${A:?boom}", {"A": "x"}, "x"),
        ("${A?boom}", {"A": ""}, ""),
        ("${A:-${B:-deep}}", {}, "deep"),
        ("${A:-${B}}", {"B": "b"}, "b"),
        ("pa$$word", {}, "pa$word"),
        ("cost: 5$", {}, "cost: 5$"),
        ("a$-b", {}, "a$-b"),
        ("${A}/${B}", {"A": "x", "B": "y"}, "x/y"),
    ],
)
def test_interpolation_forms(written: str, env: dict[str, str], expected: str) -> None:
    value, found = interpolated(f"k: '{written}'\n", env)
    assert found == []
    assert value == {"k": expected}


def test_unset_variable_is_an_error_naming_it_and_its_column() -> None:
    value, found = interpolated('dsn: "postgresql://u:${PGPASS}@h/db"\nx: ${N}\n', {})
    assert found == [
        "c.yaml:1:22: dsn: environment variable PGPASS is not set "
        "(${PGPASS:-default} gives a fallback)",
        "c.yaml:2:4: x: environment variable N is not set (${N:-default} gives a fallback)",
    ]
    assert value == {"dsn": "postgresql://u:@h/db", "x": None}


def test_required_forms_fail_with_their_message() -> None:
    _, found = interpolated("a: ${A:?set A to the DSN}\nb: ${B:?}\nc: ${C?}\n", {"B": ""})
    assert found == [
        "c.yaml:1:4: a: A: set A to the DSN",
        "c.yaml:2:4: b: B is not set or empty",
        "c.yaml:3:4: c: C is not set",
    ]


def test_malformed_interpolations() -> None:
    _, found = interpolated("a: x $HOME y\nb: ${1A}\nc: ${A:+x}\nd: '${A'\n", {"HOME": "/h"})
    assert [f.split(": ", 2)[:2] for f in found] == [
        ["c.yaml:1:6", "a"],
        ["c.yaml:2:4", "b"],
        ["c.yaml:3:4", "c"],
        ["c.yaml:4:5", "d"],
    ]
    assert "write ${HOME} for the variable, or $$ for a literal $" in found[0]
    assert "invalid interpolation ${1A}" in found[1]
    assert "invalid interpolation ${A:+x}" in found[2]
    assert "unterminated '${A'" in found[3]


def test_unquoted_scalars_are_retyped_quoted_stay_strings() -> None:
    value, found = interpolated("n: ${N:-4}\nq: '${N:-4}'\nb: ${B}\nz: ${Z:-}\n", {"B": "true"})
    assert found == []
    assert value == {"n": 4, "q": "4", "b": True, "z": None}


def test_keys_are_not_interpolated_and_structure_cannot_be_injected() -> None:
    value, found = interpolated("${K}: 1\nv: ${V}\n", {"K": "x", "V": "a: [1, 2]"})
    assert found == []
    assert value == {"${K}": 1, "v": "a: [1, 2]"}


def test_interpolation_walks_lists_and_mappings() -> None:
    value, found = interpolated("a: [x, '${A}']\nb: {c: '${A}'}\n", {"A": "y"})
    assert found == []
    assert value == {"a": ["x", "y"], "b": {"c": "y"}}


def laughs(levels: int) -> str:
    """A 'billion laughs' document: each level aliases the one above nine times."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for n in range(1, levels):
        refs = ", ".join([f"*a{n - 1}"] * 9)
        lines.append(f"a{n}: &a{n} [{refs}]")
    return "\n".join(lines) + "\n"


@pytest.mark.timing
def test_an_alias_bomb_is_refused_at_the_alias_that_crosses_the_limit() -> None:
    started = time.monotonic()
    with pytest.raises(YamlSyntaxError) as info:
        parse_yaml(laughs(9), "bomb.yaml")  # 9**9 nodes once expanded
    assert time.monotonic() - started < 2
    # a4 is the first level whose expansion crosses 10000 nodes: its first alias.
    assert str(info.value.position) == "bomb.yaml:5:10"
    assert f"aliases expand to more than {MAX_ALIAS_NODES} nodes" in info.value.message


def test_aliases_below_the_limit_still_work() -> None:
    doc = parse_yaml(laughs(3), "ok.yaml")  # 91 + 820 nodes through aliases
    assert to_plain(doc.root)["a2"][8][8] == ["lol"] * 9
    defaults = "defaults: &d {queues: [q], processes: 2, lease: 30s}\ngroups:\n" + "".join(
        f"  g{i}: {{<<: *d, concurrency: {i + 1}}}\n" for i in range(200)
    )
    groups = to_plain(parse_yaml(defaults, "c.yaml").root)["groups"]
    assert groups["g199"] == {"queues": ["q"], "processes": 2, "lease": "30s", "concurrency": 200}


def test_deep_nesting_is_refused_with_a_position() -> None:
    text = "x: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "\n"
    with pytest.raises(YamlSyntaxError) as info:
        parse_yaml(text, "deep.yaml")
    assert info.value.position == Position("deep.yaml", 1, 3 + MAX_DEPTH)
    assert f"nested deeper than {MAX_DEPTH} levels" in info.value.message


def test_a_file_over_one_mib_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    line = "# " + "x" * 1021 + "\n"  # 1 KiB per line
    path.write_text("version: 1\n" + line * 1100)
    with pytest.raises(YamlSyntaxError) as info:
        load_yaml(path)
    assert "larger than 1 MiB" in info.value.message
    position = info.value.position
    assert position.file == str(path) and position.line == 1 + (1 << 20) // 1024
    with pytest.raises(YamlSyntaxError, match="larger than 1 MiB"):
        parse_yaml("x" * (MAX_DOCUMENT_BYTES + 1), "big.yaml")
