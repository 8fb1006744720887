"""The product face stays a reference: README and docs describe what the code does now, and every
measurement lives in a dated record under docs/results/ that says how it was taken.

Fails when README.md grows past 10 KB, when history (a commit hash, an issue number, a citation of
a design outside the repository) leaks into a reference or the source, when a record lacks its
command, commit or hardware line or is missing from the index, or when a relative link points at
nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
RECORD_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}-[a-z0-9][a-z0-9.-]*\.md$")
RECORD_KEYS = ("Date", "Command", "Config", "Commit", "Hardware", "What else ran")

# a hex token of 7-40 characters with a digit and a letter in it (a number or a word is not a hash)
COMMIT_LIKE = re.compile(
    r"(?<![0-9A-Za-z_./#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![0-9A-Za-z_-])"
)
HISTORY = re.compile(r"(?i:\bissues? #?\d+|\bfloor \d\b)|\bDESIGN\.md\b")
FIRST_PERSON = re.compile(r"\b(I|I'm|I've|my|we|we've|our)\b(?!/)")
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def references() -> list[Path]:
    """README, the docs outside results/ and the shipped configs."""
    docs = sorted((ROOT / "docs").glob("*.md"))
    return [ROOT / "README.md", *docs, *sorted((ROOT / "configs").glob("**/*.yaml"))]


def source_files() -> list[Path]:
    packages = ("selective_rollout", "alfworld_env", "launch", "bench")
    files = [p for pkg in packages for p in sorted((ROOT / pkg).rglob("*.py"))]
    files += [*sorted((ROOT / "docker").glob("Dockerfile*")), ROOT / "Makefile"]
    return files


def records() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*.md") if p.name != "README.md")


def _hits(paths: list[Path], pattern: re.Pattern[str]) -> list[str]:
    return [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()[:120]}"
        for p in paths
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if pattern.search(line)
    ]


def test_readme_is_at_most_10_kb():
    size = (ROOT / "README.md").stat().st_size
    assert size <= 10 * 1024, f"README.md is {size} bytes: measurements belong in docs/results/, linked once"


@pytest.mark.parametrize("pattern", [COMMIT_LIKE, HISTORY], ids=["commit-hash", "issue-or-design-citation"])
def test_references_and_source_carry_no_history(pattern):
    hits = _hits(references() + source_files(), pattern)
    assert not hits, "history in a reference (it belongs in a docs/results/ record):\n" + "\n".join(hits)


def test_references_and_source_are_not_written_in_the_first_person():
    hits = _hits([p for p in references() if p.suffix == ".md"] + source_files(), FIRST_PERSON)
    assert not hits, "first person in a reference:\n" + "\n".join(hits)


def test_every_record_is_dated_says_how_it_was_measured_and_is_indexed():
    found = records()
    assert found, "docs/results/ holds no record"
    index = (RESULTS / "README.md").read_text()
    for path in found:
        assert RECORD_NAME.match(path.name), f"{path.name}: records are named YYYY-MM-DD-<topic>.md"
        text = path.read_text()
        missing = [k for k in RECORD_KEYS if not re.search(rf"^- \*\*{re.escape(k)}:\*\* \S", text, re.M)]
        assert not missing, f"{path.name} lacks the header line(s) {missing}"
        date = re.search(r"^- \*\*Date:\*\* (\S+)", text, re.M).group(1)
        assert path.name.startswith(date), f"{path.name}: its Date line says {date}"
        assert f"({path.name})" in index, f"docs/results/README.md does not list {path.name}"


def test_the_results_index_lists_records_newest_first():
    index = (RESULTS / "README.md").read_text()
    listed = re.findall(r"\]\((\d{4}-\d{2}-\d{2}-[^)]+\.md)\)", index)
    assert listed == sorted(listed, key=lambda name: name[:10], reverse=True)


def test_relative_links_in_readme_and_docs_point_at_something():
    broken = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in MARKDOWN_LINK.findall(path.read_text()):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            resolved = (path.parent / target.split("#", 1)[0]).resolve()
            if not resolved.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)
