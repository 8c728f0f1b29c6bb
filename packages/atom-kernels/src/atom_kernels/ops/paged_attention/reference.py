"""Plain-torch paged attention: the specification, one sequence at a time (reads lengths on the host)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_paged_args(q, k_cache, v_cache, block_table, seq_lens, query_start_loc) -> None:
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(f"paged_attention: q {tuple(q.shape)} must be [T, H, D] and k/v caches "
                         f"{tuple(k_cache.shape)} / {tuple(v_cache.shape)} [num_blocks, block_size, kv_heads, D]")
    if q.shape[-1] != k_cache.shape[-1] or q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"paged_attention: q {tuple(q.shape)} and cache {tuple(k_cache.shape)} disagree on the head "
                         "dim, or H is not a multiple of kv_heads")
    batch = block_table.shape[0]
    if block_table.dim() != 2 or tuple(seq_lens.shape) != (batch,) or tuple(query_start_loc.shape) != (batch + 1,):
        raise ValueError(f"paged_attention: block_table {tuple(block_table.shape)} must be [B, max_blocks], seq_lens "
                         f"{tuple(seq_lens.shape)} [B] and query_start_loc {tuple(query_start_loc.shape)} [B + 1]")


def _scale(scale) -> torch.Tensor | float:
    return 1.0 if scale is None else (scale.float().reshape(()) if isinstance(scale, torch.Tensor) else float(scale))


def paged_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, *, sliding_window=None,
                    sinks=None, soft_cap=None, k_scale=None, v_scale=None):
    check_paged_args(q, k_cache, v_cache, block_table, seq_lens, query_start_loc)
    heads, dim = q.shape[1], q.shape[2]
    page, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    out = torch.zeros_like(q)
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for b, context in enumerate(lens):
        first, last = starts[b], starts[b + 1]
        n = last - first
        if n == 0:
            continue
        if context < n:
            raise ValueError(f"paged_attention: sequence {b} has {n} queries but a context of {context} tokens")
        blocks = block_table[b, : -(-context // page)].long()
        k = k_cache[blocks].reshape(-1, kv_heads, dim)[:context].float() * _scale(k_scale)
        v = v_cache[blocks].reshape(-1, kv_heads, dim)[:context].float() * _scale(v_scale)
        q_pos = torch.arange(context - n, context, device=q.device)[:, None]
        k_pos = torch.arange(context, device=q.device)[None, :]
        visible = k_pos <= q_pos
        if sliding_window is not None:
            visible &= q_pos - k_pos < sliding_window
        if sinks is None and soft_cap is None:  # plain softmax attention: torch's own, in fp32
            o = F.scaled_dot_product_attention(q[first:last].float().transpose(0, 1)[None], k.transpose(0, 1)[None],
                                               v.transpose(0, 1)[None], attn_mask=visible, scale=scale, enable_gqa=True)
            out[first:last] = o[0].transpose(0, 1).to(q.dtype)
            continue
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [S, H, D]
        s = torch.einsum("qhd,khd->hqk", q[first:last].float(), k) * scale
        if soft_cap is not None:
            s = torch.tanh(s / soft_cap) * soft_cap
        s = s.masked_fill(~visible, float("-inf"))
        if sinks is not None:
            s = torch.cat([s, sinks.float().view(heads, 1, 1).expand(heads, n, 1)], dim=-1)
        p = torch.softmax(s, dim=-1)[..., :context]  # the sink column takes its share and is dropped
        out[first:last] = torch.einsum("hqk,khd->qhd", p, v).to(q.dtype)
    return out
