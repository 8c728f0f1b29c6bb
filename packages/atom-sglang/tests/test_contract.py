"""The installed SGLang still offers everything atom-sglang calls, with the parameters it relies on,
and the plugin accepts this version (and refuses others loudly)."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import logging

import pytest
from _sglang_env import HARNESS

from atom_sglang import _pins, compat, contract, plugin

pytestmark = pytest.mark.sglang


def members(obj) -> set[str]:
    """Field/attribute names an instance of ``obj`` carries (dataclass fields, annotations, attributes)."""
    names = set(dir(obj))
    if dataclasses.is_dataclass(obj):
        names |= {f.name for f in dataclasses.fields(obj)}
    for klass in getattr(obj, "__mro__", ()):
        names |= set(getattr(klass, "__annotations__", {}))
    return names


@pytest.mark.parametrize("symbol", contract.CONTRACT + HARNESS, ids=lambda s: s.path + (f" ({s.releases})" if s.releases else ""))
def test_symbol_has_the_parameters_the_adapter_uses(symbol):
    """Each symbol the adapter (or this test harness) uses in the installed release: it exists and, where its call
    is described, has the parameters it is called with, in that order, and wants no other (every parameter
    without a default is passed)."""
    if not symbol.present_in():
        pytest.skip(f"not in SGLang {compat.installed_version()} (the symbol's releases: {symbol.releases})")
    obj = symbol.resolve()
    if symbol.params:
        signature = inspect.signature(obj)
        params = list(signature.parameters)
        missing = [p for p in symbol.params if p not in params]
        assert not missing, f"{symbol.path} lacks {missing}; it has {params} (used by {symbol.used_by})"
        positional = [p for p in params if p in symbol.params]
        assert positional == list(symbol.params), f"{symbol.path}: parameters reordered: {params}"
        required = [name for name, p in signature.parameters.items() if p.default is p.empty
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and name not in symbol.params]
        assert not required, f"{symbol.path} also requires {required} (used by {symbol.used_by})"
    if symbol.fields:
        owner = symbol.owner()
        missing = [f for f in symbol.fields if f not in members(owner)]
        assert not missing, f"{symbol.path} lacks fields {missing} (used by {symbol.used_by})"


def test_installed_version_is_supported_and_listed():
    """The session's SGLang passes the plugin's version check and has its entry in ci/pins.toml (whether CI runs it
    is that entry's ``ci``: the noxfile tags the sessions from it)."""
    version = compat.check_version()
    assert str(version) in _pins.RELEASES, f"SGLang {version} has no entry in ci/pins.toml [sglang.versions]"


def test_plugin_entry_point_is_discoverable():
    eps = [ep for ep in importlib.metadata.entry_points(group="sglang.srt.plugins") if ep.value == "atom_sglang.plugin:register"]
    assert len(eps) == 1, "atom-sglang's sglang.srt.plugins entry point is not installed"
    assert eps[0].load() is plugin.register


def test_plugin_runs_through_sglangs_loader(monkeypatch, caplog):
    from sglang.srt import plugins

    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    monkeypatch.setenv("SGLANG_PLUGINS", eps_name())
    with caplog.at_level(logging.INFO):
        plugins.load_plugins()
    assert any("atom-sglang: SGLang" in r.getMessage() and "supported" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_plugin_refuses_an_unsupported_version_with_an_error_line(monkeypatch, caplog):
    """SGLang swallows the exception (logger.exception); the explicit error line must still be there."""
    from sglang.srt import plugins

    monkeypatch.setattr(compat, "installed_version", lambda: compat.Version("0.5.10"))
    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    monkeypatch.setenv("SGLANG_PLUGINS", eps_name())
    with caplog.at_level(logging.INFO):
        plugins.load_plugins()  # must not raise: SGLang catches it
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(m.startswith("atom-sglang: atom-sglang supports SGLang") and "0.5.10" in m for m in errors), errors
    with pytest.raises(compat.UnsupportedSGLangVersion):
        plugin.register()


def eps_name() -> str:
    (ep,) = [ep for ep in importlib.metadata.entry_points(group="sglang.srt.plugins") if ep.value.startswith("atom_sglang")]
    return ep.name


def test_hybrid_extension_point_declares_an_architecture_to_sglang():
    """compat.register_linear_attn_model is how the plugin will declare hybrid architectures whose config
    SGLang does not recognise; SGLang must then find the spec by architecture and by config class."""
    from sglang.srt.configs import linear_attn_model_registry as registry

    class TinyHybridConfig:
        architectures = ["AtomTestHybridForCausalLM"]

    backend = "sglang.srt.layers.attention.linear.gdn_backend.GDNAttnBackend"
    before = list(registry._LINEAR_ATTN_MODEL_REGISTRY)
    try:
        compat.register_linear_attn_model(TinyHybridConfig, backend, ["AtomTestHybridForCausalLM"])
        config = TinyHybridConfig()
        spec, found = registry.get_linear_attn_config(config)  # by config class (SGLang's ModelConfig asks this)
        assert spec.backend_class_name == backend and found is config
        assert registry.get_linear_attn_spec_by_arch("AtomTestHybridForCausalLM") is spec
        assert registry.get_linear_attn_spec_by_arch("LlamaForCausalLM") is None
    finally:
        registry._LINEAR_ATTN_MODEL_REGISTRY[:] = before
