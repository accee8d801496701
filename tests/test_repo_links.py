"""The repository stands alone: every link and citation in it resolves inside it.

(a) Every relative markdown link (and image) in every `*.md` file points at a file or
    folder that exists, and a `#fragment` into a markdown file names one of its headings
    (GitHub's slugs) or an explicit `<a id=…>` anchor.
(b) No tracked file mentions the team's private briefing documents (the names are built
    below rather than written out, so this file does not trip its own check).
(c) Every citation `docs/<file>.md`, optionally followed by `§N`, `§N-M` or `#anchor`
    items, in `*.py`, `*.yaml`, `*.md` and `*.service` files names an existing file, an
    existing numbered section heading of it and an existing anchor in it.
"""

from __future__ import annotations

import os
import re
import subprocess
import urllib.parse
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Folders never searched when git cannot list the files (caches, virtualenvs, builds).
_SKIP_DIRS = {"__pycache__", "node_modules", "build", "dist"}

# The private briefing lives outside the repository; nothing here may point at it.
FORBIDDEN = (
    "../" + "shared",
    "SPEC" + ".md",
    "DAEMON" + ".md",
    "STYLE" + ".md",
    "LAYOUT" + ".md",
    "SPEC" + " §",
)
# Files still citing the briefing, each to be fixed by the lead before merge; when they
# are, empty this list (an entry that no longer matches fails the test, so it cannot rot).
KNOWN_REMAINING: frozenset[str] = frozenset()

CITING_SUFFIXES = (".py", ".yaml", ".yml", ".md", ".service")


# -- the files -------------------------------------------------------------------------


@cache
def _git_files(*, tracked_only: bool) -> tuple[str, ...] | None:
    """Paths git knows (tracked, plus untracked but not ignored unless `tracked_only`),
    or None outside a git checkout."""
    args = ["git", "-C", str(REPO), "ls-files", "-z", "--cached"]
    if not tracked_only:
        args += ["--others", "--exclude-standard"]
    try:
        out = subprocess.run(args, capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = (n for n in out.decode("utf-8", "surrogateescape").split("\0") if n)
    return tuple(sorted(n for n in names if (REPO / n).is_file()))


def _walk() -> Iterator[str]:
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith(".") and d not in _SKIP_DIRS and not d.endswith(".egg-info")
        ]
        for name in files:
            yield (Path(root) / name).relative_to(REPO).as_posix()


def repo_files(*suffixes: str) -> list[str]:
    listed = _git_files(tracked_only=False)
    names = listed if listed is not None else tuple(sorted(_walk()))
    return [n for n in names if n.endswith(suffixes)]


# -- markdown: headings, anchors, links --------------------------------------------------

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_ATX = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_SETEXT = re.compile(r"^\s{0,3}(=+|-+)\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+[^>]*?(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
_INLINE_LINK = re.compile(r"\[([^\]]*)\]\(([^)]*)\)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'][^)]*[\"'])?\s*\)")
_REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        opened = _FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)[0]
            continue
        if fence is not None:
            if opened and opened.group(1)[0] == fence:
                fence = None
            continue
        yield number, line


def heading_texts(text: str) -> Iterator[str]:
    previous = ""
    for _, line in prose_lines(text):
        atx = _ATX.match(line)
        if atx:
            yield atx.group(2)
        elif _SETEXT.match(line) and previous.strip() and not _is_block_start(previous):
            yield previous.strip()
        previous = line


def _is_block_start(line: str) -> bool:
    return bool(re.match(r"^\s*([-*+]|\d+[.)]|>|\||#)", line))


def github_slug(heading: str) -> str:
    """The fragment GitHub gives a heading: its rendered text, lower-cased, with
    everything but letters, digits, `_`, `-` and spaces dropped, spaces as hyphens."""
    text = _INLINE_LINK.sub(r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every fragment a link into `path` may use: heading slugs (repeats get -1, -2, …)
    and explicit HTML anchors."""
    text = path.read_text(encoding="utf-8")
    seen: dict[str, int] = {}
    found: set[str] = set()
    for heading in heading_texts(text):
        slug = github_slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    for _, line in prose_lines(text):
        found.update(_HTML_ANCHOR.findall(line))
    return frozenset(found)


@cache
def numbered_sections(path: Path) -> frozenset[str]:
    """Section numbers of headings such as `## 6. Operations` or `### 6.4 Finalizing`."""
    numbers = set()
    for heading in heading_texts(path.read_text(encoding="utf-8")):
        match = re.match(r"(\d+(?:\.\d+)*)\.?(?:\s|$)", heading)
        if match:
            numbers.add(match.group(1))
    return frozenset(numbers)


def markdown_links(text: str) -> Iterator[tuple[int, str]]:
    for number, line in prose_lines(text):
        plain = _CODE_SPAN.sub("", line)
        for match in _LINK.finditer(plain):
            yield number, match.group(1)
        definition = _REFERENCE_DEF.match(plain)
        if definition:
            yield number, definition.group(1)


def link_problem(source: Path, target: str) -> str | None:
    """Why a link target written in `source` does not resolve, or None if it does."""
    if not target or _SCHEME.match(target) or target.startswith("//"):
        return None
    path_part, _, fragment = target.partition("#")
    path_part = urllib.parse.unquote(path_part)
    if path_part.startswith("/"):
        resolved = REPO / path_part.lstrip("/")
    elif path_part:
        resolved = source.parent / path_part
    else:
        resolved = source
    if not resolved.exists():
        return f"{path_part} does not exist"
    if fragment and resolved.is_file() and resolved.suffix == ".md":
        fragment = urllib.parse.unquote(fragment)
        if fragment not in anchors(resolved.resolve()):
            where = "this file" if resolved == source else _shown(resolved)
            return f"no heading or anchor #{fragment} in {where}"
    return None


def _shown(path: Path) -> str:
    path = path.resolve()
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)


# -- (a) links ---------------------------------------------------------------------------


def test_github_slugs_match_githubs_rules() -> None:
    assert github_slug("8. Python API (drop-in for `cairnq` 0.15.1)") == (
        "8-python-api-drop-in-for-cairnq-0151"
    )
    assert github_slug("2.1 `cairnq_tasks`") == "21-cairnq_tasks"
    assert github_slug("The [daemon](x.md) — signals") == "the-daemon--signals"


def test_anchor_check_finds_a_missing_heading(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n## 2. Next step\n\n```\n# not a heading\n```\n", encoding="utf-8")
    assert anchors(page) == {"top", "2-next-step"}
    assert link_problem(page, "#2-next-step") is None
    assert link_problem(page, "#not-a-heading") is not None
    assert link_problem(page, "missing.md") is not None


def test_every_relative_markdown_link_resolves() -> None:
    problems = []
    for name in repo_files(".md"):
        source = REPO / name
        for number, target in markdown_links(source.read_text(encoding="utf-8")):
            problem = link_problem(source, target)
            if problem:
                problems.append(f"{name}:{number}: ({target}) {problem}")
    assert not problems, "broken links:\n" + "\n".join(problems)


# -- (b) no private briefing -------------------------------------------------------------


def test_no_file_cites_the_private_briefing() -> None:
    tracked = _git_files(tracked_only=True)
    if tracked is None:
        pytest.skip("not a git checkout: git ls-files is unavailable")
    offenders: dict[str, list[str]] = {}
    for name in tracked:
        data = (REPO / name).read_bytes()
        hits = [word for word in FORBIDDEN if word.encode() in data]
        if hits:
            offenders[name] = hits
    unexpected = {n: h for n, h in offenders.items() if n not in KNOWN_REMAINING}
    assert not unexpected, f"files citing documents outside the repository: {unexpected}"
    fixed = sorted(KNOWN_REMAINING - offenders.keys())
    assert not fixed, f"fixed already; remove from KNOWN_REMAINING: {fixed}"


# -- (c) docs/<file>.md citations ----------------------------------------------------------

_SECTION = r"§(\d+(?:\.\d+)*)(?:-(\d+(?:\.\d+)*))?(?:\s+step\s+\d+)?"
_ITEM = rf"(?:\s*(?:,|;|and)?\s*(?:{_SECTION}|#[A-Za-z0-9_-]+))"
_CITATION = re.compile(rf"(?<![\w.-])(?:\.\./)*docs/([\w.-]+?)\.md((?:{_ITEM})*)")
_ITEM_PARTS = re.compile(rf"{_SECTION}|#([A-Za-z0-9_-]+)")


def cited(text: str) -> Iterator[tuple[int, str, list[str], list[str]]]:
    """(line, docs file, section numbers, anchors) for every citation in `text`."""
    for match in _CITATION.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        sections: list[str] = []
        fragments: list[str] = []
        for part in _ITEM_PARTS.finditer(match.group(2)):
            first, last, fragment = part.group(1), part.group(2), part.group(3)
            if fragment:
                fragments.append(fragment)
                continue
            sections.append(first)
            if last:
                # "6.4-6.5" and "3-4" name both ends; "6.4-5" shortens the second one.
                short = "." in first and "." not in last
                sections.append(first.rsplit(".", 1)[0] + "." + last if short else last)
        yield line, f"docs/{match.group(1)}.md", sections, fragments


def test_citation_parsing() -> None:
    # Written through `docs` so these made-up citations do not count as this file's own.
    docs = "docs/"
    text = f"see {docs}x.md §6.4-6.5, §8.6 and #cancel-wins,\n#claim-by-name. More"
    assert list(cited(text)) == [
        (1, f"{docs}x.md", ["6.4", "6.5", "8.6"], ["cancel-wins", "claim-by-name"])
    ]
    assert list(cited(f"(../{docs}a.md#x) and {docs}b.md §3-4 step 6, ## 9. Not")) == [
        (1, f"{docs}a.md", [], ["x"]),
        (1, f"{docs}b.md", ["3", "4"], []),
    ]


def test_every_docs_citation_names_a_real_section() -> None:
    problems = []
    for name in repo_files(*CITING_SUFFIXES):
        text = (REPO / name).read_text(encoding="utf-8", errors="replace")
        for line, doc, sections, fragments in cited(text):
            target = REPO / doc
            if not target.is_file():
                problems.append(f"{name}:{line}: {doc} does not exist")
                continue
            for number in sections:
                if number not in numbered_sections(target):
                    problems.append(f"{name}:{line}: {doc} has no section {number}")
            for fragment in fragments:
                if fragment not in anchors(target):
                    problems.append(f"{name}:{line}: {doc} has no anchor #{fragment}")
    assert not problems, "citations that do not resolve:\n" + "\n".join(problems)
