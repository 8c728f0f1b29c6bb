"""ci/release.py's pure steps: the next version, the CHANGELOG move, argument checks (no build, no index)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from packaging.version import Version

SCRIPT = Path(__file__).resolve().parents[1] / "release.py"
spec = importlib.util.spec_from_file_location("release", SCRIPT)
release = importlib.util.module_from_spec(spec)
spec.loader.exec_module(release)


@pytest.mark.parametrize("part, want", [("major", "1.0.0"), ("minor", "0.2.0"), ("patch", "0.1.1"), ("0.3.0", "0.3.0"),
                                        ("0.1.0", "0.1.0")])
def test_next_version(part, want):
    assert release.next_version(Version("0.1.0"), part, released=[]) == Version(want)


@pytest.mark.parametrize("part, error", [("0.1.0", "not above the current version"), ("0.0.9", "not above"),
                                         ("huge", "one of major, minor, patch")])
def test_next_version_refuses(part, error):
    with pytest.raises(release.ReleaseError, match=error):
        release.next_version(Version("0.1.0"), part, released=[Version("0.1.0")])


def test_unreleased_moves_under_the_version():
    text = "# Changelog\n\n## Unreleased\n\n- one\n- two\n\n## 0.1.0 (2026-01-01)\n- old\n"
    assert release.move_unreleased(text, Version("0.2.0"), "2026-12-03") == (
        "# Changelog\n\n## Unreleased\n\n## 0.2.0 (2026-12-03)\n- one\n- two\n\n## 0.1.0 (2026-01-01)\n- old\n")


def test_empty_or_missing_unreleased_is_an_error():
    with pytest.raises(release.ReleaseError, match="Unreleased section is empty"):
        release.move_unreleased("## Unreleased\n\n## 0.1.0 (2026-01-01)\n- old\n", Version("0.1.1"), "2026-12-03")
    assert "- No changes" in release.move_unreleased("## Unreleased\n", Version("0.1.1"), "d", allow_empty=True)
    with pytest.raises(release.ReleaseError, match="no `## Unreleased` heading"):
        release.move_unreleased("# Changelog\n", Version("0.1.1"), "2026-12-03")


@pytest.mark.parametrize("args, error", [
    (("atom-foo", "patch", False, None, False), "unknown package 'atom-foo'"),
    (("atom-vllm", "patch", True, None, True), "--dry-run never publishes to PyPI"),
    (("atom-vllm", "patch", False, None, False), "a real release publishes: pass --pypi"),
    (("atom-vllm", "patch", False, "http://x/simple/", True), "pick one"),
])
def test_arguments(args, error):
    package, part, dry_run, index_url, pypi = args
    with pytest.raises(release.ReleaseError, match=error):
        release.check_arguments(package, part, dry_run=dry_run, index_url=index_url, pypi=pypi)


def test_every_package_reads_its_version_from_one_place():
    for package in release.PACKAGES:
        assert release.version_file(release.ROOT, package).name == "__init__.py"
        assert release.current_version(release.ROOT, package) >= Version("0.1.0")
