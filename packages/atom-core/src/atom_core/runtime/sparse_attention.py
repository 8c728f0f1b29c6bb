"""The native host's DeepSeek sparse attention (DeepSeek-V3.2, GLM-5): latent attention in which each query reads
only the ``topk`` cached tokens its lightning indexer scores highest.

Each layer's paged cache holds the token's latent ``kv_c | k_pe`` (as :mod:`atom_core.runtime.latent_attention`)
and, in the V slot beside it, the token's indexer key; both are written through the same slot mapping and read
through the same block table.  Every step, prompt or decode, runs:

    scores    = indexer_scores(index_q, weights, index keys of the sequence)    [T, context], -inf past each query
    positions = topk_indices(scores, topk)                                       [T, topk], -1 past the context
    out       = sparse_mla(absorbed q, latent cache, slots of those positions)   (W_UK before, W_UV after)

A layer without its own indexer (GLM-5's shared layers) reuses the positions the last layer with one chose in
this step.  Nothing here reads lengths on the host, so a decode graph can capture it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from atom_core.host import LatentAttentionSpec
from atom_core.runtime.latent_attention import LatentAttention
from atom_kernels import indexer_scores, reshape_and_cache, sparse_mla, topk_indices

if TYPE_CHECKING:
    from atom_core.runtime.host import NativeHost


def token_positions(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, num_tokens: int):
    """``(token_seq, token_pos)`` int32 of the step's packed tokens: each token's sequence and its position there
    (a padding row of ``seq_lens`` 0 gives position -1, which sees nothing)."""
    t = torch.arange(num_tokens, device=seq_lens.device)
    seq = torch.searchsorted(query_start_loc[1:].long(), t, right=True).clamp(max=seq_lens.shape[0] - 1)
    pos = seq_lens.long()[seq] - (query_start_loc.long()[seq + 1] - t)
    return seq.to(torch.int32), pos.to(torch.int32)


def selected_slots(positions: torch.Tensor, block_table: torch.Tensor, token_seq: torch.Tensor,
                   block_size: int) -> torch.Tensor:
    """The cache slots of the selected positions ``[T, k]`` (-1 stays -1)."""
    pos = positions.long()
    safe = pos.clamp(min=0)
    blocks = block_table.long()[token_seq.long()].gather(1, safe // block_size)
    return torch.where(pos >= 0, blocks * block_size + safe % block_size, -1).to(torch.int32)


class SparseLatentAttention(LatentAttention):
    def __init__(self, host: NativeHost, cache_index: int, num_heads: int, scale: float, mla: LatentAttentionSpec):
        super().__init__(host, cache_index, num_heads, scale, mla)
        self.sparse = mla.sparse
        index_dim = self.sparse.index_head_dim if self.sparse.own_indexer else 0
        self.kv_shapes = ((1, self.kv_lora_rank + self.rope_dim), (1, index_dim))  # latent; indexer key beside it

    def forward(self, q: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor,
                index: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        host = self._host[0]
        ctx = self._step_context()
        cache, index_cache = host.kv_cache.layers[self.cache_index]  # [blocks, bs, 1, latent], [blocks, bs, 1, index]
        block_table, seq_lens = ctx.paged(cache.shape[1])
        out, host.sparse_selection = sparse_step(self, q, kv_c, k_pe, index, cache, index_cache, ctx.slot_mapping,
                                                 block_table, seq_lens, ctx.query_start_loc(), host.sparse_selection)
        return out


def sparse_step(layer: LatentAttention, q: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor,
                index: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None, cache: torch.Tensor,
                index_cache: torch.Tensor, slot_mapping: torch.Tensor, block_table: torch.Tensor,
                seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                selection: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of ``layer`` (its ``sparse`` spec, ``w_uk`` / ``w_uv``, dims and scale) over a host's paged caches:
    ``cache`` ``[blocks, block_size, 1, latent]`` and ``index_cache`` ``[blocks, block_size, 1, index_head_dim]``
    (any strides; both addressed by ``slot_mapping`` / ``block_table``).  Writes the step's latents (and indexer
    keys) at ``slot_mapping`` (one slot per token: tokens past it are padding, not written), selects with the
    layer's own indexer or reuses ``selection`` (a shared layer), and returns (``[T, H * v_head_dim]``, the
    selection ``[T, topk]`` the step used)."""
    sparse = layer.sparse
    if (index is not None) != sparse.own_indexer:
        raise RuntimeError("a sparse attention layer takes the indexer's (q, k, weights) exactly when it has its own "
                           "indexer")
    num_tokens, heads = q.shape[0], layer.num_heads
    written = slot_mapping.shape[0]
    latent = torch.cat([kv_c, k_pe], dim=-1).view(num_tokens, 1, -1)
    if index is not None:
        index_k, key_cache = index[1].reshape(num_tokens, 1, -1), index_cache
    else:  # a shared layer writes no indexer key (a host may still give it the columns)
        index_k, key_cache = latent[..., :0], index_cache[..., :0]
    reshape_and_cache(latent[:written], index_k[:written].to(key_cache.dtype), cache, key_cache, slot_mapping)
    block_size = cache.shape[1]
    token_seq, token_pos = token_positions(query_start_loc, seq_lens, num_tokens)
    if index is not None:
        index_q, _, weights = index
        scores = indexer_scores(index_q.contiguous(), weights, index_cache[:, :, 0], block_table, token_seq,
                                token_pos, sparse.index_scale)
        selection = topk_indices(scores, sparse.topk)
    elif selection is None or selection.shape[0] != num_tokens:
        raise RuntimeError("a shared sparse attention layer runs before any layer with its own indexer in this step")
    slots = selected_slots(selection, block_table, token_seq, block_size)
    q = q.view(num_tokens, heads, -1)
    q_nope, q_pe = q.split([layer.nope_dim, layer.rope_dim], dim=-1)
    q_latent = torch.einsum("thn,hnl->thl", q_nope, layer.w_uk.to(q.dtype))
    q_abs = torch.cat([q_latent, q_pe], dim=-1).contiguous()
    out_latent = sparse_mla(q_abs, cache[:, :, 0], slots, layer.scale, layer.kv_lora_rank)
    out = torch.einsum("thl,hvl->thv", out_latent, layer.w_uv.to(q.dtype))
    return out.reshape(num_tokens, heads * layer.v_dim), selection
