"""Pieces shared by ATOM's Triton GEMMs: how far to split K for decode-sized calls, and the kernel
that sums the split partials (adding the bias and casting once)."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def pick_split_k(tiles: int, k_iters: int, device: torch.device) -> int:
    """The largest power of two that keeps the grid within one wave of two programs per SM (a partial
    second wave would idle most SMs), each program keeping >= 4 K steps."""
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 8
    split = 1
    while tiles * split * 2 <= 2 * sms and k_iters // (split * 2) >= 4:
        split *= 2
    return split


@triton.jit
def _reduce_splits_kernel(ws_ptr, c_ptr, bias_ptr, numel, N,
                          SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for split in range(SPLIT_K):
        acc += tl.load(ws_ptr + split * numel + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def reduce_splits(ws: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None) -> None:
    """``out = sum(ws, 0) (+ bias)``; ``ws [SPLIT, M, N]`` fp32 partials of ``out [M, N]`` (contiguous)."""
    numel = out.numel()
    block = 1024
    _reduce_splits_kernel[(triton.cdiv(numel, block),)](
        ws, out, bias if bias is not None else out, numel, out.shape[-1],
        SPLIT_K=ws.shape[0], HAS_BIAS=bias is not None, BLOCK=block, num_warps=4,
    )
