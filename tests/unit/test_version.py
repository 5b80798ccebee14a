"""One version number: pyproject.toml's, the package's (`vgpuctl
--version`, the daemon's ping, the manual page) and CHANGELOG.md's newest
release are the same."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

import vgpuctl

REPO = Path(vgpuctl.__file__).resolve().parent.parent


def released(changelog: str) -> list[tuple[str, str]]:
    """The changelog's releases, newest first: (version, date)."""
    return re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d\d-\d\d)$", changelog, re.M)


def test_one_version_everywhere():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    changelog = (REPO / "CHANGELOG.md").read_text()
    newest = released(changelog)[0][0]
    assert project["version"] == vgpuctl.__version__ == newest


def test_the_changelog_reads_newest_first():
    """[Unreleased] on top, then each release below the one after it, its
    version and its date both lower."""
    changelog = (REPO / "CHANGELOG.md").read_text()
    heads = re.findall(r"^## \[([^\]]+)\]", changelog, re.M)
    assert heads[0] == "Unreleased"
    rel = released(changelog)
    assert len(rel) == len(heads) - 1, "a release heading not as '## [X.Y.Z] - YYYY-MM-DD'"
    keys = [tuple(int(x) for x in v.split(".")) for v, _ in rel]
    assert keys == sorted(keys, reverse=True) and len(set(keys)) == len(keys)
    dates = [d for _, d in rel]
    assert dates == sorted(dates, reverse=True)
