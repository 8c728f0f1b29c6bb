"""The native host's attention: write this step's K/V into the paged cache, then attend over each
sequence's cached context (plain torch; the native host is for running and testing, not serving)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from atom_core.runtime.host import NativeHost


class PagedAttention(nn.Module):
    def __init__(self, host: NativeHost, cache_index: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 scale: float, sliding_window: int | None, sinks: torch.Tensor | None):
        super().__init__()
        self._host = [host]  # a list keeps the host out of the module tree
        self.cache_index = cache_index
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        self.sinks = sinks
        self.kv_shapes = ((num_kv_heads, head_dim), (num_kv_heads, head_dim))  # K and V cache, per slot

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        host = self._host[0]
        ctx = host.context
        if ctx is None:
            raise RuntimeError("native attention called outside a runner step (no StepContext set)")
        k_cache, v_cache = host.kv_cache.layers[self.cache_index]
        num_tokens = q.shape[0]
        valid = ctx.slot_mapping >= 0
        slots = ctx.slot_mapping[valid]
        k_cache[slots] = k.view(num_tokens, self.num_kv_heads, self.head_dim)[valid].to(k_cache.dtype)
        v_cache[slots] = v.view(num_tokens, self.num_kv_heads, self.head_dim)[valid].to(v_cache.dtype)

        batch, width = ctx.batch_size, ctx.max_query_len
        q_pad = q.new_zeros(batch * width, self.num_heads, self.head_dim)
        q_pad[ctx.token_index()] = q.view(num_tokens, self.num_heads, self.head_dim)
        q_pad = q_pad.view(batch, width, self.num_heads, self.head_dim).transpose(1, 2)
        keys = k_cache[ctx.slot_table].transpose(1, 2).to(q.dtype)  # [B, kvh, S, d]
        values = v_cache[ctx.slot_table].transpose(1, 2).to(q.dtype)
        mask = ctx.mask(self.sliding_window)
        if self.sinks is None:
            out = F.scaled_dot_product_attention(q_pad, keys, values, attn_mask=mask, scale=self.scale, enable_gqa=True)
        else:
            out = _attention_with_sinks(q_pad, keys, values, mask, self.scale, self.sinks)
        out = out.transpose(1, 2).reshape(batch * width, self.num_heads * self.head_dim)
        return out[ctx.token_index()]


def _attention_with_sinks(q, k, v, mask, scale, sinks):
    """Softmax over the keys plus one learned per-head "sink" logit that absorbs probability mass."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    return (probs @ v.float()).to(q.dtype)
