"""AITER decode conv1d (ROCm), through ``aiter.ops.triton.gated_delta_net.causal_conv1d_update_split_qkv``.

Unverified here: nobody on the team has an AMD GPU.  With ``key_dim=0`` AITER's split output is all
"value", i.e. the whole conv output; padding is AITER's ``PAD_SLOT_ID`` (hosts use -1).
"""

from __future__ import annotations

import torch


def unsupported(x, weight, bias, conv_state, slots, activation="silu", *, num_accepted_tokens=None,
                cu_seqlens=None) -> str | None:
    if x.dtype not in (torch.bfloat16, torch.float16):
        return f"aiter conv1d takes bf16/fp16, not {x.dtype}"
    if num_accepted_tokens is not None or cu_seqlens is not None:
        return "the speculative rolling conv state is not wired to aiter"
    return None


def causal_conv1d_update(x, weight, bias, conv_state, slots, activation="silu", *, num_accepted_tokens=None,
                         cu_seqlens=None):
    from aiter.ops.triton.gated_delta_net import causal_conv1d_update_split_qkv

    num_seqs = slots.shape[0]
    per_seq = x.shape[0] // num_seqs
    xs = x.view(num_seqs, per_seq, x.shape[1]).transpose(1, 2)  # [N, D, Tq]
    _, _, out = causal_conv1d_update_split_qkv(
        xs, conv_state, weight, 0, x.shape[1], bias=bias, activation=activation,
        conv_state_indices=slots.to(torch.int32), pad_slot_id=-1,
    )
    return out.transpose(1, 2).reshape(x.shape)
