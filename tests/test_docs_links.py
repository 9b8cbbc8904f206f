"""Every relative link in the front-door documents resolves: README.md, CONTRIBUTING.md,
CHANGELOG.md and docs/*.md link (Markdown links and images, ``src``/``href`` of inline HTML) only
to files and directories that exist, and a ``#fragment`` into a Markdown file names one of its
headings.

Headings become anchors as GitHub makes them: lower case; every character that is not a letter, a
mark, a number, a connector (``_``), a space or a hyphen removed; spaces turned into hyphens; a
repeated anchor gets ``-1``, ``-2``, ... Links inside code spans and fenced code blocks are not
links and are skipped, as are absolute URLs (``http:``, ``mailto:``, ...).
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted(
    [
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        ROOT / "CHANGELOG.md",
        *(ROOT / "docs").glob("*.md"),
    ]
)

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HTML_LINK = re.compile(r"""\b(?:src|href)=["']([^"']+)["']""")  # <img src=...>, <a href=...>
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _prose_lines(text: str):
    """(line number, line without its code spans) outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text (inline links reduced to their text, markup dropped)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LMN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose_lines(path.read_text()):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def broken_links(path: Path) -> list[str]:
    """Each relative link of ``path`` that does not resolve, as ``file:line: target (why)``."""
    problems = []
    for number, line in _prose_lines(path.read_text()):
        prose = _CODE_SPAN.sub("", line)
        for match in [*_LINK.finditer(prose), *_HTML_LINK.finditer(prose)]:
            target = match.group(1)
            if _SCHEME.match(target):
                continue
            file_part, _, fragment = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            where = f"{shown}:{number}: {target}"
            if not resolved.exists():
                problems.append(f"{where} (no such file)")
            elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
                problems.append(f"{where} (no heading with that anchor in {resolved.name})")
    return problems


def test_the_anchor_of_a_heading_is_githubs():
    assert slug("State, restarts and the fence") == "state-restarts-and-the-fence"
    assert slug("What is durable where (`dpstream up`)") == "what-is-durable-where-dpstream-up"
    assert (
        slug("Uploading a file fast (`dpstream produce --csv/--jsonl/--parquet`)")
        == "uploading-a-file-fast-dpstream-produce---csv--jsonl--parquet"
    )
    assert slug("The durable embedded log's cost") == "the-durable-embedded-logs-cost"
    assert slug("9.6 The shipped split: V(h)·√h") == "96-the-shipped-split-vhh"  # symbols go
    assert slug("Up to 10⁷ users") == "up-to-10⁷-users"  # superscript digits are numbers: kept


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "there.md").write_text("# A heading\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md#a-heading) [second](there.md#twice-1) [self](#local)\n"
        "## Local\n"
        "[gone](missing.md) [bad anchor](there.md#nowhere) `[code](missing.md)`\n"
        "```\n[fenced](missing.md)\n```\n"
        "[web](https://example.org/x.md) ![image](there.md)\n"
        '<a href="there.md#twice"><img src="gone.png" width="9"></a>\n'
    )
    assert broken_links(page) == [
        f"{page}:3: missing.md (no such file)",
        f"{page}:3: there.md#nowhere (no heading with that anchor in there.md)",
        f"{page}:8: gone.png (no such file)",
    ]


def test_the_documents_checked_include_the_front_door_and_the_index():
    names = {str(p.relative_to(ROOT)) for p in DOCUMENTS}
    assert {"README.md", "CONTRIBUTING.md", "CHANGELOG.md", "docs/README.md"} <= names


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    problems = broken_links(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_docs_page_is_reachable_from_the_index():
    """A newcomer reaches each page in two clicks: README -> docs/README.md -> the page."""
    index = (ROOT / "docs" / "README.md").read_text()
    linked = {Path(m.group(1).partition("#")[0]).name for m in _LINK.finditer(index)}
    pages = [p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"]
    missing = [name for name in pages if name not in linked]
    assert not missing, f"docs pages not linked from docs/README.md: {missing}"
    assert "docs/README.md" in (ROOT / "README.md").read_text()
