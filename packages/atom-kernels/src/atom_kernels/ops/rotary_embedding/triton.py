"""Triton rotary embedding, in place: program (token, head block) rotates that block of q and k heads."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _head_strides(x: torch.Tensor, head_size: int) -> tuple[int, int] | None:
    """(token stride, head stride) when the heads of ``x`` can be addressed in place, else None."""
    if x.dim() == 2 and x.stride(1) == 1 and x.shape[1] % head_size == 0:
        return x.stride(0), head_size
    if x.dim() == 3 and x.shape[2] == head_size and x.stride(2) == 1:
        return x.stride(0), x.stride(1)
    return None


def unsupported(positions, q, k, cos_sin_cache, head_size, is_neox=True) -> str | None:
    if cos_sin_cache.dtype != torch.float32 or not cos_sin_cache.is_contiguous():
        return "cos_sin_cache must be contiguous fp32"
    if cos_sin_cache.shape[-1] % 2 or cos_sin_cache.shape[-1] > head_size:
        return f"rotary_dim {cos_sin_cache.shape[-1]} must be even and <= head_size {head_size}"
    for name, x in (("q", q), ("k", k)):
        if x is not None and _head_strides(x, head_size) is None:
            return f"{name} of shape {tuple(x.shape)}/stride {x.stride()} is not addressable per head"
    return None


@triton.jit
def _rotate_heads(x_ptr, token, token_stride, head_stride, num_heads, cos, sin, half,
                  IS_NEOX: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr):
    dims = tl.arange(0, HALF)
    dim_mask = dims < half
    if IS_NEOX:
        off1 = dims
        off2 = dims + half
    else:
        off1 = 2 * dims
        off2 = 2 * dims + 1
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (heads < num_heads)[:, None] & dim_mask[None, :]
    base = x_ptr + token * token_stride + heads[:, None] * head_stride
    x1 = tl.load(base + off1[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + off2[None, :], mask=mask, other=0.0).to(tl.float32)
    o1 = x1 * cos[None, :] - x2 * sin[None, :]
    o2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(base + off1[None, :], o1.to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(base + off2[None, :], o2.to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(pos_ptr, cache_ptr, rotary_dim,
                   q_ptr, q_token_stride, q_head_stride, q_heads,
                   k_ptr, k_token_stride, k_head_stride, k_heads,
                   IS_NEOX: tl.constexpr, HAS_K: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    half = rotary_dim // 2
    pos = tl.load(pos_ptr + token).to(tl.int64)
    dims = tl.arange(0, HALF)
    cos = tl.load(cache_ptr + pos * rotary_dim + dims, mask=dims < half, other=1.0)
    sin = tl.load(cache_ptr + pos * rotary_dim + half + dims, mask=dims < half, other=0.0)
    _rotate_heads(q_ptr, token, q_token_stride, q_head_stride, q_heads, cos, sin, half, IS_NEOX, BLOCK_H, HALF)
    if HAS_K:
        _rotate_heads(k_ptr, token, k_token_stride, k_head_stride, k_heads, cos, sin, half, IS_NEOX, BLOCK_H, HALF)


def rotary_embedding(positions, q, k, cos_sin_cache, head_size, is_neox=True):
    num_tokens = positions.numel()
    rotary_dim = cos_sin_cache.shape[-1]
    q_token_stride, q_head_stride = _head_strides(q, head_size)
    q_heads = q.numel() // max(num_tokens, 1) // head_size
    if k is not None:
        k_token_stride, k_head_stride = _head_strides(k, head_size)
        k_heads = k.numel() // max(num_tokens, 1) // head_size
    else:
        k_token_stride = k_head_stride = k_heads = 0
    half_block = triton.next_power_of_2(rotary_dim // 2)
    max_heads = max(q_heads, k_heads)
    block_h = max(1, min(triton.next_power_of_2(max_heads), 4096 // half_block))
    if num_tokens > 0:
        _rotary_kernel[(num_tokens, triton.cdiv(max_heads, block_h))](
            positions, cos_sin_cache, rotary_dim,
            q, q_token_stride, q_head_stride, q_heads,
            q if k is None else k, k_token_stride, k_head_stride, k_heads,
            IS_NEOX=is_neox, HAS_K=k is not None, BLOCK_H=block_h, HALF=half_block, num_warps=4,
        )
    return q, k
