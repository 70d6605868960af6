"""The docs name no release but the package's own: a new user read "before 0.3" and "moved in 0.2" in docs of a
package at 0.1.0 whose CHANGELOG has only [Unreleased]."""

from __future__ import annotations

import re
from pathlib import Path

import fl_lightning

ROOT = Path(__file__).resolve().parent.parent
#: A phrase that dates something by one of our releases ("before 0.3", "moved in 0.2", "since v0.1.0").
DATED = re.compile(
    r"\b(?:before|since|after|until|as of|version|release|(?:moved|added|removed|deprecated|changed) in)\s+v?(\d+\.\d+(?:\.\d+)?)\b",
    re.IGNORECASE,
)


def test_the_docs_and_the_code_date_changes_by_the_packages_version_only():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "fl_lightning").rglob("*.py"))]
    dated = [
        f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for match in DATED.finditer(line)
        if match.group(1) != fl_lightning.__version__
    ]
    assert dated == [], f"write 'under [Unreleased] in CHANGELOG.md' or {fl_lightning.__version__}, not another release"


def test_the_pattern_finds_the_phrases_the_user_found():
    assert [m.group(1) for m in DATED.finditer("Before 0.3 the alias ...; the modules moved in 0.2, with")] == ["0.3", "0.2"]
    assert not DATED.search("dp-accounting 0.6.0; within 0.7 points; about 0.2 s")
