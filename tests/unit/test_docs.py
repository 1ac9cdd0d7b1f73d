"""The documentation stays true: docs/operators.md is what the converter registry
generates, every relative link in README.md and docs/ leads to a file, and the README
stays short and starts with the two commands a fresh machine runs (.ci/run runs the
second)."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.tools.op_table import REGENERATE, render_operator_table
from tests.support import REPO

DOCS = sorted((REPO / "docs").glob("*.md"))
# [text](target) and ![alt](target); the target ends at whitespace or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def test_operator_table_is_current():
    written = (REPO / "docs" / "operators.md").read_text()
    assert written == render_operator_table(), (
        f"docs/operators.md is stale: the converter registry changed; run `{REGENERATE}`")


def _relative_links(page: Path) -> list[tuple[str, str]]:
    """(file, #fragment or "") of each link of a Markdown page that names a file of this
    checkout (no URL, no in-page anchor); code blocks are not read."""
    text = FENCE.sub("", page.read_text())
    targets = (m.group(1) for m in LINK.finditer(text))
    return [tuple(t.partition("#")[::2]) for t in targets
            if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown page: lower case, spaces to
    hyphens, punctuation other than hyphens and underscores dropped."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_relative_links_point_to_files():
    pages = [REPO / "README.md", *DOCS]
    assert len(DOCS) > 1, "docs/ holds the documentation beyond the README"
    broken = []
    for page in pages:
        for target, fragment in _relative_links(page):
            path = page.parent / target
            if not path.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} does not exist")
            elif fragment and path.suffix == ".md" and fragment not in _anchors(path):
                broken.append(f"{page.relative_to(REPO)}: {target} has no heading #{fragment}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"
    commands = [line.strip() for line in lines[:6] if line.startswith("    ")]
    assert commands == ['pip install -e . && doit build target=llvm',
                        'pip install -e ".[test,ort,openvino,cluster,report]" '
                        '&& python -m pytest -q']
