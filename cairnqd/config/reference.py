"""`render_reference()`: the text of docs/configuration.md, one table row per setting,
rendered from the schema like the example file, so the reference cannot fall behind."""

from __future__ import annotations

from cairnqd.config.bounds import MAX_DURATION
from cairnqd.config.example import TAGS, flow_node
from cairnqd.config.schema import REQUIRED, SCHEMA, GroupsKind, RulesKind, SectionKind, Setting
from cairnqd.config.units import format_duration

_INTRO = """\
# Configuration reference

`cairnqd -c FILE` reads one YAML file. This page lists every setting: its type, its
default, what a reload (SIGHUP) does when it changes, and what it means. It is
generated from the schema in `cairnqd/config/schema.py`; after changing the schema run

    python -m cairnqd.config --reference > docs/configuration.md

(a test fails while this page and the schema disagree). An annotated example with every
default is [config/cairnq.example.yaml](../config/cairnq.example.yaml);
`cairnqd -c FILE check` validates a file and prints each mistake with its
file:line:column.

## Reading the tables

- **Durations** are written `250ms`, `30s`, `5m`, `1h`, `7d` or combined (`1h30m`); a bare
  number is an error, so `timeout: 30` never silently means milliseconds. No duration may
  exceed `{max_duration}` (100 years, the longest the task store takes); a row says so where a
  setting's bound is lower.
- **Sizes** are written `512MiB`, `1GiB` or `500MB`.
- **Strings** may use `${VAR}`, `${VAR:-default}`, `${VAR-default}` or `${VAR:?message}` from
  the environment; `$$` is a literal `$`.
- **Relative paths** are resolved against the directory of the config file.
- **Reload** says what SIGHUP (`cairnqd reload`) does with a changed value: *hot* applies
  in place; *resize* grows or shrinks the group; *roll* replaces the group's children one at
  a time (at most `reload.max_surge` extra); *restart* is refused until the daemon restarts,
  and the old value stays in force.
- `groups.*` stands for any group name, `rules[]` for any rule of the list.
"""


def _default(setting: Setting) -> str:
    if setting.default is REQUIRED:
        return "required"
    if setting.default is None:
        return "null"
    return f"`{flow_node(setting.default)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row(setting: Setting) -> str:
    reload = TAGS[setting.reload] if setting.reload is not None else ""
    kind = setting.kind.reference
    if setting.rule:
        kind += f", {setting.rule}"
    if setting.nullable:
        kind += ", or null"
    cells = [f"`{setting.path}`", kind, _default(setting), reload, setting.doc]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _is_section(setting: Setting) -> bool:
    return isinstance(setting.kind, SectionKind) and not isinstance(
        setting.kind, GroupsKind | RulesKind
    )


def render_reference() -> str:
    """The text of docs/configuration.md."""
    intro = _INTRO.replace("{max_duration}", format_duration(MAX_DURATION))
    lines = [intro.rstrip("\n"), "", "## Top-level settings", ""]
    header = ["| setting | type | default | reload | meaning |", "|---|---|---|---|---|"]
    top = [s for s in SCHEMA if "." not in s.path and not _is_section(s)]
    lines += header + [_row(s) for s in top]
    for section in (s for s in SCHEMA if "." not in s.path and _is_section(s)):
        lines += ["", f"## {section.path}", "", section.doc, ""]
        members = [s for s in SCHEMA if s.path.startswith(section.path + ".")]
        lines += header + [_row(s) for s in members]
    for nested in (s for s in SCHEMA if "." not in s.path and isinstance(s.kind, GroupsKind)):
        lines += ["", f"## {nested.path}", "", nested.doc, ""]
        members = [s for s in SCHEMA if s.path.startswith(nested.path + ".")]
        lines += header + [_row(s) for s in members]
    return "\n".join(lines) + "\n"
