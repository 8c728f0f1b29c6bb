"""Split-K attention over a paged context, the part every such kernel shares (paged_attention, mla_decode).

A row (one query token and head) whose context is long is attended in ``splits`` parts by separate programs.
Each part writes its normalised output ``o_s`` (fp32) and the base-2 log of its softmax denominator ``lse_s``
(``-inf`` for an empty part); :func:`combine_splits` then forms ``Σ_s 2^(lse_s - top) o_s / Σ_s 2^(lse_s - top)``.
With one split the attention kernel writes the output directly and nothing is combined.

The split count follows the step (its rows and context lengths), so it is a runtime argument of every kernel here,
never a constexpr or a specialized integer: a new count compiles nothing (``atom_kernels.compile_keys``).  The
combine's constexpr bound is the op's ``max_splits``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from atom_kernels.ops._triton_common import use_while

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


# the split-dependent sizes and strides: never specialized (see the module doc)
SPLIT_ARGS = ["splits", "so_t", "so_h", "so_s", "slse_t", "slse_h"]


@triton.jit
def _add_part(acc, o_part_ptr, lse_ptr, r, h, s, sp_r, sp_h, sp_s, slse_r, slse_h, top, cols, col_ok):
    lse_s = tl.load(lse_ptr + r * slse_r + h * slse_h + s)
    part = tl.load(o_part_ptr + r * sp_r + h * sp_h + s * sp_s + cols, mask=col_ok, other=0.0)  # 0 if empty
    return acc + tl.exp2(lse_s - top) * part


@triton.jit(do_not_specialize=["splits", "sp_r", "sp_h", "sp_s", "slse_r", "slse_h"])
def _combine_kernel(
    o_part_ptr, lse_ptr, out_ptr, sp_r, sp_h, sp_s, slse_r, slse_h, so_r, so_h, H, splits,
    W: tl.constexpr, BW: tl.constexpr, MAX_SPLITS_P2: tl.constexpr, USE_WHILE: tl.constexpr,
):
    pid = tl.program_id(0)
    r = (pid // H).to(tl.int64)
    h = pid % H
    cols = tl.arange(0, BW)
    col_ok = cols < W
    each = tl.arange(0, MAX_SPLITS_P2)
    lse = tl.load(lse_ptr + r * slse_r + h * slse_h + each, mask=each < splits, other=float("-inf"))
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # a padding row: every split empty, every weight 0
    total = tl.sum(tl.exp2(lse - top), 0)
    acc = tl.zeros([BW], dtype=tl.float32)
    if USE_WHILE:  # the CPU interpreter (see _triton_common)
        s = 0
        while s < splits:
            acc = _add_part(acc, o_part_ptr, lse_ptr, r, h, s, sp_r, sp_h, sp_s, slse_r, slse_h, top, cols, col_ok)
            s += 1
    else:
        for s in tl.range(0, splits):
            acc = _add_part(acc, o_part_ptr, lse_ptr, r, h, s, sp_r, sp_h, sp_s, slse_r, slse_h, top, cols, col_ok)
    out = acc / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + r * so_r + h * so_h + cols, out.to(out_ptr.dtype.element_ty), mask=col_ok)


def combine_splits(buffers: SplitBuffers, out: torch.Tensor, max_splits: int) -> None:
    """``out`` ``[rows, heads, width]`` from the parts in ``buffers`` (nothing to do when ``direct``); ``max_splits``:
    the op's bound on the split count."""
    if buffers.direct:
        return
    rows, heads, width = out.shape
    splits = buffers.o_part.shape[2]
    assert splits <= max_splits, (splits, max_splits)
    _combine_kernel[(rows * heads,)](
        buffers.o_part, buffers.lse, out, buffers.so_row, buffers.so_head, buffers.so_split, buffers.slse_row,
        buffers.slse_head, out.stride(0), out.stride(1), heads, splits,
        W=width, BW=triton.next_power_of_2(width), MAX_SPLITS_P2=triton.next_power_of_2(max_splits),
        USE_WHILE=use_while(), num_warps=4,
    )
