"""Pieces of the adapter that need no SGLang: window convention, MRoPE detection, once-per-load weight
processing, the capability plan and its mixins, the hybrid state-plan check and the generated pins module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from atom_core import catalog
from atom_sglang import _pins, capabilities, compat, contract, drafts
from atom_sglang.host import SGLangHost, SGLangTP, radix_window
from atom_sglang.linear_attention import SGLangLinearAttentionState, check_state_plan
from atom_sglang.wrapper import entry_classes, guard_weight_processing, reset_weight_processing, uses_mrope, wrapper_class

ROOT = Path(__file__).resolve().parents[3]


def test_radix_window_is_exclusive_of_the_query():
    # transformers: key j visible to query i iff 0 <= i - j < w; SGLang: iff i - j <= w'.
    for w in (1, 4, 32, 4096):
        w_sglang = radix_window(w)
        for distance in range(0, w + 3):
            assert (distance < w) == (distance <= w_sglang), (w, distance)
    assert radix_window(None) == -1


def test_uses_mrope_follows_sglangs_rule():
    assert uses_mrope(SimpleNamespace(rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24]}))
    assert uses_mrope(SimpleNamespace(rope_parameters=None, rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1]}))
    assert not uses_mrope(SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
    nested = SimpleNamespace(get_text_config=lambda: SimpleNamespace(rope_parameters={"mrope_section": [1, 1, 2]}))
    assert uses_mrope(nested)


class CountingMethod:
    def __init__(self):
        self.calls: dict[str, int] = {}

    def process_weights_after_loading(self, layer):
        self.calls[layer.name] = self.calls.get(layer.name, 0) + 1


class Layer(nn.Module):
    def __init__(self, name, method):
        super().__init__()
        self.name, self.quant_method = name, method


def test_weight_processing_runs_once_per_load():
    shared = CountingMethod()  # one method object shared by two layers, as schemes may do
    model = nn.Sequential(Layer("a", shared), Layer("b", shared))
    guard_weight_processing(model)
    guard_weight_processing(model)  # idempotent: no double wrapping
    for layer in model:  # ATOM's loader, then SGLang's post-processing loop
        layer.quant_method.process_weights_after_loading(layer)
    for layer in model:
        layer.quant_method.process_weights_after_loading(layer)
    assert shared.calls == {"a": 1, "b": 1}
    reset_weight_processing(model)  # a weight update converts again
    for layer in model:
        layer.quant_method.process_weights_after_loading(layer)
    assert shared.calls == {"a": 2, "b": 2}


def test_host_sliding_window_is_one_per_model():
    def layer(window):
        return SimpleNamespace(attn=SimpleNamespace(sliding_window_size=window))

    host = SGLangHost(tp=SGLangTP(SimpleNamespace(rank_in_group=0, world_size=1)))
    assert host.sliding_window() is None
    host.attention_layers = [layer(-1), layer(31), layer(31)]
    assert host.sliding_window() == 31
    host.attention_layers.append(layer(15))
    with pytest.raises(ValueError, match="different sliding windows"):
        host.sliding_window()


def test_capability_plan_covers_the_catalog():
    served, skipped = capabilities.plan()
    assert sorted(served + list(skipped)) == sorted(catalog.ARCHITECTURES)
    for name in served:
        assert capabilities.missing(catalog.get(name)) == []
    for name, why in skipped.items():
        assert why == "; ".join(capabilities.missing(catalog.get(name)))
    unknown = catalog.ArchSpec("FooForCausalLM", "m:C", "foo", "t:C", "foo", capabilities=frozenset({"telepathy"}))
    assert capabilities.missing(unknown) == [
        "capability 'telepathy' is unknown to atom-sglang (add it to atom_sglang.capabilities)"
    ]
    staged = catalog.ArchSpec("BarForCausalLM", "m:C", "bar", "t:C", "bar",
                              capabilities=frozenset({catalog.TEXT, "pipeline-parallel"}))
    assert len(capabilities.missing(staged)) == 1 and "PPProxyTensors" in capabilities.missing(staged)[0]
    # Qwen3.5 (hybrid + multimodal + MRoPE) needs nothing more than the implemented extensions.
    for name in ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"):
        assert capabilities.missing(catalog.get(name)) == []
        assert [m.__name__ for m in capabilities.mixins(catalog.get(name))] == ["SGLangMultimodal"]


def test_every_catalog_architecture_is_served_or_refused(monkeypatch, caplog):
    """With ATOM's classes forced (conftest: ATOM_TAKE_OVER=all), EntryClass holds ATOM's wrapper for every
    architecture atom-sglang serves.  One with a capability atom-sglang lacks stays SGLang's own when SGLang has a
    class of its own and the switch did not name it; with no class of SGLang's, or named, it gets a class that refuses
    to build with the reason, named in an error line at import; so does one whose wrapper cannot be built (a bug)."""
    import logging

    from atom_sglang import compat

    staged = catalog.ArchSpec("StagedForCausalLM", "atom_core.models.llama:Qwen3ForCausalLM", "staged", "t:C", "staged",
                              capabilities=frozenset({catalog.TEXT, "pipeline-parallel"}))
    broken = catalog.ArchSpec("BrokenVLForConditionalGeneration", "atom_core.models.llama:Qwen3ForCausalLM", "broken",
                              "t:C", "broken", capabilities=frozenset({catalog.TEXT, catalog.MULTIMODAL}))
    held = catalog.ArchSpec("HeldForCausalLM", "atom_core.models.llama:Qwen3ForCausalLM", "held", "t:C", "held",
                            capabilities=frozenset({catalog.TEXT, "pipeline-parallel"}))  # one SGLang has (below)
    for spec in (staged, broken, held):
        monkeypatch.setitem(catalog.ARCHITECTURES, spec.name, spec)
    lacking = {name for name in catalog.ARCHITECTURES if capabilities.missing(catalog.get(name))}
    assert staged.name in lacking and broken.name not in lacking
    assert held.name in lacking
    monkeypatch.setattr(compat, "own_architectures", lambda: frozenset(catalog.ARCHITECTURES) - {staged.name, broken.name})
    with caplog.at_level(logging.INFO, logger="atom_sglang.wrapper"):
        classes = {cls.__name__: cls for cls in entry_classes(__name__)}
    draft_names = set(drafts.SGLANG_NAMES.values())
    assert draft_names <= set(classes)  # every draft's targets are served (atom_sglang.drafts)
    classes = {name: cls for name, cls in classes.items() if name not in draft_names}
    assert set(classes) == set(catalog.ARCHITECTURES) - (lacking - {staged.name})  # the rest: SGLang's own
    refused = {name for name, cls in classes.items() if hasattr(cls, "atom_refusal")}
    assert refused == {staged.name, broken.name}
    assert "DeepseekV3ForCausalLM" not in refused  # latent attention is served (atom_sglang.latent)
    assert "DeepseekV32ForCausalLM" not in refused  # sparse attention too (atom_sglang.sparse)
    own_line = next(r.getMessage() for r in caplog.records if "SGLang's own classes serve" in r.getMessage())
    assert all(name in own_line for name in lacking - {staged.name}) and "cannot serve it yet" in own_line, own_line
    for name, match in ((staged.name, "PPProxyTensors"), (broken.name, "lacks \\['embed_multimodal'\\]")):
        assert classes[name].__module__ == __name__
        with pytest.raises(ValueError, match=f"atom-sglang does not serve {name}: .*{match}.*SGLANG_EXTERNAL_MODEL_PACKAGE"):
            classes[name](config=None)
        assert any(f"does not serve {name}" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    for name in set(classes) - refused:
        assert issubclass(classes[name], catalog.get(name).model_class())
    named = sorted(lacking - {staged.name})[0]  # named by the switch: refused, not SGLang's own
    monkeypatch.setenv("ATOM_TAKE_OVER", named)
    classes = {cls.__name__: cls for cls in entry_classes(__name__)}
    assert set(classes) == {named, staged.name, broken.name}  # (the two without a class of SGLang's: ATOM's always)
    assert all(hasattr(cls, "atom_refusal") for cls in classes.values())


@pytest.mark.parametrize("platform, switch, expected", [
    ("cpu", None, []),
    ("cuda", None, ["Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM"]),  # takeover's SGLang rows
    ("cpu", "Qwen3ForCausalLM", ["Qwen3ForCausalLM"]),
    ("cpu", "none", []), ("cpu", "all", [a for a in catalog.ARCHITECTURES if not capabilities.missing(catalog.get(a))]),
])
def test_entry_classes_do_no_harm(monkeypatch, caplog, platform, switch, expected):
    """Only the architectures ATOM takes over (atom_core.takeover) and can serve get a class ("all": every one it
    can serve); one SGLang has no class of its own for is ATOM's whatever the switch; a log line names the rest as
    SGLang's own."""
    import logging

    from atom_sglang import compat

    ours = catalog.ArchSpec("OnlyAtomForCausalLM", "atom_core.models.llama:Qwen3ForCausalLM", "only", "t:C", "only")
    monkeypatch.setitem(catalog.ARCHITECTURES, ours.name, ours)
    monkeypatch.setattr(compat, "platform", lambda: platform)
    monkeypatch.setattr(compat, "own_architectures", lambda: frozenset(catalog.ARCHITECTURES) - {ours.name})
    if switch is None:
        monkeypatch.delenv("ATOM_TAKE_OVER")
    else:
        monkeypatch.setenv("ATOM_TAKE_OVER", switch)
    with caplog.at_level(logging.INFO, logger="atom_sglang.wrapper"):
        names = [cls.__name__ for cls in entry_classes(__name__)]
    served_drafts = {drafts.SGLANG_NAMES[d.name] for d in catalog.DRAFTS.values() if set(d.targets) & set(expected)}
    assert {n for n in names if n in drafts.SGLANG_NAMES.values()} == served_drafts  # drafts beside ATOM's targets
    names = [n for n in names if n not in served_drafts]
    assert sorted(names) == sorted(set(expected) | {ours.name})
    lines = [r.getMessage() for r in caplog.records if "classes serve" in r.getMessage()]
    own = [a for a in catalog.ARCHITECTURES if a not in names]
    if own:
        assert any(line.startswith("atom-sglang: SGLang's own classes serve") and ", ".join(own) in line for line in lines)


def test_wrapper_class_needs_the_multimodal_hooks_of_the_atom_model():
    """A multimodal catalog entry whose ATOM class lacks embed_multimodal gets no half-working wrapper."""
    spec = catalog.ArchSpec("FakeVLForConditionalGeneration", "atom_core.models.llama:Qwen3ForCausalLM", "fake", "t:C",
                            "fake", capabilities=frozenset({catalog.TEXT, catalog.MULTIMODAL}))
    with pytest.raises(ValueError, match="lacks \\['embed_multimodal'\\]"):
        wrapper_class(spec, __name__)
    vl = wrapper_class(catalog.get("Qwen3VLForConditionalGeneration"), __name__)
    assert [c.__name__ for c in vl.__mro__[1:4]] == ["SGLangMultimodal", "SGLangCausalLM", "Qwen3VLForConditionalGeneration"]


def state(layer_id, conv=(256, 3), ssm=(4, 32, 32)):
    return SGLangLinearAttentionState(None, f"model.layers.{layer_id}.linear_attn", layer_id, conv, ssm, torch.float32,
                                      mix=None)


def test_state_plan_must_match_sglangs_pool():
    """SGLang sizes its mamba pool from its config; ATOM's GDN layers must be exactly those, with its shapes
    (V-major SSM: K-major (HV, K, V) = (4, 32, 16) is stored as (4, 16, 32))."""
    shape = SimpleNamespace(conv=[(256, 3)], temporal=(4, 16, 32))
    config = SimpleNamespace(mamba2_cache_params=SimpleNamespace(layers=[0, 2], shape=shape))
    with pytest.raises(ValueError, match="plans linear-attention state for layers \\[0, 2\\].*\\[0, 1\\]"):
        check_state_plan(config, [state(0, ssm=(4, 32, 16)), state(1, ssm=(4, 32, 16))], "M")
    with pytest.raises(ValueError, match="SSM \\(4, 16, 32\\).*SSM \\(4, 32, 32\\)"):
        check_state_plan(config, [state(0, ssm=(4, 32, 16)), state(2)], "M")
    with pytest.raises(ValueError, match="does not treat this config \\(SimpleNamespace\\) as a hybrid"):
        check_state_plan(SimpleNamespace(), [state(0)], "M")


def test_version_check_names_the_range():
    low = sorted(_pins.TESTED)[0]
    assert compat.unsupported_reason(low) is None
    for bad in ("0.5.10", "0.6.0"):
        reason = compat.unsupported_reason(bad)
        assert reason is not None and _pins.SUPPORTED in reason and bad in reason
        with pytest.raises(compat.UnsupportedSGLangVersion, match=bad):
            compat.check_version(bad)
    assert compat.unsupported_reason(None) == "SGLang is not installed"


def test_release_tables_give_each_supported_release_one_spelling():
    """compat.ByRelease: the ranges of a table must match every release of the range exactly once (checked when the
    table is built); get() answers for a release and refuses one outside the supported range."""
    assert all(compat.SUPPORTED.contains(r) for r in _pins.RELEASES) and set(_pins.TESTED) <= set(_pins.RELEASES)
    with pytest.raises(AssertionError, match=r"SGLang 0\.5\.20 .* matches \[\], not one range"):
        compat.ByRelease("a gap", {"<0.5.20": 1, ">0.5.20": 2})
    with pytest.raises(AssertionError, match=r"SGLang 0\.5\.19 .* matches \['<0\.5\.20', '>=0\.5\.19'\]"):
        compat.ByRelease("an overlap", {"<0.5.20": 1, ">=0.5.19": 2})
    table = compat.ByRelease("a move", {"<0.5.20": "old", ">=0.5.20": "new"})
    assert [table.get(r) for r in ("0.5.17", "0.5.19", "0.5.20", "0.5.23")] == ["old", "old", "new", "new"]
    with pytest.raises(compat.UnsupportedSGLangVersion, match="0.5.10"):
        table.get("0.5.10")


def test_each_contract_symbol_is_in_some_supported_release():
    from _sglang_env import HARNESS

    for symbol in contract.CONTRACT + HARNESS:
        assert any(symbol.present_in(r) for r in _pins.RELEASES), f"{symbol.path}: no supported release in {symbol.releases!r}"


def test_generated_files_match_pins():
    result = subprocess.run([sys.executable, str(ROOT / "ci" / "readme_tables.py"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_tp_adapter_delegates_to_the_group():
    calls = []
    group = SimpleNamespace(
        rank_in_group=1, world_size=2,
        all_reduce=lambda x: calls.append(("all_reduce",)) or x * 2,
        all_gather=lambda x, dim: calls.append(("all_gather", dim)) or torch.cat([x, x], dim=dim),
    )
    tp = SGLangTP(group)
    assert (tp.rank, tp.world_size) == (1, 2)
    assert torch.equal(tp.all_reduce(torch.ones(2)), torch.full((2,), 2.0))
    assert tp.all_gather(torch.ones(1, 3), dim=-1).shape == (1, 6)
    assert calls == [("all_reduce",), ("all_gather", -1)]
