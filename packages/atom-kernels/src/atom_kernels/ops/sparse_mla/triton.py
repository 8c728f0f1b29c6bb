"""Triton sparse latent attention: program ``(token, head group)`` walks the token's selected slots ``BLOCK_N``
at a time, gathers those latent rows (they serve as keys and values), and folds them into an online softmax
(base 2).  Unused slots (negative) are masked; a block with none selected leaves the running state unchanged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.ops._triton_common import LOG2E, dot_dtype, dot_precision, latent_cache_unsupported, latent_fold, use_while
from atom_kernels.ops.sparse_mla.reference import check_sparse_mla_args

MAX_LATENT = 1024
BLOCK_H = 16
BLOCK_N = 32


def unsupported(q, cache, slots, scale, kv_lora_rank, sinks=None) -> str | None:
    return latent_cache_unsupported(q, cache, kv_lora_rank, MAX_LATENT)


@triton.jit
def _step(k0, m, l, acc, q_lat, q_pe, cache_ptr, slot_row_ptr, K, cols_l, cols_r, l_ok, r_ok, sc_blk, sc_tok,
          scale_log2, L: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr,
          PREC: tl.constexpr):
    idx = k0 + tl.arange(0, BLOCK_N)
    slot = tl.load(slot_row_ptr + idx, mask=idx < K, other=-1)
    ok = slot >= 0
    safe = tl.maximum(slot, 0).to(tl.int64)
    row = cache_ptr + (safe // PAGE) * sc_blk + (safe % PAGE) * sc_tok
    return latent_fold(m, l, acc, q_lat, q_pe, row, ok, cols_l, cols_r, l_ok, r_ok, scale_log2, L, DOT, PREC)


@triton.jit
def _sparse_kernel(
    q_ptr, cache_ptr, slots_ptr, o_ptr, sinks_ptr,
    sq_t, sq_h, sc_blk, sc_tok, ss_t, so_t, so_h,
    H, K, scale_log2,
    L: tl.constexpr, R: tl.constexpr, BL: tl.constexpr, BR: tl.constexpr, PAGE: tl.constexpr,
    HEAD_GROUPS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT: tl.constexpr, PREC: tl.constexpr, USE_WHILE: tl.constexpr, HAS_SINKS: tl.constexpr = False,
):
    pid = tl.program_id(0)
    t = (pid // HEAD_GROUPS).to(tl.int64)
    heads = (pid % HEAD_GROUPS) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = heads < H
    cols_l = tl.arange(0, BL)
    cols_r = tl.arange(0, BR)
    l_ok = cols_l < L
    r_ok = cols_r < R
    q_row = q_ptr + t * sq_t + heads[:, None] * sq_h
    q_lat = tl.load(q_row + cols_l[None, :], mask=h_ok[:, None] & l_ok[None, :], other=0.0).to(DOT)
    q_pe = tl.load(q_row + L + cols_r[None, :], mask=h_ok[:, None] & r_ok[None, :], other=0.0).to(DOT)
    slot_row_ptr = slots_ptr + t * ss_t
    m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BL], dtype=tl.float32)
    if USE_WHILE:  # the CPU interpreter (see _triton_common)
        k0 = 0
        while k0 < K:
            m, l, acc = _step(k0, m, l, acc, q_lat, q_pe, cache_ptr, slot_row_ptr, K, cols_l, cols_r, l_ok, r_ok,
                              sc_blk, sc_tok, scale_log2, L, PAGE, BLOCK_N, DOT, PREC)
            k0 += BLOCK_N
    else:
        for k0 in range(0, K, BLOCK_N):
            m, l, acc = _step(k0, m, l, acc, q_lat, q_pe, cache_ptr, slot_row_ptr, K, cols_l, cols_r, l_ok, r_ok,
                              sc_blk, sc_tok, scale_log2, L, PAGE, BLOCK_N, DOT, PREC)
    if HAS_SINKS:  # the sink's logit (base 2, pre-scaled) joins the softmax and adds no value
        sink = tl.load(sinks_ptr + heads, mask=h_ok, other=0.0)
        m_end = tl.maximum(m, sink)
        l = l * tl.exp2(m - m_end) + tl.exp2(sink - m_end)
        acc = acc * tl.exp2(m - m_end)[:, None]
    out = acc / tl.where(l > 0, l, 1.0)[:, None]  # no slot selected: zeros
    o_tile = o_ptr + t * so_t + heads[:, None] * so_h + cols_l[None, :]
    tl.store(o_tile, out.to(o_ptr.dtype.element_ty), mask=h_ok[:, None] & l_ok[None, :])


def sparse_mla(q, cache, slots, scale, kv_lora_rank, sinks=None):
    check_sparse_mla_args(q, cache, slots, kv_lora_rank, sinks)
    tokens, heads, dim = q.shape
    latent, rope = kv_lora_rank, dim - kv_lora_rank
    out = torch.empty(tokens, heads, latent, dtype=q.dtype, device=q.device)
    if tokens == 0:
        return out
    head_groups = triton.cdiv(heads, BLOCK_H)
    sinks_log2 = (sinks.float() * LOG2E).contiguous() if sinks is not None else out  # (never read without sinks)
    _sparse_kernel[(tokens * head_groups,)](
        q, cache, slots, out, sinks_log2,
        q.stride(0), q.stride(1), cache.stride(0), cache.stride(1), slots.stride(0), out.stride(0), out.stride(1),
        heads, slots.shape[1], scale * LOG2E,
        L=latent, R=rope, BL=triton.next_power_of_2(latent), BR=max(16, triton.next_power_of_2(rope)),
        PAGE=cache.shape[1], HEAD_GROUPS=head_groups, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N,
        DOT=dot_dtype(q.dtype), PREC=dot_precision(q.dtype), USE_WHILE=use_while(), HAS_SINKS=sinks is not None,
    )
    return out
