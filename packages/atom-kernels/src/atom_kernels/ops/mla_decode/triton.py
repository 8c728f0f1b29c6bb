"""Triton MLA decode: split-K flash decoding over the paged latent cache, then a reduce.

Stage 1, program ``(b * head_groups + g, split)``: heads ``[g*BLOCK_H, (g+1)*BLOCK_H)`` of sequence b against
its context tokens ``[split * per_split, (split + 1) * per_split)``, with ``per_split = ceil(seq_len / splits)``
rounded up to BLOCK_N (read from the device, so the launch never syncs).  Each step loads BLOCK_N cache rows
through the block table, scores them against the heads' ``[latent | rope]`` queries, and folds them into an
online softmax; the latent rows serve as both keys and values, so the cache is read once per head group.
The program writes its normalised partial output and log-sum-exp (base 2); a split with no tokens writes
lse = -inf.  Stage 2 (:mod:`atom_kernels.ops._splitk`): the lse-weighted sum of the splits' partials.  With one
split, stage 1 writes the output directly.

The split count depends on shapes only (batch, head groups, the block table's width) so a CUDA graph
captured for a batch size replays for any lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atom_kernels.ops import _splitk as splitk
from atom_kernels.ops._triton_common import LOG2E, dot_dtype, dot_precision, latent_cache_unsupported, latent_fold, use_while
from atom_kernels.ops.mla_decode.reference import check_mla_args

MAX_LATENT = 1024  # kv_lora_rank is padded to a power of two in registers (DeepSeek: 512)
MAX_SPLITS = 64


@dataclass(frozen=True)
class Config:
    block_h: int = 16  # heads per program (tl.dot needs >= 16 rows on the GPU)
    block_n: int = 32  # context tokens per step
    num_warps: int = 4
    num_stages: int = 2
    splits: int | None = None  # None: from the shapes (see num_splits)


DEFAULT = Config()


def num_splits(batch: int, head_groups: int, max_context: int, device: torch.device) -> int:
    """Splits of each (sequence, head group) program's context (see _splitk.num_splits)."""
    return splitk.num_splits(batch * head_groups, max_context, device, MAX_SPLITS)


def unsupported(q, cache, block_table, seq_lens, scale, kv_lora_rank) -> str | None:
    return latent_cache_unsupported(q, cache, kv_lora_rank, MAX_LATENT)


@triton.jit
def _step(n0, m, l, acc, q_lat, q_pe, cache_ptr, bt_row_ptr, end, cols_l, cols_r, l_ok, r_ok, sc_blk, sc_tok,
          scale_log2, L: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr,
          PREC: tl.constexpr):
    """Fold context tokens ``[n0, n0 + BLOCK_N) ∩ [.., end)`` into the online softmax ``(m, l, acc)``."""
    pos = n0 + tl.arange(0, BLOCK_N)
    ok = pos < end
    block = tl.load(bt_row_ptr + pos // PAGE, mask=ok, other=0).to(tl.int64)
    row = cache_ptr + block * sc_blk + (pos % PAGE).to(tl.int64) * sc_tok
    return latent_fold(m, l, acc, q_lat, q_pe, row, ok, cols_l, cols_r, l_ok, r_ok, scale_log2, L, DOT, PREC)


@triton.jit(do_not_specialize=["sbt_b", "splits", "so_b", "so_h", "so_s", "slse_b", "slse_h"])
def _split_kernel(
    q_ptr, cache_ptr, bt_ptr, lens_ptr, o_ptr, lse_ptr,
    sq_b, sq_h, sc_blk, sc_tok, sbt_b, so_b, so_h, so_s, slse_b, slse_h,
    H, splits, scale_log2,
    L: tl.constexpr, R: tl.constexpr, BL: tl.constexpr, BR: tl.constexpr, PAGE: tl.constexpr,
    HEAD_GROUPS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    DIRECT: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr, USE_WHILE: tl.constexpr, STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    b = (pid // HEAD_GROUPS).to(tl.int64)
    heads = (pid % HEAD_GROUPS) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = tl.program_id(1)
    h_ok = heads < H
    cols_l = tl.arange(0, BL)
    cols_r = tl.arange(0, BR)
    l_ok = cols_l < L
    r_ok = cols_r < R

    seq_len = tl.load(lens_ptr + b)
    per_split = tl.cdiv(tl.cdiv(seq_len, splits), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)

    q_row = q_ptr + b * sq_b + heads[:, None] * sq_h
    q_lat = tl.load(q_row + cols_l[None, :], mask=h_ok[:, None] & l_ok[None, :], other=0.0).to(DOT)
    q_pe = tl.load(q_row + L + cols_r[None, :], mask=h_ok[:, None] & r_ok[None, :], other=0.0).to(DOT)
    bt_row_ptr = bt_ptr + b * sbt_b

    m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BL], dtype=tl.float32)
    if USE_WHILE:  # the CPU interpreter (see _triton_common)
        n0 = start
        while n0 < end:
            m, l, acc = _step(n0, m, l, acc, q_lat, q_pe, cache_ptr, bt_row_ptr, end, cols_l, cols_r, l_ok, r_ok,
                              sc_blk, sc_tok, scale_log2, L, PAGE, BLOCK_N, DOT, PREC)
            n0 += BLOCK_N
    else:
        for n0 in tl.range(start, end, BLOCK_N, num_stages=STAGES):
            m, l, acc = _step(n0, m, l, acc, q_lat, q_pe, cache_ptr, bt_row_ptr, end, cols_l, cols_r, l_ok, r_ok,
                              sc_blk, sc_tok, scale_log2, L, PAGE, BLOCK_N, DOT, PREC)

    # an empty split (or a padding row) has l = 0 and acc = 0: its output is zeros and its lse -inf
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    o_tile = o_ptr + b * so_b + heads[:, None] * so_h + split * so_s + cols_l[None, :]
    tl.store(o_tile, out.to(o_ptr.dtype.element_ty), mask=h_ok[:, None] & l_ok[None, :])
    if not DIRECT:
        lse = tl.where(l > 0, m + tl.log2(tl.where(l > 0, l, 1.0)), float("-inf"))
        tl.store(lse_ptr + b * slse_b + heads * slse_h + split, lse, mask=h_ok)


def mla_decode(q, cache, block_table, seq_lens, scale, kv_lora_rank, config: Config | None = None):
    check_mla_args(q, cache, block_table, seq_lens, kv_lora_rank)
    cfg = config or DEFAULT
    batch, heads, dim = q.shape
    latent, rope = kv_lora_rank, dim - kv_lora_rank
    out = torch.empty(batch, heads, latent, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    head_groups = triton.cdiv(heads, cfg.block_h)
    page = cache.shape[1]
    splits = cfg.splits or num_splits(batch, head_groups, block_table.shape[1] * page, q.device)
    parts = splitk.split_buffers(out, splits)
    dot = dot_dtype(q.dtype)
    _split_kernel[(batch * head_groups, splits)](
        q, cache, block_table, seq_lens, parts.o_part, parts.lse,
        q.stride(0), q.stride(1), cache.stride(0), cache.stride(1), block_table.stride(0),
        parts.so_row, parts.so_head, parts.so_split, parts.slse_row, parts.slse_head,
        heads, splits, scale * LOG2E,
        L=latent, R=rope, BL=triton.next_power_of_2(latent), BR=max(16, triton.next_power_of_2(rope)), PAGE=page,
        HEAD_GROUPS=head_groups, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, DIRECT=parts.direct,
        DOT=dot, PREC=dot_precision(q.dtype), USE_WHILE=use_while(), STAGES=cfg.num_stages,
        num_warps=cfg.num_warps,
    )
    splitk.combine_splits(parts, out, MAX_SPLITS)
    return out
