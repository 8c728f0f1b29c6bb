"""The import graph of the four distributions, read from their sources (every import statement, lazy ones inside
functions included; ``if TYPE_CHECKING:`` blocks excepted): arrows point only down the table of DESIGN.md
(adapters -> atom-core -> atom-kernels, no adapter imports the other host or its adapter, no library imports the
tools in tools/atom_tools), and atom-core's modules import each other without a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGES = Path(__file__).resolve().parents[2]
SOURCES = {"atom_kernels": "atom-kernels", "atom_core": "atom-core", "atom_vllm": "atom-vllm",
           "atom_sglang": "atom-sglang"}
# top-level import names each distribution must never import; none imports the tools (tools/atom_tools: benches,
# accuracy gate), which sit above every library and ship in no wheel
FORBIDDEN = {
    "atom_kernels": {"atom_core", "atom_vllm", "atom_sglang", "vllm", "sglang", "atom_tools"},
    "atom_core": {"atom_vllm", "atom_sglang", "vllm", "sglang", "atom_tools"},
    "atom_vllm": {"atom_sglang", "sglang", "atom_tools"},
    "atom_sglang": {"atom_vllm", "vllm", "atom_tools"},
}


def modules(package: str) -> dict[str, Path]:
    src = PACKAGES / SOURCES[package] / "src"
    out = {}
    for file in sorted((src / package).rglob("*.py")):
        parts = list(file.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = file
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def imported(name: str, file: Path) -> set[str]:
    """Every module name ``file`` (the module ``name``) imports, absolute, with ``from X import Y`` giving both
    ``X`` and ``X.Y`` (Y may be a submodule)."""
    tree = ast.parse(file.read_text())
    skipped = _type_checking_nodes(tree)
    package = name.split(".") if file.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            out.add(module)
            out |= {f"{module}.{alias.name}" for alias in node.names}
    return out


def graph(package: str) -> dict[str, set[str]]:
    mods = modules(package)
    return {name: {m for m in imported(name, file) if m in mods and m != name} for name, file in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("package", sorted(SOURCES))
def test_imports_point_down_the_layers(package):
    against = sorted((name, m) for name, file in modules(package).items() for m in imported(name, file)
                     if m.split(".")[0] in FORBIDDEN[package])
    assert against == [], f"{package} imports against the layering: {against}"


def test_atom_core_has_no_import_cycle():
    assert cycles(graph("atom_core")) == []


def test_the_walk_sees_cycles_and_lazy_imports(tmp_path):
    """The checker itself: a cycle closed by an import inside a function is found; a TYPE_CHECKING one is not."""
    files = {"a.py": "from pkg import b\n", "b.py": "def f():\n    from pkg.a import x\n",
             "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\nimport pkg.a\n"}
    edges = {}
    for file, text in files.items():
        path = tmp_path / file
        path.write_text(text)
        edges[f"pkg.{path.stem}"] = {m for m in imported(f"pkg.{path.stem}", path) if m in {"pkg.a", "pkg.b", "pkg.c"}}
    assert cycles(edges) == [["pkg.a", "pkg.b"]]
    assert edges["pkg.c"] == {"pkg.a"}  # from the plain import only
    files_c = tmp_path / "c2.py"
    files_c.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    assert "pkg.a" not in imported("pkg.c2", files_c)
