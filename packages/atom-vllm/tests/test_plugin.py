"""vLLM's plugin and registry contract, checked in fresh subprocesses against the installed vLLM:
entry point discovery, registration of every served catalog architecture (string form, cheap, no CUDA),
the off switches, resolution to ATOM's classes with the right capability flags, and that a broken install
is a failure rather than a silent fallback to vLLM's own model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from conftest import served_architectures

from atom_core import catalog
from atom_vllm.capabilities import expected_flags

pytestmark = pytest.mark.plugin

REGISTRY_SCRIPT = """
import json, sys
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm import ModelRegistry
import torch
entries = {}
for arch in sys.argv[1:]:
    entry = ModelRegistry.models.get(arch)
    entries[arch] = [getattr(entry, "module_name", None), getattr(entry, "class_name", None)]
print(json.dumps({
    "entries": entries,
    "imported": sorted(m for m in ("atom_vllm.models", "atom_core.models", "atom_core.models.llama", "atom_kernels")
                       if m in sys.modules),
    "cuda_initialized": torch.cuda.is_initialized(),
}))
"""


def registry_state(env: dict[str, str] | None = None) -> dict:
    archs = list(catalog.ARCHITECTURES)
    proc = subprocess.run([sys.executable, "-c", REGISTRY_SCRIPT, *archs], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_served_by_atom(results: list[dict]) -> None:
    """The guard every end-to-end check uses: the class vLLM resolved is ATOM's, not vLLM's own."""
    for r in results:
        assert r["module"] == "atom_vllm.models", f"{r.get('arch', r['dir'])} resolved to {r['module']}.{r['qualname']}"


def test_entry_point_declared():
    found = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "atom"]
    assert [ep.value for ep in found] == ["atom_vllm.plugin:register"]


def test_load_general_plugins_registers_strings_cheaply():
    state = registry_state()
    for arch in served_architectures():
        assert state["entries"][arch] == ["atom_vllm.models", arch], arch
    # string registration: no model code imported, no CUDA touched, in any process that loads plugins
    assert state["imported"] == []
    assert state["cuda_initialized"] is False


@pytest.mark.parametrize("env", [{"ATOM_DISABLE_VLLM_PLUGIN": "1"}, {"VLLM_PLUGINS": ""}, {"VLLM_PLUGINS": "someone_else"}],
                         ids=["ATOM_DISABLE_VLLM_PLUGIN", "VLLM_PLUGINS-empty", "VLLM_PLUGINS-other"])
def test_plugin_can_be_turned_off(env):
    state = registry_state(env)
    for arch in served_architectures():
        module = state["entries"][arch][0]
        assert module is not None and module.startswith("vllm."), f"{arch}: {module}"


def test_register_is_idempotent(monkeypatch):
    from atom_vllm import plugin

    monkeypatch.setattr(plugin, "_registered", None)
    first = plugin.register()
    second = plugin.register()
    assert first == second == {arch: f"atom_vllm.models:{arch}" for arch in served_architectures()}


def test_unsupported_version_is_one_clear_error(monkeypatch):
    from atom_vllm import compat, plugin
    from atom_vllm.tested import supported_range

    monkeypatch.setattr(plugin, "_registered", None)
    monkeypatch.setattr(compat, "vllm_version", lambda: "0.26.0")
    monkeypatch.delenv(compat.ALLOW_UNSUPPORTED_ENV, raising=False)
    with pytest.raises(compat.UnsupportedVllmVersion) as err:
        plugin.register()
    assert f"supports vLLM {supported_range()}" in str(err.value) and "this is vLLM 0.26.0" in str(err.value)
    monkeypatch.setenv(compat.ALLOW_UNSUPPORTED_ENV, "1")
    assert set(plugin.register()) == set(served_architectures())


def test_unsupported_version_stops_vllm_startup():
    """The plugin's error propagates out of vLLM's plugin loading (it is not merely logged)."""
    script = ("import vllm; vllm.__version__ = '0.26.0'\n"
              "from vllm.plugins import load_general_plugins; load_general_plugins()")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "ATOM_VLLM_ALLOW_UNSUPPORTED"})
    assert proc.returncode != 0
    assert "UnsupportedVllmVersion" in proc.stderr and "atom-vllm supports vLLM >=" in proc.stderr


def test_every_architecture_resolves_to_atom_with_its_flags(tiny_models, probe):
    results = probe("resolve", list(tiny_models.values()))
    assert_served_by_atom(results)
    for r in results:
        spec = catalog.get(r["arch"])
        assert r["qualname"] == spec.name
        for flag, value in expected_flags(spec).items():
            assert r["flags"][flag] is value, f"{spec.name}: {flag} = {r['flags'][flag]}, expected {value}"
        # what no catalog model is (yet): these must not be claimed by accident
        for flag in ("is_pooling_model", "supports_pp", "is_attention_free", "has_inner_state", "supports_transcription"):
            assert r["flags"][flag] is False, f"{spec.name}: {flag}"


def _shadow(tmp_path: Path, package: str, broken_module: str) -> Path:
    """A copy of an installed package whose ``broken_module`` raises ImportError, ahead on PYTHONPATH."""
    source = Path(__import__(package).__file__).parent
    root = tmp_path / "shadow"
    shutil.copytree(source, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    target = root / package / (broken_module.replace(".", "/") + ".py")
    target.write_text("raise ImportError('simulated broken install (atom-vllm test)')\n")
    return root


def test_broken_model_code_fails_loudly(tiny_models, probe, tmp_path):
    """atom-core's model module does not import: vLLM must refuse the architecture, not fall back."""
    shadow = _shadow(tmp_path, "atom_core", "models/llama")
    arch = served_architectures()[0]
    proc = probe("resolve", [tiny_models[arch]], env={"PYTHONPATH": str(shadow)}, check=False,
                 fresh_cache=True)
    assert proc.returncode != 0, "a broken ATOM model module was silently replaced"
    assert "failed to be inspected" in proc.stderr or "simulated broken install" in proc.stderr, proc.stderr[-3000:]


def test_broken_plugin_module_is_caught_by_the_guard(tiny_models, probe, tmp_path):
    """vLLM only logs a plugin module that fails to import and serves its own model: the guard every
    end-to-end check applies to the resolved class catches exactly that."""
    shadow = _shadow(tmp_path, "atom_vllm", "plugin")
    arch = served_architectures()[0]
    results = probe("resolve", [tiny_models[arch]], env={"PYTHONPATH": str(shadow)}, fresh_cache=True)
    assert results[0]["module"].startswith("vllm."), "the shadowed plugin was not used"
    with pytest.raises(AssertionError, match="resolved to vllm"):
        assert_served_by_atom(results)
