"""The documentation's links lead somewhere: every relative link in README.md and docs/ names a
file that exists and, where it names a heading, a heading that file has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from facebench.host.paths import PROJECT_ROOT

DOCS = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
# [text](target) outside code; targets with a scheme (http:, mailto:) are not checked.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def relative_links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_every_relative_link_resolves(doc):
    broken = []
    for target in relative_links(doc):
        file_part, _, fragment = target.partition("#")
        linked = (doc.parent / file_part).resolve() if file_part else doc
        if not linked.exists():
            broken.append(f"{target}: no such file {linked}")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}: no heading #{fragment} in {linked.name}")
    assert not broken, f"{doc.name}: " + "; ".join(broken)


def test_the_link_check_finds_a_broken_link(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\nSee [b](b.md), [top](#top), [gone](#nowhere).\n")
    assert relative_links(tmp_path / "a.md") == ["b.md", "#top", "#nowhere"]
    assert anchors(tmp_path / "a.md") == {"top"}
    assert anchor("The real data: CelebA + DigiFace1M") == "the-real-data-celeba--digiface1m"


def test_the_readme_opens_with_a_quick_start_and_ci_runs_its_test_command():
    """A newcomer's first screen: the install, the first run and the fast tests; the whole README
    within a few pages (details live in docs/); and CI runs the test command the README gives."""
    readme = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(readme) <= 250, f"README.md has {len(readme)} lines: move details into docs/"
    first = "\n".join(readme[:40])
    for command in ('pip install -e ".[', "python train.py", 'python -m pytest -m "not slow"'):
        assert command in first, f"{command!r} is not in README.md's first 40 lines"
    ci = (PROJECT_ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    [everything] = [
        line for line in readme if line.startswith("python -m pytest ") and "CI" in line
    ]
    command = everything.split("#")[0].strip()
    assert command in [line.strip() for line in ci], f"{command!r} is not a line of .ci/run"
