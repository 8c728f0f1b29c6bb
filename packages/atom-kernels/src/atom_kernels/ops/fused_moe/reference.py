"""Plain-torch fused MoE: the specification, one expert at a time."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from atom_kernels.ops.fused_moe.weights import dequantize_expert, quantize_activation

ACTIVATIONS = ("silu", "swigluoai")
# gpt-oss' clamped SwiGLU (transformers' GptOssExperts): glu = g·σ(αg) with g ≤ limit, times (clamp(u) + 1)
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0


def activate(gate: torch.Tensor, up: torch.Tensor, activation: str, swiglu_limit: float | None = None) -> torch.Tensor:
    """The expert activation on fp32 gate and up rows (``swiglu_limit``: silu's gate clamped to at most it and
    its up to ±it first, DeepSeek-V4)."""
    if activation == "silu":
        if swiglu_limit is not None:
            gate, up = gate.clamp(max=swiglu_limit), up.clamp(-swiglu_limit, swiglu_limit)
        return F.silu(gate) * up
    gate = gate.clamp(max=SWIGLU_LIMIT)
    up = up.clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
    return gate * torch.sigmoid(SWIGLU_ALPHA * gate) * (up + 1)


def check_args(hidden, w13, w2, topk_weights, topk_ids, expert_map, quant, w13_bias=None, w2_bias=None,
               activation="silu", swiglu_limit=None) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"fused_moe: activation {activation!r} is not one of {ACTIVATIONS}")
    if swiglu_limit is not None and (activation != "silu" or not swiglu_limit > 0):
        raise ValueError(f"fused_moe: swiglu_limit {swiglu_limit!r} must be positive and goes with activation 'silu'")
    size = hidden.shape[-1]
    if w13_bias is not None and (w13_bias.dim() != 2 or w13_bias.shape[0] != w13.shape[0]):
        raise ValueError(f"fused_moe: w13_bias {tuple(w13_bias.shape)} must be [E, 2I] with E={w13.shape[0]}")
    if w2_bias is not None and tuple(w2_bias.shape) != (w2.shape[0], size):
        raise ValueError(f"fused_moe: w2_bias {tuple(w2_bias.shape)} must be [E, H] = [{w2.shape[0]}, {size}]")
    if hidden.dim() != 2:
        raise ValueError(f"fused_moe: hidden must be [tokens, hidden], got {tuple(hidden.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != hidden.shape[0] or topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"fused_moe: topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} must both be "
            f"[{hidden.shape[0]}, k]"
        )
    if w13.dim() != 3 or w2.dim() != 3 or w13.shape[0] != w2.shape[0]:
        raise ValueError(f"fused_moe: w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} must be [E, ., .] stacks")
    if quant is None:
        experts, two_inter, size = w13.shape
        if size != hidden.shape[1] or two_inter % 2 or tuple(w2.shape) != (experts, size, two_inter // 2):
            raise ValueError(
                f"fused_moe: w13 {tuple(w13.shape)} must be [E, 2I, H] and w2 {tuple(w2.shape)} [E, H, I] "
                f"with H={hidden.shape[1]}"
            )
    if expert_map is not None and expert_map.dim() != 1:
        raise ValueError(f"fused_moe: expert_map must be 1-D, got {tuple(expert_map.shape)}")


def fused_moe(hidden, w13, w2, topk_weights, topk_ids, *, expert_map=None, quant=None, config=None,
              w13_bias=None, w2_bias=None, activation="silu", swiglu_limit=None):
    check_args(hidden, w13, w2, topk_weights, topk_ids, expert_map, quant, w13_bias, w2_bias, activation, swiglu_limit)
    tokens, top_k = topk_ids.shape
    ids = topk_ids.long()
    local = expert_map.long()[ids] if expert_map is not None else ids
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    for expert in range(w13.shape[0]):
        token, slot = torch.where(local == expert)
        if token.numel() == 0:
            continue
        gate_up = dequantize_expert(w13, quant.w13_scale if quant else None, expert, quant)
        down = dequantize_expert(w2, quant.w2_scale if quant else None, expert, quant)
        x = quantize_activation(hidden[token].float(), quant)
        b13 = w13_bias[expert].float() if w13_bias is not None else None
        gate, up = F.linear(x, gate_up, b13).chunk(2, dim=-1)
        act = quantize_activation(activate(gate, up, activation, swiglu_limit).to(hidden.dtype).float(), quant)
        b2 = w2_bias[expert].float() if w2_bias is not None else None
        y = F.linear(act, down, b2) * topk_weights[token, slot].float()[:, None]
        out.index_add_(0, token, y)
    return out.to(hidden.dtype)
