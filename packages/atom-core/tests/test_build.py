"""The one build path (:mod:`atom_core.build`): the quantization scheme reaches fused layers through the model's
fused-layer map on every host.  An FP8 checkpoint whose exclusion list names ``q_proj``, ``k_proj`` and ``v_proj``
(per layer, as ``atom quantize --exclude`` and published checkpoints write it) keeps the fused ``qkv_proj``
unquantized; the adapters' tests load the same checkpoint through vLLM and SGLang and compare with
:func:`linear_methods` of the native build."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import hf_model
from parity import PROMPTS, reference_logits
from quant_helpers import logit_metrics, reference_with_quantized_weights

from atom_core.build import build_model, plan_model
from atom_core.config import load_hf_config
from atom_core.errors import UnsupportedQuantizationError
from atom_core.layers.linear import LinearBase
from atom_core.quant.quantize import quantize_checkpoint
from atom_core.runtime.host import NativeHost
from atom_core.runtime.runner import Runner

QKV = ("q_proj", "k_proj", "v_proj")


def linear_methods(model) -> dict[str, str]:
    return {name: type(m.quant_method).__name__ for name, m in model.named_modules() if isinstance(m, LinearBase)}


@pytest.fixture(scope="module")
def qkv_excluded(tiny, tmp_path_factory) -> str:
    return str(quantize_checkpoint(tiny("Qwen3ForCausalLM"), tmp_path_factory.mktemp("fp8") / "out", "fp8-block",
                                   exclude=QKV))


def test_exclusions_are_written_per_checkpoint_module(qkv_excluded):
    config = json.loads(load_hf_config(qkv_excluded).to_json_string())["quantization_config"]
    layers = load_hf_config(qkv_excluded).num_hidden_layers
    expected = {f"model.layers.{i}.self_attn.{p}" for i in range(layers) for p in QKV}
    # every 2-D tensor that is no linear layer (embeddings, lm_head) is listed too, for hosts that would take it for one
    assert set(config["ignored_layers"]) - {"lm_head", "model.embed_tokens"} == expected


def test_fused_layer_follows_its_shards_exclusions(tiny, qkv_excluded):
    runner = Runner(qkv_excluded)
    methods = linear_methods(runner.model)
    qkv = {name: m for name, m in methods.items() if name.endswith("qkv_proj")}
    assert qkv and set(qkv.values()) == {"UnquantizedLinearMethod"}, qkv
    rest = {name: m for name, m in methods.items() if not name.endswith(("qkv_proj", "lm_head"))}
    assert rest and "UnquantizedLinearMethod" not in rest.values(), rest
    hf = reference_with_quantized_weights(hf_model(tiny("Qwen3ForCausalLM")), qkv_excluded, "fp8-block")
    rel, _, _ = logit_metrics(runner.prompt_logits(PROMPTS), reference_logits(hf, PROMPTS))
    assert rel <= 2e-2


def test_every_host_builds_through_the_same_plan(qkv_excluded):
    """An adapter builds into its wrapper instance (a subclass of ATOM's class); the scheme it gets carries the
    fused-layer map, exactly as the native build's."""
    hf_config = load_hf_config(qkv_excluded)
    plan = plan_model(hf_config)
    assert plan.quant.packed_modules_mapping == plan.model_class.packed_modules_mapping()
    wrapper = type("HostWrapper", (plan.model_class,), {})
    with torch.device("meta"):
        native, _ = build_model(hf_config, lambda quant: NativeHost(quant=quant))
        hosted, host = build_model(hf_config, lambda quant: NativeHost(quant=quant), into=object.__new__(wrapper))
    assert host.quant.packed_modules_mapping == plan.quant.packed_modules_mapping
    assert linear_methods(hosted) == linear_methods(native)
    with pytest.raises(TypeError, match="is not a"):
        build_model(hf_config, lambda quant: NativeHost(quant=quant), into=object())


def test_exclusion_splitting_a_fused_layer_is_refused(tiny, tmp_path):
    with pytest.raises(UnsupportedQuantizationError, match="shards of a fused layer"):
        quantize_checkpoint(tiny("Qwen3ForCausalLM"), tmp_path / "out", "fp8-block", exclude=("q_proj",))
