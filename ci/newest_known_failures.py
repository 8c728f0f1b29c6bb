"""pytest plugin of ``nox -s newest`` (``-p newest_known_failures``, ci/ on the path): the tests ci/pins.toml
``[[newest.known_failures]]`` records as broken by the newest upstream releases are marked xfail with the recorded
reason, so the session fails on any other failure (a new upstream break) and still lists the known ones.  Not strict:
parametrized cases of a listed test that pass are reported XPASS (when a whole test passes again, take it off the list).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent


def known_failures() -> dict[str, str]:
    """``path::test_function`` (relative to the repository root) -> why it fails on the newest releases."""
    pins = tomllib.loads((ROOT / "ci" / "pins.toml").read_text())
    return {test: entry["reason"] for entry in pins.get("newest", {}).get("known_failures", []) for test in entry["tests"]}


def pytest_collection_modifyitems(config, items):
    known = known_failures()
    for item in items:
        key = f"{Path(item.path).resolve().relative_to(ROOT)}::{getattr(item, 'originalname', item.name)}"
        if key in known:
            item.add_marker(pytest.mark.xfail(reason=known[key], strict=False))
