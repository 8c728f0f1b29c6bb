"""DeepSeek-V3 (multi-head latent attention) against transformers' ``DeepseekV3ForCausalLM``.

* Parity (fp32, CPU; ``parity.check_model``: prefill logits within 1e-4, greedy tokens, decode log-probabilities)
  on tiny random checkpoints: q LoRA with YaRN (mscale folded into the softmax scale), 2 dense layers + a sparse
  one, 4 groups of experts (2 kept) with a random correction bias; then a plain q_proj, NeoX rope, no YaRN.
* The native host caches one latent per token (no per-head K/V) and decode steps take the absorbed form, which
  equals the expanded form.
* FP8 block-128 checkpoints: ATOM on the FP8 checkpoint against transformers on its dequantized weights.
* MXFP4 (AMD Quark, as Kimi-K2.5-MXFP4 ships its experts; here every projection, kv_b_proj included, written
  by ``atom quantize``): against transformers on the dequantized weights, and close to the unquantized model.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import hf_model, with_random_correction_bias
from parity import PROMPTS, check_model, reference_logits
from quant_helpers import logit_metrics, read_tensors, reference_with_quantized_weights, rewrite_checkpoint

from atom_core.runtime.latent_attention import LatentAttention
from atom_kernels import formats

ARCH = "DeepseekV3ForCausalLM"
EXACT_REL_TOL = 1e-5  # relative logit error against the reference run with the same quantized arithmetic in fp32
FP8_QUALITY = (0.15, 0.75)  # (max relative logit error, min top-1 agreement) against the unquantized model
MXFP4_QUALITY = (0.4, 0.4)  # measured 0.33 / 0.59 on the tiny checkpoint (random weights, 4-bit)


@pytest.fixture(scope="session")
def deepseek_dir(tiny, tmp_path_factory):
    def build(**overrides) -> str:
        key = "-".join(f"{k}{v}" for k, v in sorted(overrides.items())) or "default"
        return with_random_correction_bias(tiny(ARCH, **overrides), tmp_path_factory.getbasetemp() / f"dsv3-{key}")

    return build


def test_fp32_cpu_parity_q_lora_yarn(deepseek_dir):
    model_dir = deepseek_dir()
    runner = check_model(model_dir, hf_model(model_dir))
    layers = [m for m in runner.model.modules() if isinstance(m, LatentAttention)]
    assert len(layers) == 3
    cache, values = runner.host.kv_cache.layers[0]
    assert cache.shape[2:] == (1, 64 + 16) and values.numel() == 0  # kv_lora_rank + qk_rope_head_dim, no V


def test_fp32_cpu_parity_plain_q_neox_rope(deepseek_dir):
    model_dir = deepseek_dir(q_lora_rank=None, rope_interleave=False, n_group=1, topk_group=1,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    check_model(model_dir, hf_model(model_dir), max_new_tokens=4)


def test_absorbed_decode_equals_expanded(deepseek_dir, monkeypatch):
    """A decode step through the absorbed form gives the logits the expanded form gives for the same tokens."""
    from atom_core.runtime.runner import Runner
    from atom_core.runtime.sampler import SamplingParams

    model_dir = deepseek_dir()
    prompt = [5, 17, 99, 3, 200, 41, 7]
    runner = Runner(model_dir, device="cpu", dtype=torch.float32)
    out = runner.generate([prompt], SamplingParams(max_new_tokens=4, ignore_eos=True))[0]
    # the whole sequence as one prompt: every position through the expanded form
    full = runner.prompt_logits([prompt + out.token_ids[:-1]])[0]
    expanded = torch.log_softmax(full[len(prompt) - 1 :].float(), dim=-1)
    chosen = expanded[torch.arange(len(out.token_ids)), torch.tensor(out.token_ids)]
    assert torch.allclose(torch.tensor(out.logprobs), chosen, atol=1e-4)


def _fp8_block_checkpoint(src: str, dst: Path, ignored: tuple[str, ...] = ()) -> str:
    """The checkpoint with its projections (experts and kv_b_proj included) quantized to FP8 in 128x128 blocks,
    as DeepSeek publishes it, except the modules ``ignored`` names (listed in ``ignored_layers``)."""
    tensors = read_tensors(src)
    for name in [n for n in tensors if n.endswith(("proj.weight", "proj_with_mqa.weight"))]:
        if not any(f".{module}." in name for module in ignored):
            tensors[name], tensors[f"{name}_scale_inv"] = formats.quantize_fp8_blocks(tensors[name])
    config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
              "ignored_layers": list(ignored)}
    return rewrite_checkpoint(src, dst, config, tensors)


@pytest.mark.parametrize("quantized,ignored", [("self_attn", "mlp"), ("mlp", "self_attn")])
def test_fp8_block_layers_match_dequantized_reference(deepseek_dir, tmp_path, quantized, ignored):
    """FP8 attention projections (kv_b_proj absorbed from its dequantized blocks), or FP8 dense, shared and routed
    experts, against transformers on the dequantized weights with the same FP8 activation rounding (per token,
    per 128 columns).  One part at a time: with both, a 1e-7 difference upstream flips an FP8 rounding
    downstream now and then, which no bound can tell from a bug."""
    from atom_core.runtime.runner import Runner

    src = deepseek_dir(moe_intermediate_size=128)  # gate|up shards on the 128-row blocks, as real checkpoints have
    out = _fp8_block_checkpoint(src, tmp_path / "fp8", ignored=(ignored,))
    runner = Runner(out, device="cpu", dtype=torch.float32)
    want = reference_logits(reference_with_quantized_weights(hf_model(src), out, "fp8-block"), PROMPTS)
    rel, max_abs, _ = logit_metrics(runner.prompt_logits(PROMPTS), want)
    assert rel <= EXACT_REL_TOL, f"relative logit error {rel:.2e} (max {max_abs:.2e})"
    if quantized == "self_attn":
        kv_b = runner.model.model.layers[0].self_attn.kv_b_proj
        assert kv_b.weight.numel() == 0  # the quantized kv_b_proj is released once absorbed


def test_fp8_block_checkpoint_quality(deepseek_dir, tmp_path):
    """Everything FP8, as published: close to the unquantized model."""
    from atom_core.runtime.runner import Runner

    src = deepseek_dir(moe_intermediate_size=128)
    atom = Runner(_fp8_block_checkpoint(src, tmp_path / "fp8"), device="cpu", dtype=torch.float32).prompt_logits(PROMPTS)
    rel, _, top1 = logit_metrics(atom, reference_logits(hf_model(src), PROMPTS))
    assert rel <= FP8_QUALITY[0] and top1 >= FP8_QUALITY[1], f"relative error {rel:.3f}, top-1 agreement {top1:.3f}"


def test_mxfp4_checkpoint(deepseek_dir, tmp_path):
    from atom_core.quant.quantize import quantize_checkpoint
    from atom_core.runtime.runner import Runner

    src = deepseek_dir()
    out = str(quantize_checkpoint(src, tmp_path / "mxfp4", "mxfp4"))
    runner = Runner(out, device="cpu", dtype=torch.float32)
    assert runner.model.model.layers[2].mlp.experts.w13_weight.dtype == torch.uint8  # the experts are MXFP4
    atom = runner.prompt_logits(PROMPTS)
    want = reference_logits(reference_with_quantized_weights(hf_model(src), out, "mxfp4"), PROMPTS)
    rel, max_abs, _ = logit_metrics(atom, want)
    assert rel <= EXACT_REL_TOL, f"vs the dequantized reference: relative logit error {rel:.2e} (max {max_abs:.2e})"
    rel, _, top1 = logit_metrics(atom, reference_logits(hf_model(src), PROMPTS))
    assert rel <= MXFP4_QUALITY[0] and top1 >= MXFP4_QUALITY[1], f"relative error {rel:.3f}, top-1 agreement {top1:.3f}"


def test_multi_token_prediction_layer_is_skipped(deepseek_dir, tmp_path):
    """Published checkpoints carry the MTP head as layer ``num_hidden_layers``: loaded past, not run."""
    import json

    from safetensors.torch import save_file

    from atom_core.runtime.runner import Runner

    src = Path(deepseek_dir())
    dst = tmp_path / "mtp"
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (dst / "config.json").write_text(json.dumps(config))
    save_file({"model.layers.3.eh_proj.weight": torch.zeros(256, 512),
               "model.layers.3.self_attn.kv_b_proj.weight": torch.zeros(320, 64)}, str(dst / "mtp.safetensors"))
    index = {"metadata": {}, "weight_map": {name: "model.safetensors" for name in read_tensors(str(src))}}
    index["weight_map"].update({"model.layers.3.eh_proj.weight": "mtp.safetensors",
                                "model.layers.3.self_attn.kv_b_proj.weight": "mtp.safetensors"})
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    got = Runner(str(dst), device="cpu", dtype=torch.float32).prompt_logits(PROMPTS[:1])
    want = Runner(str(src), device="cpu", dtype=torch.float32).prompt_logits(PROMPTS[:1])
    assert torch.equal(got[0], want[0])
