"""AITER fused MoE (ROCm): ``aiter.fused_moe.fused_moe``.

Unverified here: nobody on the team has an AMD GPU.  Written against AITER's published signature
``fused_moe(hidden_states, w1 [E, 2I, H], w2 [E, H, I], topk_weight, topk_ids, expert_mask=None,
activation=ActivationType.Silu, quant_type=QuantType.No, ...)`` (fp32 weights, int32 ids).  AITER
takes expert parallelism as a 0/1 mask over global experts and numbers the local experts by their rank
among the set ones, so this wrapper requires the map ATOM's MoE layer builds (local ids in ascending
order of global ids); it passes unshuffled weights (AITER then picks its kernels for that layout).
"""

from __future__ import annotations

import torch


def unsupported(hidden, w13, w2, topk_weights, topk_ids, *, expert_map=None, quant=None, config=None,
                w13_bias=None, w2_bias=None, activation="silu", swiglu_limit=None) -> str | None:
    if w13_bias is not None or w2_bias is not None or activation != "silu" or swiglu_limit is not None:
        return "the AITER wrapper has no expert biases, clamps or activations other than silu"
    if quant is not None:
        return "the AITER wrapper has no quantized expert-weight path yet"
    if hidden.dtype not in (torch.float16, torch.bfloat16):
        return f"aiter fused_moe takes fp16/bf16, not {hidden.dtype}"
    return None


def fused_moe(hidden, w13, w2, topk_weights, topk_ids, *, expert_map=None, quant=None, config=None,
              w13_bias=None, w2_bias=None, activation="silu", swiglu_limit=None):
    from aiter import ActivationType, QuantType
    from aiter.fused_moe import fused_moe as aiter_fused_moe

    expert_mask = (expert_map >= 0).to(torch.int32) if expert_map is not None else None
    return aiter_fused_moe(
        hidden.contiguous(), w13, w2, topk_weights.to(torch.float32), topk_ids.to(torch.int32),
        expert_mask=expert_mask, activation=ActivationType.Silu, quant_type=QuantType.No,
    )
