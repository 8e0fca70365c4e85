"""The repo's docs stand on their own: a clone has everything they point to.

No file cites notes that live outside the repo (the project's design brief, its research notes):
the facts the code relies on are in ``docs/`` (``docs/sglang.md``, ``docs/capacity.md``, ...) or
cited from the other side's own public source. Every relative link of the Markdown docs leads to
a file of the repo and, when it names a section, to a heading of that file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("src", "tests", "benchmarks", "scripts", "configs", "docs")
SCANNED_FILES = ("README.md", "pyproject.toml", "setup.py")
NOT_SOURCE = {"__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}

# Spelled in pieces so that this file does not match what it looks for.
_OUTSIDE_NOTES = (
    "DESIGN" + ".md",
    "sglang-api" + ".md",
    "sglang-quality-and-load" + ".md",
    "kimi-k25-capacity" + ".md",
    "export-formats" + ".md",
    "sglang-0.5.23" + ".md",
)
OUTSIDE = re.compile(
    "|".join(
        [re.escape(name) for name in _OUTSIDE_NOTES]
        + [
            r"\bDESIGN\s+invariant",
            r"\breference" + "/" + r"(sglang|kimi|export)",
            r"/work/" + "shared",
        ]
    )
)


def _text_files() -> list[Path]:
    files = [ROOT / name for name in SCANNED_FILES if (ROOT / name).is_file()]
    for folder in SCANNED:
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.is_file())
    return [
        p
        for p in files
        if not NOT_SOURCE & set(p.parts) and not any(s.endswith(".egg-info") for s in p.parts)
    ]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None  # a binary file (parquet, png): nothing to cite in


def test_no_file_cites_notes_outside_the_repo() -> None:
    found = []
    for path in _text_files():
        text = _read(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            match = OUTSIDE.search(line)
            if match:
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)}")
    assert not found, "cites notes a clone does not have (put the fact in docs/):\n" + "\n".join(
        found
    )


def test_the_check_sees_each_way_a_citation_was_written() -> None:
    for line in (
        "(" + _OUTSIDE_NOTES[0] + ", invariant 5)",
        "The guard (DESIGN" + " invariant 2)",
        "``reference" + "/" + _OUTSIDE_NOTES[2] + "`` section 3",
        "(" + _OUTSIDE_NOTES[3] + " §6)",
        "(" + _OUTSIDE_NOTES[1] + " §3.5)",
        "docs/../reference" + "/" + _OUTSIDE_NOTES[4],
    ):
        assert OUTSIDE.search(line), line
    assert not OUTSIDE.search("the reference fit (docs/capacity.md), a reference run")


INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)", re.MULTILINE)
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`\n]*`")


def _markdown_docs() -> list[Path]:
    return [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted(ROOT.glob("docs/*.md"))]


def _prose(text: str) -> str:
    """The text outside fenced code blocks, with inline code spans removed."""
    kept, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return CODE_SPAN.sub("", "\n".join(kept))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case; all but letters, digits, spaces, ``-`` and ``_``
    dropped (markup, punctuation); spaces turned into ``-``."""
    kept = "".join(char for char in heading.strip().lower() if char in " -_" or char.isalnum())
    return kept.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    kept, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    for line in kept:
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = _slug(match.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    """Every relative link of ``doc`` that leads to no file of ``root``, or to no such heading."""
    text = _prose(doc.read_text(encoding="utf-8"))
    targets = [m.group(1) for m in INLINE_LINK.finditer(text)]
    targets += [m.group(1) for m in DEFINITION.finditer(text)]
    broken = []
    for target in targets:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, fragment = target.partition("#")
        file = (doc.parent / path_part).resolve() if path_part else doc
        if not file.is_relative_to(root.resolve()):
            broken.append(f"{target}: outside the repo")
        elif not file.exists():
            broken.append(f"{target}: no such file")
        elif fragment and file.suffix == ".md" and fragment not in _anchors(file):
            broken.append(f"{target}: no heading #{fragment} in {file.name}")
    return broken


@pytest.mark.parametrize("doc", _markdown_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_section_of_the_repo(doc: Path) -> None:
    assert not broken_links(doc), f"{doc.relative_to(ROOT)}:\n" + "\n".join(broken_links(doc))


def test_the_link_check_sees_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## `/server_info`: the body\n")
    doc = tmp_path / "docs" / "this.md"
    doc.write_text(
        "# This\n\n## A section\n\n"
        "[fine](other.md#server_info-the-body), [self](#a-section), [web](https://example.com), "
        "![img](other.md), `[in code](gone.md)`\n\n"
        "[gone](gone.md), [no section](other.md#nothing), [up](../../outside.md)\n\n"
        "```\n[in a fence](gone-too.md)\n```\n\n[ref]: missing.md\n"
    )
    assert broken_links(doc, tmp_path) == [
        "gone.md: no such file",
        "other.md#nothing: no heading #nothing in other.md",
        "../../outside.md: outside the repo",
        "missing.md: no such file",
    ]


def test_slug_matches_github() -> None:
    assert _slug("`bench_report.py`: the run report") == "bench_reportpy-the-run-report"
    assert (
        _slug("The step-cost model (`capacity/speculative.py`)")
        == "the-step-cost-model-capacityspeculativepy"
    )
    assert _slug("Against the issue's targets") == "against-the-issues-targets"
