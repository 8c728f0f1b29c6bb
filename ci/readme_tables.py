"""Regenerate the README's generated tables (model table from the atom-core catalog, compatibility
tables from ci/pins.toml), or with ``--check`` fail when the README is out of date.

Each table sits between ``<!-- BEGIN GENERATED: name -->`` and ``<!-- END GENERATED: name -->``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "packages" / "atom-core" / "src"))

from atom_core import catalog  # noqa: E402  (imports no torch)


def models_table() -> str:
    lines = [
        "| architecture | family | capabilities | quantization formats | reference (transformers) |",
        "|---|---|---|---|---|",
    ]
    for name in catalog.supported():
        spec = catalog.get(name)
        caps = ", ".join(sorted(spec.capabilities))
        quant = ", ".join(spec.quant_formats) or "—"
        lines.append(f"| `{name}` | {spec.family} | {caps} | {quant} | `{spec.hf_class.split(':')[1]}` |")
    return "\n".join(lines)


def core_pins_table() -> str:
    pins = tomllib.loads((ROOT / "ci" / "pins.toml").read_text())["core"]
    lines = ["| package | tested version |", "|---|---|"]
    lines += [f"| {name} | {version} |" for name, version in pins.items()]
    return "\n".join(lines)


TABLES = {"models": models_table, "core-pins": core_pins_table}


def render(readme: str) -> str:
    for name, make in TABLES.items():
        pattern = re.compile(rf"(<!-- BEGIN GENERATED: {name} -->\n)(?:.*?\n)?(<!-- END GENERATED: {name} -->)", re.S)
        if not pattern.search(readme):
            raise SystemExit(f"README.md has no generated section {name!r}")
        table = make()
        readme = pattern.sub(lambda m, t=table: m.group(1) + t + "\n" + m.group(2), readme)
    return readme


def main(argv: list[str]) -> int:
    path = ROOT / "README.md"
    current = path.read_text()
    wanted = render(current)
    if "--check" in argv:
        if wanted != current:
            print("README.md tables are out of date: run `python ci/readme_tables.py`", file=sys.stderr)
            return 1
        return 0
    path.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
