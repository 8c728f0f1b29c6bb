"""AITER causal conv1d prefill (ROCm), through
``aiter.ops.triton.gated_delta_net.causal_conv1d_split_qkv_triton_fn``.

Unverified here: nobody on the team has an AMD GPU.  AITER's kernel splits its output into q/k/v; with
``k_dim=0`` every channel lands in the "v" part, which is the whole output.  It needs the sequence
lengths on the host (a sync) and marks padding with its ``PAD_SLOT_ID``.
"""

from __future__ import annotations

import torch


def unsupported(x, weight, bias, conv_state, cu_seqlens, slots, has_initial_state=None, activation="silu") -> str | None:
    if x.dtype not in (torch.bfloat16, torch.float16):
        return f"aiter conv1d takes bf16/fp16, not {x.dtype}"
    if activation not in ("silu", None):
        return f"activation {activation!r}"
    return None


def causal_conv1d(x, weight, bias, conv_state, cu_seqlens, slots, has_initial_state=None, activation="silu"):
    from aiter.ops.triton.gated_delta_net import causal_conv1d_split_qkv_triton_fn

    seq_lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    init = has_initial_state if has_initial_state is not None else torch.zeros_like(slots, dtype=torch.bool)
    _, _, out = causal_conv1d_split_qkv_triton_fn(
        x.t(), weight, bias, conv_state, cu_seqlens.to(torch.int32), seq_lens, 0, x.shape[1],
        cache_indices=slots.to(torch.int32), has_initial_state=init, activation=activation,
    )
    return out
