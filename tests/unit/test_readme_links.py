"""README.md is the front door: every relative link in it resolves, anchors included, and it stays short.

MkDocs checks the links of the pages under docs/ (tests/process/test_docs_site.py builds the site with
--strict), but README.md is not a page of the site, so nothing else would notice a link into docs/ that a
renamed page or heading broke. Anchors are checked against GitHub's heading slugs, since GitHub is where
the README is read.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The front door holds what the issue lists and links to the rest; past this it is a manual again.
MAX_README_LINES = 350

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def _outside_code(text: str) -> str:
    """The text without fenced code blocks and inline code spans, where brackets are not links."""
    lines, fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            lines.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(lines)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"`", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, numbered as GitHub numbers repeated headings."""
    seen: dict[str, int] = {}
    found = set()
    fence = False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        if fence or not re.match(r"#{1,6} ", line):
            continue
        slug = github_slug(line.lstrip("#"))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def relative_links(text: str) -> list[str]:
    """The targets of the links and images that point inside the repository."""
    body = _outside_code(text)
    targets = _LINK.findall(body) + _IMAGE.findall(body)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_slug_rule_matches_githubs_for_the_headings_used_here():
    assert github_slug("What to expect at 8, 64, 512 and 4096 GPUs") == "what-to-expect-at-8-64-512-and-4096-gpus"
    assert github_slug("7. The controller's loop") == "7-the-controllers-loop"
    assert github_slug("Tuning (`minitrain.tune`, Ray Tune's surface)") == "tuning-minitraintune-ray-tunes-surface"


def test_every_relative_link_in_the_readme_resolves():
    links = relative_links(README.read_text())
    assert len(links) >= 10, "the README links into docs/; the link pattern found too few"
    broken = []
    for link in links:
        target, _, anchor = link.partition("#")
        path = (README.parent / target).resolve() if target else README
        if not path.exists():
            broken.append(f"{link}: no file {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{link}: {path.name} has no heading with the anchor #{anchor}")
    assert not broken, "README.md has broken links:\n" + "\n".join(broken)


def test_the_readme_links_every_top_level_docs_page():
    linked = {(README.parent / link.partition("#")[0]).resolve() for link in relative_links(README.read_text())}
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), f"docs pages the README does not link: {sorted(p.name for p in pages - linked)}"


def test_the_readme_stays_a_front_door():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines (at most {MAX_README_LINES}): move the detail into a page under docs/")
