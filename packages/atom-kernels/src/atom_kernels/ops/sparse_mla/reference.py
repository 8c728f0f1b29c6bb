"""Plain-torch sparse latent attention: gathers the selected rows (queries in chunks, to bound the gather)."""

from __future__ import annotations

import torch

GATHER_BUDGET = 1 << 26  # elements of gathered rows per chunk


def check_sparse_mla_args(q, cache, slots, kv_lora_rank, sinks=None) -> None:
    if q.dim() != 3 or cache.dim() != 3 or q.shape[-1] != cache.shape[-1]:
        raise ValueError(f"sparse_mla: q {tuple(q.shape)} must be [T, H, D] and cache {tuple(cache.shape)} "
                         "[num_blocks, block_size, D] with the same D")
    if not 0 < kv_lora_rank <= q.shape[-1]:
        raise ValueError(f"sparse_mla: kv_lora_rank {kv_lora_rank} must be within the latent row's {q.shape[-1]}")
    if slots.dim() != 2 or slots.shape[0] != q.shape[0]:
        raise ValueError(f"sparse_mla: slots {tuple(slots.shape)} must be [T, K] with T = {q.shape[0]}")
    if sinks is not None and tuple(sinks.shape) != (q.shape[1],):
        raise ValueError(f"sparse_mla: sinks {tuple(sinks.shape)} must be [H] with H = {q.shape[1]}")


def sparse_mla(q, cache, slots, scale, kv_lora_rank, sinks=None):
    check_sparse_mla_args(q, cache, slots, kv_lora_rank, sinks)
    tokens, heads, dim = q.shape
    flat = cache.reshape(-1, dim)
    out = torch.empty(tokens, heads, kv_lora_rank, dtype=q.dtype, device=q.device)
    chunk = max(1, GATHER_BUDGET // max(1, slots.shape[1] * dim))
    for start in range(0, tokens, chunk):
        sel = slots[start : start + chunk].long()
        used = sel >= 0
        rows = flat[sel.clamp(0, flat.shape[0] - 1)].float().masked_fill(~used[..., None], 0.0)  # [c, K, D]
        logits = torch.einsum("thd,tkd->thk", q[start : start + chunk].float(), rows) * scale
        logits = logits.masked_fill(~used[:, None, :], float("-inf"))
        if sinks is not None:  # one more logit per head, whose share is dropped
            sink = sinks.float()[None, :, None].expand(logits.shape[0], -1, 1)
            probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)
        out[start : start + chunk] = torch.einsum("thk,tkl->thl", probs, rows[..., :kv_lora_rank]).to(q.dtype)
    return out
