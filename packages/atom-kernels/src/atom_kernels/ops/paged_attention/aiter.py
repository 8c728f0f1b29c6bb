"""AITER paged attention (ROCm), through ``aiter.flash_attn_varlen_func`` with a block table.

Unverified here: nobody on the team has an AMD GPU, so neither this wrapper nor AITER's argument conventions as
written below have run (public callers pass ``window_size`` as a 3-tuple and ``block_table`` for paged K/V; which
page sizes its paged path takes is not known here).  FlashAttention's varlen API wants ``cu_seqlens_k`` (built on the
device from seq_lens) and Python-int maxima for its grid; the wrapper passes upper bounds from shapes (T queries, the
block table's width in tokens) so nothing is read on the host.  Sinks, soft-cap, fp8 caches and scales fall back to
the Triton kernel.
"""

from __future__ import annotations

import torch


def unsupported(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, *, sliding_window=None,
                sinks=None, soft_cap=None, k_scale=None, v_scale=None) -> str | None:
    if q.dtype not in (torch.bfloat16, torch.float16) or k_cache.dtype != q.dtype:
        return f"aiter paged attention takes bf16/fp16 q and caches of q's dtype, not {q.dtype}/{k_cache.dtype}"
    if sinks is not None or soft_cap is not None or k_scale is not None or v_scale is not None:
        return "aiter paged attention: no sinks, soft-cap or cache scales"
    return None


def paged_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, *, sliding_window=None,
                    sinks=None, soft_cap=None, k_scale=None, v_scale=None):
    from aiter import flash_attn_varlen_func

    cu_k = torch.zeros(seq_lens.shape[0] + 1, dtype=torch.int32, device=q.device)
    torch.cumsum(seq_lens.to(torch.int32), 0, out=cu_k[1:])
    window = (-1, -1, 0) if sliding_window is None else (sliding_window - 1, 0, 0)
    out = flash_attn_varlen_func(
        q, k_cache, v_cache, query_start_loc.to(torch.int32), cu_k, q.shape[0], block_table.shape[1] * k_cache.shape[1],
        softmax_scale=scale, causal=True, window_size=window, block_table=block_table.to(torch.int32),
    )
    return out[0] if isinstance(out, (tuple, list)) else out
