"""vLLM's plugin and registry contract, checked in fresh subprocesses against the installed vLLM:
entry point discovery, registration of every served catalog architecture (string form, cheap, no CUDA),
the off switches, do no harm (without ATOM_TAKE_OVER vLLM keeps its own class where ATOM has no measured fast path,
and vLLM's log says which class serves each architecture), resolution to ATOM's classes with the right capability
flags, and that a broken install
is a failure rather than a silent fallback to vLLM's own model."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from conftest import construct_architectures, served_architectures

from atom_core import catalog, takeover
from atom_core.takeover import platform_name
from atom_vllm.capabilities import expected_flags

pytestmark = pytest.mark.plugin

# vLLM's log format: "(EngineCore pid=N) " before the level in its child processes (newer releases), then
# "INFO MM-DD HH:MM:SS [file.py:line] message".
VLLM_LOG_LINE = re.compile(r"(\([^)]*\) )?INFO \d\d-\d\d \d\d:\d\d:\d\d(\.\d+)? \[[\w.]+:\d+\] ")

REGISTRY_SCRIPT = """
import json, os, sys
import vllm.logger
if hasattr(vllm.logger, "configure_logging"):  # 0.32+: vLLM's servers configure its logging from their arguments
    from vllm.config.logging import LoggingConfig
    vllm.logger.configure_logging(LoggingConfig())  # (before 0.32 importing vllm.logger did)
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm import ModelRegistry
import torch

def entries():
    return {arch: [getattr(e, "module_name", None), getattr(e, "class_name", None)]
            for arch in sys.argv[1:] for e in [ModelRegistry.models.get(arch)]}

state = {"entries": entries(),
         "imported": sorted(m for m in ("atom_vllm.models", "atom_core.models", "atom_core.models.llama", "atom_kernels")
                            if m in sys.modules),
         "cuda_initialized": torch.cuda.is_initialized()}
if then := os.environ.get("ATOM_TEST_THEN_TAKE_OVER"):  # the plugin once more in this process, with another switch
    from atom_vllm import plugin
    os.environ["ATOM_TAKE_OVER"] = then
    plugin._registered = None
    plugin.register()
    state["then"] = entries()
from atom_vllm.compat import platform
print("ATOM_REGISTRY " + json.dumps(state | {"platform": platform()}))
"""


def registry_state(**env: str | None) -> dict:
    """The registry after vLLM loads its plugins in a fresh process (``env``: variables to set, or to unset with
    None); ``log``: that process's output, where vLLM's logging configuration writes its log."""
    archs = list(catalog.ARCHITECTURES)
    full_env = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    proc = subprocess.run([sys.executable, "-c", REGISTRY_SCRIPT, *archs], capture_output=True, text=True, timeout=300,
                          env=full_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("ATOM_REGISTRY ")]
    return json.loads(line.split(" ", 1)[1]) | {"log": proc.stdout + proc.stderr}


def assert_served_by_atom(results: list[dict]) -> None:
    """The guard every end-to-end check uses: the class vLLM resolved is ATOM's, not vLLM's own."""
    for r in results:
        assert r["module"] == "atom_vllm.models", f"{r.get('arch', r['dir'])} resolved to {r['module']}.{r['qualname']}"


def test_entry_point_declared():
    found = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "atom"]
    assert [ep.value for ep in found] == ["atom_vllm.plugin:register"]


def test_load_general_plugins_registers_strings_cheaply():
    """In a fresh process, as vLLM's own processes do: every served architecture registered as a string,
    no model code imported, no CUDA touched."""
    state = registry_state()
    for arch in served_architectures():
        assert state["entries"][arch] == ["atom_vllm.models", arch], arch
    assert state["imported"] == []
    assert state["cuda_initialized"] is False
    assert f"ATOM's classes serve, in vLLM on {platform_name(state['platform'])}: " in state["log"]


def vllm_own(entry: list[str | None]) -> bool:
    """A registry entry of vLLM's own class (its models moved from vllm.model_executor.models to vllm.models)."""
    return (entry[0] or "").startswith("vllm.")


def test_do_no_harm_by_default(monkeypatch):
    """Without ATOM_TAKE_OVER, on a platform where ATOM has no measured fast path (this CPU), vLLM keeps its own class
    for every architecture it has one of (all catalog architectures, in every supported release), and vLLM's own log
    (its handler, its format) says so once, naming each architecture and why; then (same process, the plugin again)
    ATOM_TAKE_OVER=Arch forces that one only."""
    one = served_architectures()[0]
    monkeypatch.delenv("ATOM_TAKE_OVER")
    state = registry_state(ATOM_TEST_THEN_TAKE_OVER=one)
    decisions = takeover.decide_all("vllm", state["platform"], served_architectures(), catalog.ARCHITECTURES)
    assert not any(d.atom for d in decisions), "a row of atom_core.takeover makes ATOM take over on this platform"
    for arch in served_architectures():
        assert vllm_own(state["entries"][arch]), f"{arch} is served by {state['entries'][arch]} without ATOM_TAKE_OVER"
    line = next(x for x in state["log"].splitlines() if "vLLM's own classes serve" in x)  # the first registration's
    assert VLLM_LOG_LINE.match(line), f"not vLLM's log format: {line}"
    assert ", ".join(served_architectures()) in line and "ATOM_TAKE_OVER=all" in line, line

    assert state["then"][one] == ["atom_vllm.models", one]
    assert all(vllm_own(state["then"][a]) for a in served_architectures() if a != one)
    assert f"ATOM's classes serve, in vLLM on {platform_name(state['platform'])}: {one} (forced by ATOM_TAKE_OVER)" \
        in state["log"]


def test_take_over_value_that_names_no_architecture_stops_startup(plugin_loading, monkeypatch):
    """The plugin's UsageError propagates out of vLLM's plugin loading, naming the variable and the value."""
    from atom_core.errors import UsageError

    monkeypatch.setenv("ATOM_TAKE_OVER", "Llama")
    with pytest.raises(UsageError, match="ATOM_TAKE_OVER=Llama: Llama is not a catalog architecture"):
        plugin_loading.load_general_plugins()


@pytest.fixture
def plugin_loading(monkeypatch):
    """vLLM's plugin loading, re-armed in this process (it runs once per process), with ATOM's state reset."""
    import vllm.plugins

    from atom_vllm import plugin

    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.setattr(plugin, "_registered", None)
    for name in ("ATOM_DISABLE_VLLM_PLUGIN", "VLLM_PLUGINS", "ATOM_VLLM_ALLOW_UNSUPPORTED"):
        monkeypatch.delenv(name, raising=False)
    return vllm.plugins


@pytest.mark.parametrize("env", [{}, {"VLLM_PLUGINS": "atom"}, {"VLLM_PLUGINS": ""}, {"VLLM_PLUGINS": "someone_else"}],
                         ids=["all", "VLLM_PLUGINS-atom", "VLLM_PLUGINS-empty", "VLLM_PLUGINS-other"])
def test_vllm_plugin_filter(plugin_loading, monkeypatch, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    found = plugin_loading.load_plugins_by_group(plugin_loading.DEFAULT_PLUGINS_GROUP)
    wanted = env.get("VLLM_PLUGINS", "atom") == "atom"
    assert ("atom" in found) is wanted
    if wanted:
        from atom_vllm.plugin import register

        assert found["atom"] is register


def test_atom_disable_switch(plugin_loading, monkeypatch):
    from vllm import ModelRegistry

    from atom_vllm import plugin

    before = {arch: ModelRegistry.models.get(arch) for arch in served_architectures()}
    monkeypatch.setenv("ATOM_DISABLE_VLLM_PLUGIN", "1")
    plugin_loading.load_general_plugins()
    assert plugin._registered is None
    assert {arch: ModelRegistry.models.get(arch) for arch in served_architectures()} == before


def registered_names() -> list[str]:
    """The served architectures and the draft models of those among them that have one (atom_core.catalog.DRAFTS),
    under each name a draft checkpoint's config may give (its aliases: EAGLE-3's ``LlamaForCausalLMEagle3``)."""
    served = served_architectures()
    return [*served, *(name for d in catalog.DRAFTS.values() if any(t in served for t in d.targets)
                       for name in (d.name, *d.aliases))]


def test_register_is_idempotent(plugin_loading):
    from atom_vllm import plugin

    first = plugin.register()
    second = plugin.register()
    assert first == second == {arch: f"atom_vllm.models:{arch}" for arch in registered_names()}


def test_unsupported_version_stops_vllm_startup(plugin_loading, monkeypatch):
    """The plugin's error propagates out of vLLM's plugin loading (it is not merely logged), naming the
    supported range; ATOM_VLLM_ALLOW_UNSUPPORTED=1 lets it through."""
    import vllm

    from atom_vllm import compat, plugin
    from atom_vllm.tested import supported_range

    lowest = supported_range().lowest
    below = f"{lowest.major}.{lowest.minor - 1}.0"  # the minor release before the oldest tested one
    monkeypatch.setattr(vllm, "__version__", below)
    with pytest.raises(compat.UnsupportedVllmVersion) as err:
        plugin_loading.load_general_plugins()
    assert f"supports vLLM {supported_range()}" in str(err.value) and f"this is vLLM {below}" in str(err.value)
    monkeypatch.setattr(plugin_loading, "plugins_loaded", False)
    monkeypatch.setenv(compat.ALLOW_UNSUPPORTED_ENV, "1")
    plugin_loading.load_general_plugins()
    assert set(plugin._registered) == set(registered_names())


def test_every_architecture_resolves_to_atom_with_its_flags(tiny_models, probe):
    """Each architecture the construct check builds (every one, or one per family where the release's entry says
    ``construct = "family"``) resolves to ATOM's class with the capability flags vLLM's inspection reads."""
    results = probe("resolve", [tiny_models[arch] for arch in construct_architectures()])
    assert_served_by_atom(results)
    for r in results:
        spec = catalog.get(r["arch"])
        assert r["qualname"] == spec.name
        for flag, value in expected_flags(spec).items():
            assert r["flags"][flag] is value, f"{spec.name}: {flag} = {r['flags'][flag]}, expected {value}"
        # MRoPE positions come from the model only when vLLM also reads mrope_section from the config
        assert r["flags"]["uses_mrope"] is r["flags"]["supports_mrope"], spec.name
        # what no catalog model is (yet): these must not be claimed by accident
        for flag in ("is_pooling_model", "supports_pp", "is_attention_free", "supports_transcription"):
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
    results = probe("resolve", [tiny_models[arch]], env={"PYTHONPATH": str(shadow)}, fresh_cache=True, inspect="no")
    assert results[0]["module"].startswith("vllm."), "the shadowed plugin was not used"
    with pytest.raises(AssertionError, match="resolved to vllm"):
        assert_served_by_atom(results)
