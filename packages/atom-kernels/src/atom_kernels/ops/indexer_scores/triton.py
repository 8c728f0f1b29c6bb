"""Triton indexer scores: program ``(token, column block)`` scores ``BLOCK_N`` cached keys of the token's sequence
against all its heads at once (one ``[H, D] x [D, BLOCK_N]`` dot), applies relu and the head weights, and writes
the block's scores (-inf past the token's position).  Keys are read through the block table in place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.ops._triton_common import FLOAT_DTYPES, dot_dtype, dot_precision
from atom_kernels.ops.indexer_scores.reference import check_indexer_args

MAX_HEADS = 128
MAX_DIM = 256
BLOCK_N = 64


def unsupported(q, weights, k_cache, block_table, token_seq, token_pos, scale) -> str | None:
    if q.shape[1] > MAX_HEADS or q.shape[-1] > MAX_DIM:
        return f"{q.shape[1]} heads of {q.shape[-1]}: at most {MAX_HEADS} heads of {MAX_DIM}"
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1:
        return "q and k_cache need a contiguous last dim"
    if q.dtype not in FLOAT_DTYPES or k_cache.dtype not in FLOAT_DTYPES:
        return f"q {q.dtype} / k_cache {k_cache.dtype}: float caches only"
    return None


@triton.jit(do_not_specialize=["sbt_b"])  # the block table's width follows the longest context
def _scores_kernel(
    q_ptr, w_ptr, k_ptr, bt_ptr, seq_ptr, pos_ptr, out_ptr,
    sq_t, sq_h, sw_t, sw_h, sk_blk, sk_tok, sbt_b, so_t,
    H, D, width, scale,
    PAGE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT: tl.constexpr, PREC: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    seq = tl.load(seq_ptr + t)
    last = tl.where(seq >= 0, tl.load(pos_ptr + t), -1)  # a padding token (no sequence) sees nothing
    visible = (cols <= last) & (cols < width)
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    h_ok = heads < H
    d_ok = dims < D
    q = tl.load(q_ptr + t * sq_t + heads[:, None] * sq_h + dims[None, :], mask=h_ok[:, None] & d_ok[None, :],
                other=0.0).to(DOT)
    w = tl.load(w_ptr + t * sw_t + heads * sw_h, mask=h_ok, other=0.0).to(tl.float32)
    block = tl.load(bt_ptr + tl.maximum(seq, 0).to(tl.int64) * sbt_b + cols // PAGE, mask=visible, other=0)
    rows = k_ptr + block.to(tl.int64) * sk_blk + (cols % PAGE).to(tl.int64) * sk_tok
    k = tl.load(rows[:, None] + dims[None, :], mask=visible[:, None] & d_ok[None, :], other=0.0).to(DOT)
    logits = tl.maximum(tl.dot(q, tl.trans(k), input_precision=PREC) * scale, 0.0)  # [BLOCK_H, BLOCK_N]
    scores = tl.sum(logits * w[:, None], 0)
    scores = tl.where(visible, scores, float("-inf"))
    tl.store(out_ptr + t * so_t + cols, scores, mask=cols < width)


def indexer_scores(q, weights, k_cache, block_table, token_seq, token_pos, scale):
    check_indexer_args(q, weights, k_cache, block_table, token_seq, token_pos)
    tokens, heads, dim = q.shape
    page = k_cache.shape[1]
    width = block_table.shape[1] * page
    out = torch.empty(tokens, width, dtype=torch.float32, device=q.device)
    if tokens == 0 or width == 0:
        return out
    _scores_kernel[(tokens, triton.cdiv(width, BLOCK_N))](
        q, weights, k_cache, block_table, token_seq, token_pos, out,
        q.stride(0), q.stride(1), weights.stride(0), weights.stride(1), k_cache.stride(0), k_cache.stride(1),
        block_table.stride(0), out.stride(0),
        heads, dim, width, scale,
        PAGE=page, BLOCK_H=max(16, triton.next_power_of_2(heads)), BLOCK_D=max(16, triton.next_power_of_2(dim)),
        BLOCK_N=BLOCK_N, DOT=dot_dtype(q.dtype), PREC=dot_precision(q.dtype),
    )
    return out
