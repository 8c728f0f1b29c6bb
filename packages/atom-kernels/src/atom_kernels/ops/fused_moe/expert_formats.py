"""Quantized expert-weight formats of :func:`fused_moe` (registered on import; plain torch).

* ``fp8-block``: ``w13 [E, 2I, H]`` / ``w2 [E, H, I]`` float8_e4m3fn with block scales
  ``w13_scale [E, 2I/bn, ceil(H/bk)]`` (gate blocks, then up blocks: I a multiple of bn, as vLLM also
  requires) and ``w2_scale [E, ceil(H/bn), ceil(I/bk)]`` fp32 (DeepSeek-V3 / Qwen3-FP8
  ``weight_scale_inv``); activations are quantized per token per ``bk`` columns (``act_dtype`` fp8)
  before each GEMM.
* ``mxfp4``: ``w13 [E, 2I, H/2]`` / ``w2 [E, H, I/2]`` uint8 (two e2m1 codes per byte, low nibble
  first) with e8m0 scales ``w13_scale [E, 2I, H/32]`` / ``w2_scale [E, H, I/32]``; weight-only.

Each format has a dequantizer (one expert's weight as fp32) and, for formats that quantize
activations, the activation rounding the reference applies before each GEMM.
"""

from __future__ import annotations

import torch

from atom_kernels import formats
from atom_kernels.ops.fused_moe.weights import ExpertQuant, register_expert_format


def _fp8_block_weight(weight: torch.Tensor, scale: torch.Tensor, quant: ExpertQuant) -> torch.Tensor:
    return formats.dequantize_fp8_blocks(weight, scale, tuple(quant.block_shape))


def _fp8_block_activation(x: torch.Tensor, quant: ExpertQuant) -> torch.Tensor:
    group = quant.block_shape[1]
    q, s = formats.quantize_fp8_per_group(x, group)
    return q.float() * s.repeat_interleave(group, dim=-1)[..., : x.shape[-1]]


def _mxfp4_weight(weight: torch.Tensor, scale: torch.Tensor, quant: ExpertQuant) -> torch.Tensor:
    return formats.dequantize_mxfp4(weight, scale)


register_expert_format("fp8-block", _fp8_block_weight, activation=_fp8_block_activation)
register_expert_format("mxfp4", _mxfp4_weight)
