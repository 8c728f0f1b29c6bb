"""AITER rotary embedding (ROCm), through its cached-cos/sin NeoX/GPT-J kernel.

Unverified here: nobody on the team has an AMD GPU.
"""

from __future__ import annotations

import torch


def unsupported(positions, q, k, cos_sin_cache, head_size, is_neox=True) -> str | None:
    if k is None:
        return "aiter rotary needs both q and k"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"aiter rotary takes fp16/bf16, not {q.dtype}"
    if cos_sin_cache.shape[-1] != head_size:
        return "partial rotary is not wired to aiter"
    return None


def rotary_embedding(positions, q, k, cos_sin_cache, head_size, is_neox=True):
    from aiter.ops.rope import rope_cached_positions_2c_fwd_inplace

    num_tokens = positions.numel()
    half = cos_sin_cache.shape[-1] // 2
    cos, sin = cos_sin_cache.to(q.dtype).split(half, dim=-1)
    rope_cached_positions_2c_fwd_inplace(
        q.view(1, num_tokens, -1, head_size),
        k.view(1, num_tokens, -1, head_size),
        cos.unsqueeze(1).unsqueeze(1),
        sin.unsqueeze(1).unsqueeze(1),
        positions.view(1, num_tokens),
        0 if is_neox else 1,
        True,
        False,
    )
    return q, k
