"""The native host's DeepSeek-V4 compressed attention (CSA and HCA layers, :class:`atom_core.host.CompressedAttentionSpec`).

Everything lives in the layer's paged cache, per token, written through the step's slot mapping and read through
its block table:

    K row = [ kv | entry ]                 the token's shared key/value; the compressed entry of the window that
                                           ends at this token (zero elsewhere)
    V row = [ kv_raw | gate_raw | (index kv_raw | index gate_raw | index key) ]
                                           the compressor's projections (the partial window waiting to be pooled)
                                           and, on a CSA layer, the indexer's and its pooled index key

Every step, prompt or decode:

    entry(p)  = compressor.pool(raw rows of the window ending at p)           where (p + 1) % m == 0
    selected  = CSA: topk_indices(indexer_scores(index_q, weights, index keys) on entry positions, topk)
                HCA: every entry position <= p
    out       = sparse_mla(q, K rows of the kv of positions p - W + 1 .. p and of the selected entries, sinks)

Entries live at the position of their window's last token, so "query p has passed window w" is "entry position
<= p": the causal rule of the other caches.  Selection and attention are DeepSeek-V3.2's ops (``indexer_scores``,
``topk_indices``, ``sparse_mla`` over whole rows with sinks); the compressor's pooling is the model's torch.  The
cache keeps every token's rows, which a cache sized for DeepSeek-V4 would not (see docs/verification.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from atom_core.host import CompressedAttentionSpec
from atom_core.runtime.sparse_attention import selected_slots, token_positions
from atom_kernels import indexer_scores, reshape_and_cache, sparse_mla, topk_indices

if TYPE_CHECKING:
    from atom_core.runtime.host import NativeHost


class CompressedAttention(nn.Module):
    def __init__(self, host: NativeHost, cache_index: int, num_heads: int, head_dim: int, scale: float,
                 sliding_window: int, sinks: torch.Tensor, spec: CompressedAttentionSpec):
        super().__init__()
        self._host = [host]  # a list keeps the host out of the module tree
        self.cache_index = cache_index
        self.num_heads, self.head_dim, self.scale = num_heads, head_dim, scale
        self.sliding_window, self.sinks = sliding_window, sinks
        self.spec = spec
        self.rate = spec.compress_rate
        self.window = 2 * self.rate if spec.overlap else self.rate  # tokens one entry pools
        index = spec.indexer
        index_width = 2 * index.raw_dim + index.head_dim if index is not None else 0
        self.kv_shapes = ((1, 2 * head_dim), (1, 2 * spec.raw_dim + index_width))

    def forward(self, q: torch.Tensor, kv: torch.Tensor, compress: tuple[torch.Tensor, torch.Tensor],
                index: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        host = self._host[0]
        ctx = host.context
        if ctx is None:
            raise RuntimeError("native attention called outside a runner step (no StepContext set)")
        if (index is not None) != (self.spec.indexer is not None):
            raise RuntimeError("a compressed attention layer takes the indexer's projections exactly when it has one")
        k_cache, v_cache = host.kv_cache.layers[self.cache_index]  # [blocks, bs, 1, 2D], [blocks, bs, 1, V]
        tokens, dim, raw = q.shape[0], self.head_dim, self.spec.raw_dim
        block_size = k_cache.shape[1]
        block_table, seq_lens = ctx.paged(block_size)
        token_seq, token_pos = token_positions(ctx.query_start_loc(), seq_lens, tokens)
        # 1. this step's per-token rows, entries still zero
        v_rows = [*compress] + ([index[1], index[2], index[1].new_zeros(tokens, self.spec.indexer.head_dim)]
                                if index is not None else [])
        k_row = torch.cat([kv, torch.zeros_like(kv)], dim=-1).view(tokens, 1, -1)
        v_row = torch.cat(v_rows, dim=-1).view(tokens, 1, -1).to(v_cache.dtype)
        reshape_and_cache(k_row.to(k_cache.dtype), v_row, k_cache, v_cache, ctx.slot_mapping)
        # 2. the entries of the windows this step's tokens close, pooled from the cached rows of their windows
        pos = token_pos.long()
        closes = (pos >= 0) & ((pos + 1) % self.rate == 0)
        window_pos = pos[:, None] - self.window + 1 + torch.arange(self.window, device=pos.device)
        window_rows = v_cache[:, :, 0].reshape(-1, v_cache.shape[-1])[
            selected_slots(window_pos, block_table, token_seq, block_size).long().clamp(min=0)]
        valid = window_pos >= 0
        start = pos - self.rate + 1
        entry = self.spec.compressor.pool(window_rows[..., :raw], window_rows[..., raw:2 * raw], valid, start)
        k_row = torch.cat([kv, torch.where(closes[:, None], entry.to(kv.dtype), 0.0)], dim=-1)
        if index is not None:
            spec = self.spec.indexer
            first = 2 * raw
            index_key = spec.compressor.pool(window_rows[..., first:first + spec.raw_dim],
                                             window_rows[..., first + spec.raw_dim:first + 2 * spec.raw_dim], valid,
                                             start)
            v_rows[-1] = torch.where(closes[:, None], index_key.to(v_rows[-1].dtype), 0.0)
            v_row = torch.cat(v_rows, dim=-1).view(tokens, 1, -1).to(v_cache.dtype)
        reshape_and_cache(k_row.view(tokens, 1, -1).to(k_cache.dtype), v_row, k_cache, v_cache, ctx.slot_mapping)
        # 3. the keys of each query: its sliding window, then the entries it selects
        win_pos = pos[:, None] - self.sliding_window + 1 + torch.arange(self.sliding_window, device=pos.device)
        win_pos = torch.where(win_pos >= 0, win_pos, -1)
        entry_pos = self._selected_entries(index, v_cache, block_table, token_seq, token_pos, pos)
        # the K cache read as rows of one head: slot s's kv is row 2s, its entry row 2s + 1
        rows = k_cache.view(k_cache.shape[0], 2 * block_size, dim)
        win_slots = selected_slots(win_pos, block_table, token_seq, block_size)
        entry_slots = selected_slots(entry_pos, block_table, token_seq, block_size)
        slots = torch.cat([torch.where(win_slots >= 0, 2 * win_slots, -1),
                           torch.where(entry_slots >= 0, 2 * entry_slots + 1, -1)], dim=1)
        slots = torch.where((pos >= 0)[:, None], slots, -1).to(torch.int32)
        return sparse_mla(q.contiguous(), rows, slots, self.scale, dim, self.sinks)

    def _selected_entries(self, index, v_cache, block_table, token_seq, token_pos, pos) -> torch.Tensor:
        """``[T, K]`` positions of the entries each query attends to (-1: none)."""
        context = block_table.shape[1] * v_cache.shape[1]
        if index is None:  # HCA: every entry whose window the query has passed
            ends = torch.arange(self.rate - 1, context, self.rate, device=pos.device)
            return torch.where(ends[None, :] <= pos[:, None], ends[None, :], -1)
        spec = self.spec.indexer
        index_q, _, _, weights = index
        keys = v_cache[:, :, 0, -spec.head_dim:]
        scores = indexer_scores(index_q.contiguous(), weights, keys, block_table, token_seq, token_pos, spec.scale)
        columns = torch.arange(scores.shape[1], device=scores.device)
        scores = scores.masked_fill(((columns + 1) % self.rate != 0)[None, :], float("-inf"))  # entry positions only
        return topk_indices(scores, spec.topk).long()
