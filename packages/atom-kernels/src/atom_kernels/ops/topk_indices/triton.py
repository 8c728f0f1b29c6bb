"""Triton top-k selection: one program per row finds the k-th largest score by bisection, then writes the
positions above it (and the lowest-positioned ties at it) in ascending order.

Scores are mapped to int32 keys that sort as the floats do (negative floats get their magnitude bits flipped;
-0.0 becomes +0.0).
With ``k_eff = min(k, finite scores)``, 32 bisection passes over the row find the largest key ``τ`` with at
least ``k_eff`` keys ``>= τ``; a pass counts ``> τ``, and a last pass writes those and the first ties at ``τ``
(``tl.cumsum`` gives each selected position its output column), then ``-1`` fills columns ``k_eff .. k``.
Each pass streams the row; rows of a prefill chunk run in parallel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.ops._triton_common import use_while
from atom_kernels.ops.topk_indices.reference import check_topk_args

BLOCK = 1024


def unsupported(scores, k) -> str | None:
    if scores.dtype != torch.float32 or scores.stride(-1) != 1:
        return f"fp32 scores with a contiguous last dim (got {scores.dtype})"
    return None


@triton.jit
def _keys(row_ptr, cols, width):
    x = tl.load(row_ptr + cols, mask=cols < width, other=float("-inf"))
    x = tl.where(x == 0.0, 0.0, x)  # -0.0 ties with +0.0, as torch compares them
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
    return key, (cols < width) & (x > float("-inf"))


@triton.jit
def _count_at_least(row_ptr, width, threshold, BLOCK: tl.constexpr, USE_WHILE: tl.constexpr):
    count = tl.sum(tl.zeros([BLOCK], tl.int32), 0)  # an int32 scalar tensor (a loop-carried value)
    if USE_WHILE:
        n0 = 0
        while n0 < width:
            key, ok = _keys(row_ptr, n0 + tl.arange(0, BLOCK), width)
            count += tl.sum((ok & (key >= threshold)).to(tl.int32), 0)
            n0 += BLOCK
    else:
        for n0 in range(0, width, BLOCK):
            key, ok = _keys(row_ptr, n0 + tl.arange(0, BLOCK), width)
            count += tl.sum((ok & (key >= threshold)).to(tl.int32), 0)
    return count


@triton.jit
def _write(row_ptr, out_row_ptr, n0, width, tau, ties_left, written, BLOCK: tl.constexpr):
    cols = n0 + tl.arange(0, BLOCK)
    key, ok = _keys(row_ptr, cols, width)
    above = ok & (key > tau)
    tie = ok & (key == tau)
    tie_rank = tl.cumsum(tie.to(tl.int32), 0) - 1
    take = above | (tie & (tie_rank < ties_left))
    slot = written + tl.cumsum(take.to(tl.int32), 0) - 1
    tl.store(out_row_ptr + slot, cols.to(tl.int32), mask=take)
    return ties_left - tl.sum(tie.to(tl.int32), 0), written + tl.sum(take.to(tl.int32), 0)


@triton.jit
def _topk_kernel(scores_ptr, out_ptr, s_row, o_row, width, K, BLOCK: tl.constexpr, USE_WHILE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = scores_ptr + row * s_row
    out_row_ptr = out_ptr + row * o_row
    lowest = -2147483648
    finite = _count_at_least(row_ptr, width, lowest, BLOCK, USE_WHILE)
    k_eff = tl.minimum(finite, K)
    lo = row * 0 + lowest  # int64 scalars (hi - lo overflows int32); invariant: at least k_eff keys >= lo
    hi = row * 0 + 2147483647
    for _ in range(32):
        mid = lo + (hi - lo + 1) // 2
        enough = _count_at_least(row_ptr, width, mid, BLOCK, USE_WHILE) >= k_eff
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid - 1)
    ties_left = k_eff - _count_at_least(row_ptr, width, lo + 1, BLOCK, USE_WHILE)
    written = tl.sum(tl.zeros([BLOCK], tl.int32), 0)
    if USE_WHILE:
        n0 = 0
        while n0 < width:
            ties_left, written = _write(row_ptr, out_row_ptr, n0, width, lo, ties_left, written, BLOCK)
            n0 += BLOCK
    else:
        for n0 in range(0, width, BLOCK):
            ties_left, written = _write(row_ptr, out_row_ptr, n0, width, lo, ties_left, written, BLOCK)
    if USE_WHILE:
        c0 = 0
        while c0 < K:
            cols = c0 + tl.arange(0, BLOCK)
            tl.store(out_row_ptr + cols, tl.full([BLOCK], -1, tl.int32), mask=(cols >= k_eff) & (cols < K))
            c0 += BLOCK
    else:
        for c0 in range(0, K, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            tl.store(out_row_ptr + cols, tl.full([BLOCK], -1, tl.int32), mask=(cols >= k_eff) & (cols < K))


def topk_indices(scores, k):
    check_topk_args(scores, k)
    tokens, width = scores.shape
    out = torch.empty(tokens, k, dtype=torch.int32, device=scores.device)
    if tokens == 0:
        return out
    _topk_kernel[(tokens,)](scores, out, scores.stride(0), out.stride(0), width, k, BLOCK=BLOCK,
                            USE_WHILE=use_while())
    return out
