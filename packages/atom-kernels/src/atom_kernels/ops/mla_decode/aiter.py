"""AITER MLA decode (ROCm), through ``aiter.mla.mla_decode_fwd``.

Unverified here: nobody on the team has an AMD GPU, so neither this wrapper nor AITER's argument conventions as
written below have run.  AITER takes the pages as a flat list (``kv_indptr`` / ``kv_indices`` per sequence,
``kv_last_page_lens``) over a ``[num_pages, page_size, kv_heads, D]`` buffer; the list is built on the device
(each sequence's pages written at its offset, unused table entries sent to a spare last element), so no length
is read on the host.  Its asm kernel takes page size 1 (vLLM's ROCm MLA backend runs block size 1); other page
sizes fall back to the Triton kernel.
"""

from __future__ import annotations

import torch


def unsupported(q, cache, block_table, seq_lens, scale, kv_lora_rank) -> str | None:
    if q.dtype not in (torch.bfloat16, torch.float16) or cache.dtype != q.dtype:
        return f"aiter mla_decode takes bf16/fp16 q and cache of one dtype, not {q.dtype}/{cache.dtype}"
    if cache.shape[1] != 1:
        return f"aiter mla_decode takes page size 1, not {cache.shape[1]}"
    return None


def mla_decode(q, cache, block_table, seq_lens, scale, kv_lora_rank):
    from aiter.mla import mla_decode_fwd

    batch, heads, _ = q.shape
    page, max_pages = cache.shape[1], block_table.shape[1]
    lens = seq_lens.to(torch.int32)
    pages = (lens + page - 1) // page
    indptr = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
    torch.cumsum(pages, 0, out=indptr[1:])
    j = torch.arange(max_pages, device=q.device)
    used = j[None, :] < pages[:, None]
    dest = torch.where(used, indptr[:-1, None].long() + j[None, :], batch * max_pages).reshape(-1)
    indices = torch.zeros(batch * max_pages + 1, dtype=torch.int32, device=q.device)
    indices.scatter_(0, dest, block_table.to(torch.int32).reshape(-1))
    last = torch.where(lens > 0, lens - (pages - 1) * page, 0).to(torch.int32)
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
    out = torch.empty(batch, heads, kv_lora_rank, dtype=q.dtype, device=q.device)
    mla_decode_fwd(q, cache.unsqueeze(2), out, qo_indptr, indptr, indices, last, 1, sm_scale=scale)
    return out.masked_fill_((lens == 0)[:, None, None], 0.0)  # padding rows: zeros, whatever AITER left there
