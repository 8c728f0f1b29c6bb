"""Split-K attention over a paged context, the part every such kernel shares (paged_attention, mla_decode).

A row (one query token and head) whose context is long is attended in ``splits`` parts by separate programs.
Each part writes its normalised output ``o_s`` (fp32) and the base-2 log of its softmax denominator ``lse_s``
(``-inf`` for an empty part); :func:`combine_splits` then forms ``Σ_s 2^(lse_s - top) o_s / Σ_s 2^(lse_s - top)``.
With one split the attention kernel writes the output directly and nothing is combined.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

MIN_SPLIT_TOKENS = 256  # fewer context tokens per split would cost more in the combine than they save


@functools.cache
def _multiprocessors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_splits(programs: int, max_context: int, device: torch.device, max_splits: int) -> int:
    """Enough programs to fill the GPU twice over (``programs`` before splitting), each split with at least
    MIN_SPLIT_TOKENS of the longest context the block table can hold, at most ``max_splits``."""
    sms = _multiprocessors(device.index or 0) if device.type == "cuda" else 132
    wanted = triton.cdiv(2 * sms, max(1, programs))
    return max(1, min(max_splits, wanted, triton.cdiv(max_context, MIN_SPLIT_TOKENS)))


class SplitBuffers(NamedTuple):
    """Where the attention kernel writes: ``o_part`` ``[rows, heads, splits, width]`` and ``lse``
    ``[rows, heads, splits]`` (both ``out`` itself, lse unwritten, when ``direct``), with their strides."""

    o_part: torch.Tensor
    lse: torch.Tensor
    so_row: int
    so_head: int
    so_split: int
    slse_row: int
    slse_head: int
    direct: bool


def split_buffers(out: torch.Tensor, splits: int) -> SplitBuffers:
    """The buffers for ``out`` ``[rows, heads, width]`` attended in ``splits`` parts."""
    if splits == 1:
        return SplitBuffers(out, out, out.stride(0), out.stride(1), 0, 0, 0, True)
    rows, heads, width = out.shape
    o_part = torch.empty(rows, heads, splits, width, dtype=torch.float32, device=out.device)
    lse = torch.empty(rows, heads, splits, dtype=torch.float32, device=out.device)
    return SplitBuffers(o_part, lse, *o_part.stride()[:3], *lse.stride()[:2], False)


@triton.jit
def _combine_kernel(
    o_part_ptr, lse_ptr, out_ptr, sp_r, sp_h, sp_s, slse_r, slse_h, so_r, so_h,
    H, W: tl.constexpr, BW: tl.constexpr, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
):
    pid = tl.program_id(0)
    r = (pid // H).to(tl.int64)
    h = pid % H
    cols = tl.arange(0, BW)
    col_ok = cols < W
    splits = tl.arange(0, SPLITS_P2)
    lse = tl.load(lse_ptr + r * slse_r + h * slse_h + splits, mask=splits < SPLITS, other=float("-inf"))
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # a padding row: every split empty, every weight 0
    total = tl.sum(tl.exp2(lse - top), 0)
    acc = tl.zeros([BW], dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        lse_s = tl.load(lse_ptr + r * slse_r + h * slse_h + s)
        part = tl.load(o_part_ptr + r * sp_r + h * sp_h + s * sp_s + cols, mask=col_ok, other=0.0)  # 0 if empty
        acc += tl.exp2(lse_s - top) * part
    out = acc / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + r * so_r + h * so_h + cols, out.to(out_ptr.dtype.element_ty), mask=col_ok)


def combine_splits(buffers: SplitBuffers, out: torch.Tensor) -> None:
    """``out`` ``[rows, heads, width]`` from the parts in ``buffers`` (nothing to do when ``direct``)."""
    if buffers.direct:
        return
    rows, heads, width = out.shape
    splits = buffers.o_part.shape[2]
    _combine_kernel[(rows * heads,)](
        buffers.o_part, buffers.lse, out, buffers.so_row, buffers.so_head, buffers.so_split, buffers.slse_row,
        buffers.slse_head, out.stride(0), out.stride(1), heads,
        W=width, BW=triton.next_power_of_2(width), SPLITS=splits, SPLITS_P2=triton.next_power_of_2(splits),
        num_warps=4,
    )
