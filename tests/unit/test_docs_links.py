"""Every relative link in the READMEs and docs/ leads to a file that exists, and to a heading in it.

The docs are a map: a page moved or a heading renamed must not leave a link pointing nowhere.
Anchors follow GitHub's rule (lowercase, punctuation dropped, spaces to hyphens, -1, -2, ... for
repeated headings).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKING = [*PAGES, ROOT / "engine-image" / "README.md"]  # the pages whose links are checked

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def prose(markdown: str) -> str:
    """The text outside fenced blocks and code spans, where links are links."""
    return CODE_SPAN.sub("", FENCE.sub("", markdown))


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def relative_links(page: Path) -> list[str]:
    found = LINK.findall(prose(page.read_text()))
    return [t for t in found if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_readme_and_the_docs_pages_exist() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/architecture.md", "docs/api.md", "docs/benchmarks.md"} <= names


def test_the_readme_links_every_docs_page() -> None:
    linked = {(ROOT / t.split("#")[0]).resolve() for t in relative_links(ROOT / "README.md")}
    assert [p for p in PAGES[1:] if p.resolve() not in linked] == []


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(f"{target}: no heading #{anchor} in {path or page.name}")
    return broken


@pytest.mark.parametrize("page", LINKING, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Server: admission defaults, drain, shutdown", "server-admission-defaults-drain-shutdown"),
        ("Router (`engine-image/kvscale_router/`)", "router-engine-imagekvscale_router"),
        ("The demo: `make demo`", "the-demo-make-demo"),
        ("Dependencies, and why each is there", "dependencies-and-why-each-is-there"),
    ],
)
def test_anchor_slugs_follow_githubs_rule(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_a_repeated_heading_gets_a_numbered_anchor() -> None:
    assert anchors("# Setup\n\n## Setup\n\n```\n# not a heading\n```\n") == {"setup", "setup-1"}


def test_a_missing_file_or_heading_is_reported(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text(
        "# A\n\n[ok](b.md#b) [here](#a) [gone](c.md) [nowhere](b.md#nowhere) `[code](d.md)`\n"
        "[web](https://example.com/x.md)\n"
    )
    (tmp_path / "b.md").write_text("# B\n")
    assert broken_links(tmp_path / "a.md") == [
        "c.md: no file c.md",
        "b.md#nowhere: no heading #nowhere in b.md",
    ]
