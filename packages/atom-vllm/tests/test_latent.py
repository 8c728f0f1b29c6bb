"""atom-core's ``kv_b_proj`` as vLLM's MLA layer sees it (:class:`atom_vllm.latent.LatentProjection`), in this
process against the installed vLLM's own dequantization (``get_and_maybe_dequant_weights``, which
MLAAttention uses to split ``W_UK``/``W_UV`` after loading): an FP8 block-quantized projection comes out as
atom-kernels' dequantization of its blocks, an unquantized one as its weight."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from atom_core.host import SingleRank
from atom_core.layers.linear import ColumnParallelLinear
from atom_core.quant.fp8 import Fp8Config
from atom_kernels import formats
from atom_vllm.latent import LatentProjection

KV_LORA_RANK, HEADS, NOPE, V = 256, 4, 32, 48  # out = 320 features: the last row block of 128 is partial
BLOCK = (128, 128)
# fp8_block_mm multiplies each identity row's FP8 value (448) by its scale (1/448 rounded to fp32): one rounding
# of fp32 off the exact product of the weight's block value and scale
REL_TOL = 2e-7


def kv_b_proj(quant) -> ColumnParallelLinear:
    host = SimpleNamespace(tp=SingleRank(), quant=quant)
    return ColumnParallelLinear(KV_LORA_RANK, [HEADS * (NOPE + V)], host=host, prefix="model.layers.0.self_attn.kv_b_proj")


def vllm_dequantized(module: torch.nn.Module, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    from vllm.model_executor.layers.quantization.utils.quant_utils import get_and_maybe_dequant_weights

    return get_and_maybe_dequant_weights(module, out_dtype=dtype)


@torch.no_grad()
def test_fp8_block_kv_b_proj_dequantizes_as_atom_core():
    torch.manual_seed(0)
    linear = kv_b_proj(Fp8Config("dynamic", BLOCK, []))
    q, scale_inv = formats.quantize_fp8_blocks(torch.randn(HEADS * (NOPE + V), KV_LORA_RANK) * 0.05, BLOCK)
    linear.weight.copy_(q)
    linear.weight_scale_inv.copy_(scale_inv)
    want = formats.dequantize_fp8_blocks(q, scale_inv, BLOCK)
    got = vllm_dequantized(LatentProjection(linear))
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=REL_TOL, atol=0)
    assert not torch.equal(got, q.float()), "the scales were not applied"


@torch.no_grad()
def test_unquantized_kv_b_proj_is_its_weight():
    torch.manual_seed(1)
    linear = kv_b_proj(None)
    linear.weight.copy_(torch.randn_like(linear.weight))
    assert torch.equal(vllm_dequantized(LatentProjection(linear)), linear.weight)


@torch.no_grad()
def test_call_convention_and_attributes():
    """What vLLM's MLA code reads and calls: ``(out, None)``, the input width, the stored weight (read live, so a
    scheme that swaps the parameter after loading is seen), and a replacement of ``weight`` (vLLM's AMX backend
    releases the raw weight that way)."""
    torch.manual_seed(2)
    linear = kv_b_proj(None)
    linear.weight.copy_(torch.randn_like(linear.weight))
    proj = LatentProjection(linear)
    x = torch.randn(3, KV_LORA_RANK)
    out, bias = proj(x)
    assert bias is None and torch.equal(out, linear(x))
    assert proj.input_size_per_partition == KV_LORA_RANK and proj.params_dtype == torch.get_default_dtype()
    assert list(proj.parameters()) == [], "the model owns (and loads) kv_b_proj's parameters"
    linear.weight = torch.nn.Parameter(linear.weight.data.clone(), requires_grad=False)
    assert proj.weight is linear.weight
    released = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    proj.weight = released
    assert proj.weight is released and linear.weight.numel() > 0


@torch.no_grad()
def test_fp8_input_is_widened():
    """vLLM's FP8 prefill casts the latents to the weight's FP8 dtype before calling kv_b_proj; atom-core's layer
    gets them in the activation dtype."""
    torch.manual_seed(3)
    linear = kv_b_proj(None)
    linear.weight.copy_(torch.randn_like(linear.weight))
    x = torch.randn(2, KV_LORA_RANK).to(torch.float8_e4m3fn)
    out, _ = LatentProjection(linear)(x)
    assert out.dtype == torch.get_default_dtype() and torch.equal(out, linear(x.to(out.dtype)))
