"""The native host's attention: write this step's K/V into the paged cache (``atom_kernels.reshape_and_cache``), then
attend over each sequence's cached context through its block table (``atom_kernels.paged_attention``: decode and
chunked prefill alike, sliding window and gpt-oss sinks included).  On the CPU both run as their torch references."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from atom_kernels import paged_attention, reshape_and_cache

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
        k_cache, v_cache = host.kv_cache.layers[self.cache_index]  # [num_blocks, block_size, kv_heads, head_dim]
        num_tokens = q.shape[0]
        reshape_and_cache(k.view(num_tokens, self.num_kv_heads, self.head_dim),
                          v.view(num_tokens, self.num_kv_heads, self.head_dim), k_cache, v_cache, ctx.slot_mapping)
        block_table, seq_lens = ctx.paged(host.kv_cache.block_size)
        out = paged_attention(q.view(num_tokens, self.num_heads, self.head_dim), k_cache, v_cache, block_table,
                              seq_lens, ctx.query_start_loc(), self.scale, sliding_window=self.sliding_window,
                              sinks=self.sinks)
        return out.view(num_tokens, self.num_heads * self.head_dim)
