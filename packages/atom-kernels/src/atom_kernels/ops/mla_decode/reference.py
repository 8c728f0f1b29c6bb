"""Plain-torch MLA decode over a paged latent cache: the specification.

Vectorised over the batch (every sequence gathered to the block table's width and masked past its length),
so it has no host syncs and serves as the benchmark's torch peer.
"""

from __future__ import annotations

import torch


def check_mla_args(q, cache, block_table, seq_lens, kv_lora_rank) -> None:
    if q.dim() != 3 or cache.dim() != 3:
        raise ValueError(f"mla_decode: q {tuple(q.shape)} must be [B, H, D] and cache {tuple(cache.shape)} "
                         "[num_blocks, block_size, D]")
    if q.shape[-1] != cache.shape[-1] or not 0 < kv_lora_rank < q.shape[-1]:
        raise ValueError(f"mla_decode: q's last dim {q.shape[-1]}, cache's {cache.shape[-1]} and kv_lora_rank "
                         f"{kv_lora_rank} disagree (both dims are kv_lora_rank + rope_dim)")
    if block_table.dim() != 2 or block_table.shape[0] != q.shape[0] or tuple(seq_lens.shape) != (q.shape[0],):
        raise ValueError(f"mla_decode: block_table {tuple(block_table.shape)} must be [B, max_blocks] and seq_lens "
                         f"{tuple(seq_lens.shape)} [B] with B = {q.shape[0]}")


def mla_decode(q, cache, block_table, seq_lens, scale, kv_lora_rank):
    check_mla_args(q, cache, block_table, seq_lens, kv_lora_rank)
    batch, heads, _ = q.shape
    num_blocks, block_size, dim = cache.shape
    width = block_table.shape[1] * block_size
    pos = torch.arange(width, device=q.device)
    valid = pos[None, :] < seq_lens[:, None].long()  # [B, S]
    blocks = block_table.long().clamp(0, num_blocks - 1)  # unread entries may be -1 or stale
    rows = cache[blocks].reshape(batch, width, dim).float()
    rows = rows.masked_fill(~valid[:, :, None], 0.0)
    scores = torch.einsum("bhd,bsd->bhs", q.float(), rows) * scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a padding row (no keys) is all -inf: zeros
    out = torch.einsum("bhs,bsl->bhl", probs, rows[:, :, :kv_lora_rank])
    return out.to(q.dtype)
