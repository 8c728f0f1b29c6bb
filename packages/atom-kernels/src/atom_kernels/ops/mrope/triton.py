"""Triton MRoPE, in place: program (token, head block) normalises (optionally) and rotates one block of
q heads or of k heads.

Each program reads its token's position rows, and for every frequency gathers cos/sin straight from the
cache row of the position its section assigns — no separate gather pass, no intermediate cos/sin
tensor.  Launch configurations are data (:data:`CONFIGS`, keyed by :func:`shape_class`);
``python -m atom_tools.kernels mrope`` sweeps them on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atom_kernels.ops.mrope.reference import check_section
from atom_kernels.ops.rotary_embedding.triton import _head_strides

MAX_HEAD_SIZE = 1024
# "chunks": each head as rotary-sized chunks of two contiguous halves, every dim loaded once into one layout;
# "pairs" (the first version): the rotated halves and the pass-through dims as separate tiles.
KERNELS = ("chunks", "pairs")


@dataclass(frozen=True)
class Config:
    block_h: int  # heads per program
    num_warps: int
    kernel: str = "chunks"  # a key of KERNELS: how a program lays out the dims of its heads


# Chosen per shape class from H200 sweeps of ``python -m atom_tools.kernels mrope``: "chunks" runs Qwen3.5's fused
# q/k norm (heads of 256) at 1.2x the floor, 2.4x faster than "pairs"; for heads of 128 the two are within noise, so one
# kernel serves every case.
CONFIGS: dict[str, Config] = {
    "rope-narrow": Config(block_h=16, num_warps=2),  # rotates <= 64 dims per head (Qwen3.5: 64 of 256)
    "rope-wide": Config(block_h=8, num_warps=2),  # <= 128 (Qwen2.5-VL, Qwen3-VL)
    "rope-xwide": Config(block_h=4, num_warps=2),  # not measured (no catalog model rotates > 128 dims)
    "norm-narrow": Config(block_h=16, num_warps=2),  # not measured
    "norm-wide": Config(block_h=8, num_warps=2),  # whole heads of 128 dims (Qwen3-VL)
    "norm-xwide": Config(block_h=4, num_warps=1),  # whole heads of 256 dims (Qwen3.5)
}


def shape_class(head_size: int, rotary_dim: int, fused_norm: bool) -> str:
    """The key of :data:`CONFIGS`: what the kernel touches per head (rotated dims, or whole heads when normed)."""
    touched = head_size if fused_norm else rotary_dim
    width = "narrow" if touched <= 64 else "wide" if touched <= 128 else "xwide"
    return f"{'norm' if fused_norm else 'rope'}-{width}"


def unsupported(positions, q, k, cos_sin_cache, head_size, mrope_section, interleaved=False, *,
                q_weight=None, k_weight=None, eps=1e-6, weight_offset=0.0) -> str | None:
    if cos_sin_cache.dim() != 2 or cos_sin_cache.dtype != torch.float32 or not cos_sin_cache.is_contiguous():
        return "cos_sin_cache must be a contiguous fp32 [max_position, rotary_dim] tensor"
    if cos_sin_cache.numel() >= 2**31:
        return "cos_sin_cache has 2**31 elements or more: the kernel indexes it with int32 position * rotary_dim"
    rotary_dim = cos_sin_cache.shape[-1]
    if rotary_dim % 2 or rotary_dim > head_size or head_size > MAX_HEAD_SIZE:
        return f"rotary_dim {rotary_dim} must be even and <= head_size {head_size} <= {MAX_HEAD_SIZE}"
    try:
        check_section(mrope_section, rotary_dim)
    except ValueError as err:
        return str(err)
    if positions.is_floating_point() or positions.dim() not in (1, 2) or (positions.dim() == 2 and positions.shape[0] != 3):
        return f"positions must be integer [T] or [3, T], got {positions.dtype} {tuple(positions.shape)}"
    num_tokens = positions.shape[-1]
    for name, x, weight in (("q", q, q_weight), ("k", k, k_weight)):
        if x is None:
            continue
        if x.shape[0] != num_tokens or _head_strides(x, head_size) is None:
            return f"{name} of shape {tuple(x.shape)}/stride {x.stride()} is not addressable per head for {num_tokens} tokens"
        if (q_weight is None) != (weight is None):
            return f"norm weights: q_weight and {name}_weight must be given together"
        if weight is not None and (weight.shape != (head_size,) or not weight.is_contiguous()):
            return f"{name}_weight must be a contiguous [{head_size}] tensor, got {tuple(weight.shape)}"
    return None


@triton.jit
def _section_positions(pos_ptr, pos_row_stride, token, pos_token_stride, freq, sec_t, sec_h, sec_w,
                       INTERLEAVED: tl.constexpr):
    """The position each frequency is rotated by: three scalar loads (time, height, width), then a select.
    int32 (``unsupported`` requires the cache to have fewer than 2**31 elements, so position * rotary_dim fits)."""
    base = pos_ptr + token * pos_token_stride
    pos_t = tl.load(base, volatile=True).to(tl.int32)
    pos_h = tl.load(base + pos_row_stride, volatile=True).to(tl.int32)
    pos_w = tl.load(base + 2 * pos_row_stride, volatile=True).to(tl.int32)
    if INTERLEAVED:
        row_h = (freq % 3 == 1) & (freq < 3 * sec_h)
        row_w = (freq % 3 == 2) & (freq < 3 * sec_w)
    else:
        row_h = (freq >= sec_t) & (freq < sec_t + sec_h)
        row_w = freq >= sec_t + sec_h
    return tl.where(row_h, pos_h, tl.where(row_w, pos_w, pos_t))


@triton.jit
def _chunk_heads(x_ptr, w_ptr, token, token_stride, head_stride, num_heads, head_block,
                 pos_ptr, pos_row_stride, pos_token_stride, cache_ptr, rotary_dim, half, sec_t, sec_h, sec_w,
                 head_size, eps, weight_offset,
                 INTERLEAVED: tl.constexpr, NORM: tl.constexpr, EVEN: tl.constexpr, BLOCK_H: tl.constexpr,
                 CHUNKS: tl.constexpr, HALF: tl.constexpr):
    # A head is CHUNKS chunks of rotary_dim dims, each two halves of `half` dims: tile [BLOCK_H, CHUNKS, HALF].
    # "a" holds the first half of every chunk, "b" the second.  The two loads read each dim once, both
    # contiguous along the last axis and in the same layout, so the norm reduces over both and chunk 0's
    # NeoX pairs (a, b) are rotated where they sit: no gather, no layout conversion.  Without the norm
    # CHUNKS is 1: only the rotated dims are touched.
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    chunk = tl.arange(0, CHUNKS)
    freq = tl.arange(0, HALF)
    off_a = (chunk * rotary_dim)[:, None] + freq[None, :]  # [CHUNKS, HALF]
    off_b = off_a + half
    row_mask = (heads < num_heads)[:, None, None]
    if EVEN:  # HALF == half and CHUNKS * rotary_dim == head_size: only whole heads are masked
        mask_a = row_mask
        mask_b = row_mask
    else:
        valid_a = (freq < half)[None, :] & (off_a < head_size)
        valid_b = (freq < half)[None, :] & (off_b < head_size)
        mask_a = row_mask & valid_a[None, :, :]
        mask_b = row_mask & valid_b[None, :, :]
    base = x_ptr + token * token_stride + heads.to(tl.int64)[:, None, None] * head_stride
    # the data first, so its loads are in flight while the weights, positions and cos/sin are fetched
    a = tl.load(base + off_a[None, :, :], mask=mask_a, other=0.0, volatile=True).to(tl.float32)
    b = tl.load(base + off_b[None, :, :], mask=mask_b, other=0.0, volatile=True).to(tl.float32)
    if NORM:
        # loaded with the tile's shape (every head reads the same addresses) so they arrive in the tile's
        # layout instead of being converted to it through shared memory
        rows0 = tl.zeros([BLOCK_H, 1, 1], dtype=tl.int32)
        if EVEN:
            w_a = tl.load(w_ptr + off_a[None, :, :] + rows0)
            w_b = tl.load(w_ptr + off_b[None, :, :] + rows0)
        else:
            w_a = tl.load(w_ptr + off_a[None, :, :] + rows0, mask=valid_a[None, :, :] & (rows0 == 0), other=0.0)
            w_b = tl.load(w_ptr + off_b[None, :, :] + rows0, mask=valid_b[None, :, :] & (rows0 == 0), other=0.0)
    pos = _section_positions(pos_ptr, pos_row_stride, token, pos_token_stride, freq, sec_t, sec_h, sec_w, INTERLEAVED)
    freq_mask = freq < half
    cos = tl.load(cache_ptr + pos * rotary_dim + freq, mask=freq_mask, other=1.0)[None, None, :]
    sin = tl.load(cache_ptr + pos * rotary_dim + half + freq, mask=freq_mask, other=0.0)[None, None, :]
    if NORM:
        sum_sq = tl.sum(tl.sum(a * a + b * b, axis=2), axis=1)
        inv_rms = tl.rsqrt(sum_sq / head_size + eps)[:, None, None]
        # rounded to the tensor's dtype as the un-fused rms_norm would store it, then rotated
        a = (a * inv_rms * (w_a.to(tl.float32) + weight_offset)).to(x_ptr.dtype.element_ty).to(tl.float32)
        b = (b * inv_rms * (w_b.to(tl.float32) + weight_offset)).to(x_ptr.dtype.element_ty).to(tl.float32)
    out_a = a * cos - b * sin
    out_b = b * cos + a * sin
    if CHUNKS > 1:  # chunks past the first are the pass-through dims (partial rotary)
        rotated = (chunk == 0)[None, :, None]
        out_a = tl.where(rotated, out_a, a)
        out_b = tl.where(rotated, out_b, b)
    tl.store(base + off_a[None, :, :], out_a.to(x_ptr.dtype.element_ty), mask=mask_a)
    tl.store(base + off_b[None, :, :], out_b.to(x_ptr.dtype.element_ty), mask=mask_b)


@triton.jit(do_not_specialize=["pos_row_stride"])  # positions [3, T]: the row stride is T
def _mrope_chunks_kernel(pos_ptr, pos_row_stride, pos_token_stride, cache_ptr, rotary_dim, half, sec_t, sec_h, sec_w,
                         q_ptr, q_w_ptr, q_token_stride, q_head_stride, q_heads, q_blocks,
                         k_ptr, k_w_ptr, k_token_stride, k_head_stride, k_heads,
                         head_size, eps, weight_offset,
                         INTERLEAVED: tl.constexpr, NORM: tl.constexpr, EVEN: tl.constexpr, BLOCK_H: tl.constexpr,
                         CHUNKS: tl.constexpr, HALF: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    if block < q_blocks:
        _chunk_heads(q_ptr, q_w_ptr, token, q_token_stride, q_head_stride, q_heads, block,
                     pos_ptr, pos_row_stride, pos_token_stride, cache_ptr, rotary_dim, half, sec_t, sec_h, sec_w,
                     head_size, eps, weight_offset, INTERLEAVED, NORM, EVEN, BLOCK_H, CHUNKS, HALF)
    else:
        _chunk_heads(k_ptr, k_w_ptr, token, k_token_stride, k_head_stride, k_heads, block - q_blocks,
                     pos_ptr, pos_row_stride, pos_token_stride, cache_ptr, rotary_dim, half, sec_t, sec_h, sec_w,
                     head_size, eps, weight_offset, INTERLEAVED, NORM, EVEN, BLOCK_H, CHUNKS, HALF)


@triton.jit
def _pairs_heads(x_ptr, w_ptr, token, token_stride, head_stride, num_heads, head_block, cos, sin,
                       half, rotary_dim, head_size, eps, weight_offset,
                       NORM: tl.constexpr, HAS_PASS: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr,
                       PASS: tl.constexpr):
    dims = tl.arange(0, HALF)
    dim_mask = dims < half
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    head_mask = heads < num_heads
    mask = head_mask[:, None] & dim_mask[None, :]
    base = x_ptr + token * token_stride + heads[:, None].to(tl.int64) * head_stride
    x1 = tl.load(base + dims[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + half + dims[None, :], mask=mask, other=0.0).to(tl.float32)
    if NORM:
        sum_sq = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
        if HAS_PASS:
            rest = tl.arange(0, PASS)
            rest_valid = rest < head_size - rotary_dim
            rest_mask = head_mask[:, None] & rest_valid[None, :]
            x3 = tl.load(base + rotary_dim + rest[None, :], mask=rest_mask, other=0.0).to(tl.float32)
            sum_sq += tl.sum(x3 * x3, axis=1)
        inv_rms = tl.rsqrt(sum_sq / head_size + eps)[:, None]
        w1 = tl.load(w_ptr + dims, mask=dim_mask, other=0.0).to(tl.float32) + weight_offset
        w2 = tl.load(w_ptr + half + dims, mask=dim_mask, other=0.0).to(tl.float32) + weight_offset
        # rounded to the tensor's dtype as the un-fused rms_norm would store it, then rotated
        x1 = (x1 * inv_rms * w1[None, :]).to(x_ptr.dtype.element_ty).to(tl.float32)
        x2 = (x2 * inv_rms * w2[None, :]).to(x_ptr.dtype.element_ty).to(tl.float32)
        if HAS_PASS:
            w3 = tl.load(w_ptr + rotary_dim + rest, mask=rest_valid, other=0.0).to(tl.float32) + weight_offset
            tl.store(base + rotary_dim + rest[None, :], (x3 * inv_rms * w3[None, :]).to(x_ptr.dtype.element_ty),
                     mask=rest_mask)
    o1 = x1 * cos[None, :] - x2 * sin[None, :]
    o2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(base + dims[None, :], o1.to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(base + half + dims[None, :], o2.to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _mrope_pairs_kernel(pos_ptr, pos_row_stride, pos_token_stride, cache_ptr, rotary_dim, sec_t, sec_h, sec_w,
                  q_ptr, q_w_ptr, q_token_stride, q_head_stride, q_heads, q_blocks,
                  k_ptr, k_w_ptr, k_token_stride, k_head_stride, k_heads,
                  head_size, eps, weight_offset,
                  INTERLEAVED: tl.constexpr, NORM: tl.constexpr, HAS_PASS: tl.constexpr,
                  BLOCK_H: tl.constexpr, HALF: tl.constexpr, PASS: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    half = rotary_dim // 2
    freq = tl.arange(0, HALF)
    freq_mask = freq < half
    # the position row (0 = time, 1 = height, 2 = width) each frequency reads
    if INTERLEAVED:
        row = tl.where((freq % 3 == 1) & (freq < 3 * sec_h), 1, tl.where((freq % 3 == 2) & (freq < 3 * sec_w), 2, 0))
    else:
        row = tl.where(freq < sec_t, 0, tl.where(freq < sec_t + sec_h, 1, 2))
    pos = tl.load(pos_ptr + row * pos_row_stride + token * pos_token_stride, mask=freq_mask, other=0).to(tl.int64)
    cos = tl.load(cache_ptr + pos * rotary_dim + freq, mask=freq_mask, other=1.0)
    sin = tl.load(cache_ptr + pos * rotary_dim + half + freq, mask=freq_mask, other=0.0)
    if block < q_blocks:
        _pairs_heads(q_ptr, q_w_ptr, token, q_token_stride, q_head_stride, q_heads, block, cos, sin,
                           half, rotary_dim, head_size, eps, weight_offset, NORM, HAS_PASS, BLOCK_H, HALF, PASS)
    else:
        _pairs_heads(k_ptr, k_w_ptr, token, k_token_stride, k_head_stride, k_heads, block - q_blocks, cos, sin,
                           half, rotary_dim, head_size, eps, weight_offset, NORM, HAS_PASS, BLOCK_H, HALF, PASS)


def launch(positions, q, k, cos_sin_cache, head_size, mrope_section, interleaved, q_weight, k_weight, eps,
           weight_offset, config: Config):
    """Run the kernel with an explicit launch configuration (the op picks one from :data:`CONFIGS`)."""
    num_tokens = positions.shape[-1]
    rotary_dim = cos_sin_cache.shape[-1]
    sec_t, sec_h, sec_w = check_section(mrope_section, rotary_dim)
    pos_row_stride = positions.stride(0) if positions.dim() == 2 else 0
    pos_token_stride = positions.stride(-1)
    q_token_stride, q_head_stride = _head_strides(q, head_size)
    q_heads = q.shape[1] // head_size if q.dim() == 2 else q.shape[1]
    if k is not None:
        k_token_stride, k_head_stride = _head_strides(k, head_size)
        k_heads = k.shape[1] // head_size if k.dim() == 2 else k.shape[1]
    else:
        k, k_weight = q, q_weight  # never read: no k head blocks are launched
        k_token_stride = k_head_stride = k_heads = 0
    norm = q_weight is not None
    q_blocks = triton.cdiv(q_heads, config.block_h)
    k_blocks = triton.cdiv(k_heads, config.block_h)
    if num_tokens == 0 or q_blocks + k_blocks == 0:
        return
    grid = (num_tokens, q_blocks + k_blocks)
    head_args = (q, q_weight if norm else q, q_token_stride, q_head_stride, q_heads, q_blocks,
                 k, k_weight if norm else k, k_token_stride, k_head_stride, k_heads, head_size, eps, weight_offset)
    half, half_block = rotary_dim // 2, triton.next_power_of_2(rotary_dim // 2)
    if config.kernel == "chunks":
        chunks = triton.next_power_of_2(triton.cdiv(head_size, rotary_dim)) if norm else 1
        even = half == half_block and (not norm or chunks * rotary_dim == head_size)
        _mrope_chunks_kernel[grid](
            positions, pos_row_stride, pos_token_stride, cos_sin_cache, rotary_dim, half, sec_t, sec_h, sec_w,
            *head_args, INTERLEAVED=bool(interleaved), NORM=norm, EVEN=even, BLOCK_H=config.block_h,
            CHUNKS=chunks, HALF=half_block, num_warps=config.num_warps,
        )
    elif config.kernel == "pairs":
        _mrope_pairs_kernel[grid](
            positions, pos_row_stride, pos_token_stride, cos_sin_cache, rotary_dim, sec_t, sec_h, sec_w,
            *head_args, INTERLEAVED=bool(interleaved), NORM=norm, HAS_PASS=norm and head_size > rotary_dim,
            BLOCK_H=config.block_h, HALF=half_block,
            PASS=triton.next_power_of_2(max(head_size - rotary_dim, 1)), num_warps=config.num_warps,
        )
    else:
        raise ValueError(f"unknown mrope kernel {config.kernel!r}; known: {KERNELS}")


def mrope(positions, q, k, cos_sin_cache, head_size, mrope_section, interleaved=False, *,
          q_weight=None, k_weight=None, eps=1e-6, weight_offset=0.0):
    config = CONFIGS[shape_class(head_size, cos_sin_cache.shape[-1], q_weight is not None)]
    launch(positions, q, k, cos_sin_cache, head_size, mrope_section, interleaved, q_weight, k_weight, eps,
           weight_offset, config)
    return q, k
