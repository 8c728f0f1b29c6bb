"""Checkpoint formats written by hand (FP8 per tensor, compressed-tensors block, Quark e8m0), exclusions through
fused layers, and the quantization config's errors: each loads as its format says or fails naming the cause."""

import json

import pytest
import torch
from conftest import hf_model
from parity import PROMPTS, reference_logits
from quant_helpers import LINEARS, logit_metrics, read_tensors
from quant_helpers import rewrite_checkpoint as _rewrite

from atom_core.errors import UnsupportedQuantizationError
from atom_core.quant import parse_quant_config
from atom_core.quant.exclusions import layer_excluded, matches, shard_names
from atom_core.runtime.runner import Runner
from atom_kernels import formats

QUALITY_FP8 = 0.15  # max relative logit error against the unquantized model (as test_quantization.QUALITY)


# --------------------------------------------------------------- hand-written formats and exclusions
def test_fp8_per_tensor_static_checkpoint(tiny, tmp_path):
    """``quant_method: fp8`` per tensor with static input scales: one scale per q/k/v shard (different
    ones), the per-shard scales become per-channel, the largest input scale is used."""
    src = tiny("Qwen3ForCausalLM")
    tensors = read_tensors(src)
    out_tensors, input_scales = {}, {}
    for name, t in tensors.items():
        module, _, leaf = name.rpartition(".")
        if module.split(".")[-1] in LINEARS and leaf == "weight":
            q, s = formats.quantize_fp8_per_tensor(t)
            out_tensors[name], out_tensors[f"{module}.weight_scale"] = q, s
            out_tensors[f"{module}.input_scale"] = torch.tensor(0.02 + 0.01 * len(input_scales))
            input_scales[module] = out_tensors[f"{module}.input_scale"]
        else:
            out_tensors[name] = t
    out = _rewrite(src, tmp_path / "fp8t", {"quant_method": "fp8", "activation_scheme": "static"}, out_tensors)
    runner = Runner(out)
    qkv = runner.model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight_scale.shape == (qkv.weight.shape[0], 1) and len(qkv.weight_scale.unique()) == 3
    expected = max(input_scales[f"model.layers.0.self_attn.{p}"].item() for p in ("q_proj", "k_proj", "v_proj"))
    assert qkv.input_scale.item() == pytest.approx(expected)
    rel, _, _ = logit_metrics(runner.prompt_logits(PROMPTS), reference_logits(hf_model(src), PROMPTS))
    assert rel <= 0.5  # static scales chosen blindly (not calibrated): only a sanity bound
    # the same weights with dynamic (per-token) activation scales
    dynamic = {k: v for k, v in out_tensors.items() if not k.endswith("input_scale")}
    runner = Runner(_rewrite(src, tmp_path / "fp8d", {"quant_method": "fp8", "activation_scheme": "dynamic"}, dynamic))
    assert not hasattr(runner.model.model.layers[0].self_attn.qkv_proj, "input_scale")
    rel, _, _ = logit_metrics(runner.prompt_logits(PROMPTS), reference_logits(hf_model(src), PROMPTS))
    assert rel <= QUALITY_FP8


def test_compressed_tensors_block_and_quark_e8m0_checkpoints(tiny, tmp_path):
    """compressed-tensors' block strategy (scales named ``weight_scale``) and a Quark checkpoint whose
    scales are stored as F8_E8M0 load and match the formats ATOM writes."""
    src = tiny("LlamaForCausalLM")
    tensors = read_tensors(src)
    block, quark = {}, {}
    for name, t in tensors.items():
        module, _, leaf = name.rpartition(".")
        if module.split(".")[-1] in LINEARS and leaf == "weight":
            q, s = formats.quantize_fp8_blocks(t)
            block[name], block[f"{module}.weight_scale"] = q, s
            p, e = formats.quantize_mxfp4(t)
            quark[name], quark[f"{module}.weight_scale"] = p, e.view(torch.float8_e8m0fnu)
        else:
            block[name] = quark[name] = t
    group = {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "block",
                                                "block_structure": [128, 128], "symmetric": True, "dynamic": False},
             "input_activations": {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128,
                                   "dynamic": True}}
    ct = _rewrite(src, tmp_path / "ct", {"quant_method": "compressed-tensors", "format": "float-quantized",
                                         "config_groups": {"group_0": group}, "ignore": ["lm_head"]}, block)
    got = Runner(ct).prompt_logits(PROMPTS)
    want = Runner(src, quantization="fp8-block").prompt_logits(PROMPTS)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    from atom_core.quant.quantize import _mxfp4_config

    qk = _rewrite(src, tmp_path / "quark", _mxfp4_config([]), quark)
    got = Runner(qk).prompt_logits(PROMPTS)
    want = Runner(src, quantization="mxfp4").prompt_logits(PROMPTS)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_exclusions_reach_fused_layers(tiny, tmp_path):
    """An ``ignore`` list naming q/k/v (regex) and gate/up (plain names) keeps the fused layers
    unquantized; excluding only q_proj is an error naming the fused layer."""
    src = tiny("Qwen3ForCausalLM")
    tensors = read_tensors(src)
    ptpc = json.loads(json.dumps({"quant_method": "compressed-tensors", "format": "float-quantized",
                                  "config_groups": {"g": {"targets": ["Linear"],
                                                          "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                                                          "input_activations": {"num_bits": 8, "type": "float",
                                                                                "strategy": "token", "dynamic": True}}}}))
    ptpc["ignore"] = ["lm_head", r"re:.*layers\.0\.self_attn\.[qkv]_proj$", "model.layers.1.mlp.gate_proj",
                      "model.layers.1.mlp.up_proj"]
    kept = {f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")}
    kept |= {"model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"}
    out_tensors = {}
    for name, t in tensors.items():
        module, _, leaf = name.rpartition(".")
        if module.split(".")[-1] in LINEARS and leaf == "weight" and module not in kept:
            out_tensors[name], out_tensors[f"{module}.weight_scale"] = formats.quantize_fp8_per_row(t)
        else:
            out_tensors[name] = t
    runner = Runner(_rewrite(src, tmp_path / "ex", ptpc, out_tensors))
    layers = runner.model.model.layers
    assert layers[0].self_attn.qkv_proj.weight.dtype == torch.float32
    assert layers[1].self_attn.qkv_proj.weight.dtype == torch.float8_e4m3fn
    assert layers[1].mlp.gate_up_proj.weight.dtype == torch.float32
    assert layers[1].mlp.down_proj.weight.dtype == torch.float8_e4m3fn
    ptpc["ignore"] = ["model.layers.0.self_attn.q_proj"]
    bad = _rewrite(src, tmp_path / "bad", ptpc, out_tensors)
    with pytest.raises(UnsupportedQuantizationError, match=r"layers\.0\.self_attn\.qkv_proj.*fused"):
        Runner(bad)


# ------------------------------------------------------------------------------------ bad input
class _Cfg:
    def __init__(self, qcfg):
        self.quantization_config = qcfg


PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


@pytest.mark.parametrize("qcfg,message", [
    ({"quant_method": "gptq", "bits": 4}, "unsupported quantization scheme 'gptq'"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, "e5m2"),
    ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}, "dynamic activations"),
    ({"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"g": {"targets": ["Linear"]}}},
     "group 'g'.*int-quantized"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}},
     "W8A16"),
    ({"quant_method": "quark", "global_quant_config": {"weight": {"dtype": "fp8_e4m3", "qscheme": "per_tensor"}}},
     "quark global weight config"),
    ({"quant_method": "ptpc-fp8"}, "online scheme"),
])
def test_bad_configs_are_clear_errors(qcfg, message):
    with pytest.raises(UnsupportedQuantizationError, match=message):
        parse_quant_config(_Cfg(qcfg))


def test_online_on_a_quantized_checkpoint_is_an_error():
    with pytest.raises(UnsupportedQuantizationError, match="already quantized"):
        parse_quant_config(_Cfg({"quant_method": "fp8"}), online="ptpc-fp8")


def test_gpt_oss_dense_layer_must_be_excluded(tiny, tmp_path):
    src = tiny("LlamaForCausalLM")
    cfg = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}
    out = _rewrite(src, tmp_path / "oss", cfg, read_tensors(src))
    with pytest.raises(UnsupportedQuantizationError, match=r"mlp\.gate_up_proj.*MoE experts only"):
        Runner(out)
    cfg["modules_to_not_convert"].append("model.layers.*.mlp")
    ok = _rewrite(src, tmp_path / "oss-ok", cfg, read_tensors(src))
    got = Runner(ok).prompt_logits(PROMPTS[:1])[0]  # every dense layer excluded: the unquantized model
    assert torch.allclose(got, reference_logits(hf_model(src), PROMPTS[:1])[0], atol=1e-4)


def test_exclusion_pattern_rules():
    assert matches("lm_head", "lm_head")
    assert matches("model.layers.3.self_attn.q_proj", "self_attn")
    assert matches("model.layers.3.self_attn.q_proj", "model.layers.*.self_attn")  # glob on an ancestor
    assert matches("model.layers.3.mlp.down_proj", r"re:.*mlp\.down_proj$")
    assert not matches("model.layers.3.self_attn.o_proj", "proj")  # whole components only
    assert not matches("model.layers.13.mlp.down_proj", "model.layers.1.mlp")
    assert shard_names("model.layers.0.self_attn.qkv_proj", PACKED) == [
        "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj"]
    assert layer_excluded("model.layers.0.mlp.gate_up_proj", ["gate_proj", "up_proj"], PACKED)
    assert not layer_excluded("model.layers.0.mlp.gate_up_proj", ["down_proj"], PACKED)
    with pytest.raises(UnsupportedQuantizationError, match="gate_up_proj.*gate_proj.*up_proj"):
        layer_excluded("model.layers.0.mlp.gate_up_proj", ["gate_proj"], PACKED)


def test_gpt_oss_expert_layout_matches_the_dense_layout():
    from atom_core.quant.mxfp4 import gpt_oss_expert_layout

    w = torch.randn(3, 48, 128, generator=torch.Generator().manual_seed(0))  # [E, N, K]
    packed, scales = formats.quantize_mxfp4(w)  # [E, N, K/2], [E, N, K/32]
    blocks = packed.reshape(3, 48, 4, 16)  # gpt-oss stores each group's 16 bytes on a last axis
    got_packed, got_scales = gpt_oss_expert_layout(blocks, scales.view(torch.float8_e8m0fnu))
    assert torch.equal(got_packed, packed) and torch.equal(got_scales, scales)
    torch.testing.assert_close(formats.dequantize_mxfp4(got_packed, got_scales), formats.dequantize_mxfp4(packed, scales))
    with pytest.raises(UnsupportedQuantizationError, match="do not match"):
        gpt_oss_expert_layout(blocks, scales[:, :, :2])


# -------------------------------------------------------------------------- kernels in the model
