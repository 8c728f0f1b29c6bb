"""Plain-torch indexer scores: the specification.

Tokens go in chunks so the gathered keys (``[chunk, max_blocks * block_size, D]``) stay under a fixed budget at
host sizes (8192-token prefill chunks over contexts of 16k and more); there are no host syncs.
"""

from __future__ import annotations

import torch

GATHER_BUDGET = 1 << 26  # elements of gathered keys per chunk (256 MiB in fp32)


def check_indexer_args(q, weights, k_cache, block_table, token_seq, token_pos) -> None:
    if q.dim() != 3 or k_cache.dim() != 3 or q.shape[-1] != k_cache.shape[-1]:
        raise ValueError(f"indexer_scores: q {tuple(q.shape)} must be [T, H, D] and k_cache {tuple(k_cache.shape)} "
                         "[num_blocks, block_size, D] with the same D")
    tokens, heads = q.shape[:2]
    if tuple(weights.shape) != (tokens, heads):
        raise ValueError(f"indexer_scores: weights {tuple(weights.shape)} must be [T, H] = {(tokens, heads)}")
    if block_table.dim() != 2 or tuple(token_seq.shape) != (tokens,) or tuple(token_pos.shape) != (tokens,):
        raise ValueError(f"indexer_scores: block_table {tuple(block_table.shape)} must be [B, max_blocks], token_seq "
                         f"{tuple(token_seq.shape)} and token_pos {tuple(token_pos.shape)} [T] with T = {tokens}")


def indexer_scores(q, weights, k_cache, block_table, token_seq, token_pos, scale):
    check_indexer_args(q, weights, k_cache, block_table, token_seq, token_pos)
    tokens, heads, dim = q.shape
    num_blocks, block_size, _ = k_cache.shape
    width = block_table.shape[1] * block_size
    out = torch.empty(tokens, width, dtype=torch.float32, device=q.device)
    blocks = block_table.long().clamp(0, num_blocks - 1)  # unread entries may be -1
    columns = torch.arange(width, device=q.device)
    chunk = max(1, GATHER_BUDGET // max(1, width * dim))
    for start in range(0, tokens, chunk):
        rows = slice(start, start + chunk)
        seq = token_seq[rows].long()
        keys = k_cache[blocks[seq.clamp(min=0)]].reshape(-1, width, dim).float()  # [c, width, D]
        logits = torch.relu(torch.einsum("thd,tsd->ths", q[rows].float(), keys) * scale)
        scores = torch.einsum("th,ths->ts", weights[rows].float(), logits)
        visible = (columns[None, :] <= token_pos[rows].long()[:, None]) & (seq >= 0)[:, None]
        out[rows] = scores.masked_fill(~visible, float("-inf"))
    return out
