"""The README is the front door and docs/ holds the rest: every relative link and `#anchor` in them resolves, the
README stays short, and its list of GPU instance types is the catalog's.

Anchors follow GitHub's heading slugs as the github-slugger package reproduces them (Flet/github-slugger,
index.js `slugger` and `BananaSlug.prototype.slug`): lowercase, trim, drop every character that is not a letter,
digit, space, hyphen or underscore, each whitespace character becomes a hyphen, and a repeated slug gets `-1`,
`-2`, ...
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 250

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`]*`")


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (markdown links reduced to their text first)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return re.sub(r"\s", "-", text)


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub gives the headings of `path`, duplicates numbered as it numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in `path` that is not to another site."""
    links = []
    for number, line in prose_lines(path):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
                links.append((number, target))
    return links


def test_slug_follows_github():
    assert slug("A: RayCluster + `ray job submit`") == "a-raycluster--ray-job-submit"
    assert slug("Before you rent: `python -m workloads.plan`") == "before-you-rent-python--m-workloadsplan"
    assert slug("Node.js") == "nodejs"


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path):
    broken = []
    for number, target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{path.relative_to(REPO)}:{number}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{path.relative_to(REPO)}:{number}: {target}: no heading with anchor #{anchor}")
    assert not broken, "\n".join(broken)


def test_a_missing_anchor_is_reported(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Same\n\n## Same\n\n```\n## not a heading\n```\n[x](#same-1) [y](#not-a-heading)\n")
    assert anchors(page) == {"title", "same", "same-1"}
    assert relative_links(page) == [(10, "#same-1"), (10, "#not-a-heading")]


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, over {README_MAX_LINES}: move detail to docs/"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for _, t in relative_links(README)}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_readme_lists_every_gpu_instance_type_of_the_catalog():
    catalog = yaml.safe_load((REPO / "config" / "instances.yaml").read_text())["instances"]
    gpu_types = {name for name, spec in catalog.items() if spec["gpus"] > 0}
    section = README.read_text().split("### Change the instance type", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"\b([a-z][a-z0-9]*\.[0-9]*x?large)\b", section))
    assert listed == gpu_types, f"missing: {sorted(gpu_types - listed)}; not GPU types: {sorted(listed - gpu_types)}"
