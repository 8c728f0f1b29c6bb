"""Generate the README's tables — the model table from the atom-core catalog, the version tables from
ci/pins.toml (the one source of tested versions) — or check that they are current.

    python ci/readme_tables.py          rewrite the generated sections of README.md
    python ci/readme_tables.py --check  exit 1 (with a diff) when README.md is out of date

Each table lives between ``<!-- BEGIN generated:NAME -->`` and ``<!-- END generated:NAME -->``; add a
generator to TABLES for a new one.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Callable
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
sys.path.insert(0, str(ROOT / "packages" / "atom-core" / "src"))

from atom_core import catalog  # noqa: E402  (imports no torch)

VLLM_CHECKS = {
    "plugin": "entry point, registry, capability flags, broken-plugin guard",
    "construct": "forced-CPU construction + `load_weights` of every architecture",
    "generate": "`LLM.generate` on CPU: same greedy tokens as vLLM's own model and transformers",
}


def release_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def models_table(pins: dict) -> str:
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


def core_pins_table(pins: dict) -> str:
    lines = ["| package | tested version |", "|---|---|"]
    lines += [f"| {name} | {version} |" for name, version in pins["core"].items()]
    return "\n".join(lines)


def vllm_table(pins: dict) -> str:
    entries = sorted(pins.get("vllm", []), key=lambda e: (e["distribution"], release_key(e["version"])), reverse=True)
    if not entries:
        return "_No vLLM releases pinned._"
    versions = sorted((e["version"] for e in entries), key=release_key)
    newest = release_key(versions[-1])
    lines = [
        f"atom-vllm supports vLLM `>={versions[0]},<{newest[0]}.{newest[1] + 1}` (checked when the plugin loads). "
        "Tested on this CPU-only CI:",
        "",
        "| distribution | version | torch | transformers | checked |",
        "|---|---|---|---|---|",
    ]
    for e in entries:
        checks = "; ".join(VLLM_CHECKS[c] for c in e.get("checks", []))
        torch = e["torch"] + (f" ({e['torch_note']})" if e.get("torch_note") else "")
        lines.append(f"| `{e['distribution']}` | {e['version']} | {torch} | {e['transformers']} | {checks} |")
    return "\n".join(lines)


TABLES: dict[str, Callable[[dict], str]] = {"models": models_table, "core-pins": core_pins_table, "vllm": vllm_table}


def render(text: str, pins: dict) -> str:
    for name, make in TABLES.items():
        pattern = re.compile(rf"(<!-- BEGIN generated:{name} -->).*?(<!-- END generated:{name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"README.md has no generated:{name} section")
        table = make(pins)
        text = pattern.sub(lambda m, table=table: f"{m.group(1)}\n{table}\n{m.group(2)}", text)
    return text


def main(argv: list[str]) -> int:
    pins = tomllib.loads((ROOT / "ci" / "pins.toml").read_text())
    current = README.read_text()
    wanted = render(current, pins)
    if "--check" in argv:
        if current != wanted:
            sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), wanted.splitlines(True), "README.md", "generated"))
            print("README.md is out of date: run `python ci/readme_tables.py`", file=sys.stderr)
            return 1
        print("README.md tables are current")
        return 0
    README.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
