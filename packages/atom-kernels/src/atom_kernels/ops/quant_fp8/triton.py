"""Triton FP8 activation quantization.

Per token (or static): one program per row, a loop over the row in chunks (an amax pass, then the
quantizing pass; the second read hits L1/L2).  The row length is a compile-time constant (one
specialization per hidden size): Triton 3.6's interpreter cannot run a ``range`` over a runtime
integer with numpy >= 2.4.  Per token group: a 2-D grid of (row, groups chunk),
each program holding ``GROUPS`` whole groups.

Values are rounded to the e4m3 grid in fp32 (round to nearest even, as ``cvt.rn.satfinite`` does)
before the cast, so the cast itself is exact.  That makes the kernel agree bit for bit with the
torch reference on the GPU and in Triton 3.6's CPU interpreter, whose fp32 -> fp8 cast mishandles a
mantissa that rounds up into the next binade (125.0 -> 64.0) and rounds ties away from zero.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.formats import FP8_MAX, FP8_MIN_AMAX

ROW_BLOCK = 4096  # elements per chunk of a row (per-token kernel)
MAX_GROUP = 1024
_MAX = tl.constexpr(FP8_MAX)
_MIN_AMAX = tl.constexpr(FP8_MIN_AMAX)


def unsupported(x, group_size=None, static_scale=None) -> str | None:
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"quant_fp8 takes fp32/bf16/fp16, not {x.dtype}"
    if x.stride(-1) != 1:
        return "the last dim of x must be contiguous"
    if group_size is not None and not 0 < group_size <= MAX_GROUP:
        return f"group_size {group_size} outside 1..{MAX_GROUP}"
    if static_scale is not None and static_scale.numel() != 1:
        return f"static_scale must hold one value, got shape {tuple(static_scale.shape)}"
    return None


@triton.jit
def _round_to_e4m3(v):
    """Round fp32 ``v`` (already clamped to +-448) to the nearest e4m3 value, ties to even."""
    bits = v.to(tl.int32, bitcast=True)
    exponent = (bits >> 23) & 0xFF  # biased fp32 exponent (0 for zero)
    # e4m3 has 3 mantissa bits and subnormals below 2**-6: the grid spacing is 2**(max(e, -6) - 3)
    step = tl.maximum(exponent - 127, -6) - 3
    inv_spacing = ((127 - step) << 23).to(tl.float32, bitcast=True)
    spacing = ((127 + step) << 23).to(tl.float32, bitcast=True)
    t = v * inv_spacing  # exact (power of two); |t| < 16
    t = (t + 12582912.0) - 12582912.0  # 1.5 * 2**23: fp32 addition rounds t to an integer, ties to even
    rounded = (t * spacing).to(tl.int32, bitcast=True)
    return (rounded | (bits & -2147483648)).to(tl.float32, bitcast=True)  # keep the sign of -0 and -tiny


@triton.jit
def _quant_rows_kernel(
    x_ptr, x_stride, q_ptr, q_stride, s_ptr, static_ptr,
    K: tl.constexpr, STATIC: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    if STATIC:
        scale = tl.load(static_ptr).to(tl.float32)
    else:
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, K, BLOCK):
            x = tl.load(x_ptr + row * x_stride + start + cols, mask=start + cols < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        scale = tl.maximum(tl.max(amax, axis=0), _MIN_AMAX) * (1.0 / _MAX)
    tl.store(s_ptr + row, scale)
    inv_scale = tl.math.div_rn(1.0, scale)  # IEEE division, as the reference's torch.reciprocal
    for start in range(0, K, BLOCK):
        mask = start + cols < K
        x = tl.load(x_ptr + row * x_stride + start + cols, mask=mask, other=0.0).to(tl.float32)
        v = tl.minimum(tl.maximum(x * inv_scale, -_MAX), _MAX)
        tl.store(q_ptr + row * q_stride + start + cols, _round_to_e4m3(v).to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _quant_groups_kernel(
    x_ptr, x_stride, q_ptr, q_stride, s_ptr, s_stride, K, group_size, num_groups,
    GROUP: tl.constexpr, GROUPS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    inner = tl.arange(0, GROUP)
    cols = group[:, None] * group_size + inner[None, :]
    mask = (inner[None, :] < group_size) & (cols < K)
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=1), _MIN_AMAX) * (1.0 / _MAX)
    tl.store(s_ptr + row * s_stride + group, scale, mask=group < num_groups)
    inv_scale = tl.math.div_rn(tl.full([GROUPS], 1.0, tl.float32), scale)
    v = tl.minimum(tl.maximum(x * inv_scale[:, None], -_MAX), _MAX)
    tl.store(q_ptr + row * q_stride + cols, _round_to_e4m3(v).to(q_ptr.dtype.element_ty), mask=mask)


def quant_fp8(x: torch.Tensor, group_size: int | None = None, static_scale: torch.Tensor | None = None):
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    rows = x2.shape[0]
    q = torch.empty((rows, k), dtype=torch.float8_e4m3fn, device=x.device)
    if group_size is None or static_scale is not None:
        scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
        if rows:
            block = min(triton.next_power_of_2(max(k, 1)), ROW_BLOCK)
            static = static_scale.reshape(1) if static_scale is not None else scale
            _quant_rows_kernel[(rows,)](
                x2, x2.stride(0), q, q.stride(0), scale, static, k,
                STATIC=static_scale is not None, BLOCK=block, num_warps=min(max(block // 256, 1), 8),
            )
    else:
        num_groups = -(-k // group_size)
        scale = torch.empty((rows, num_groups), dtype=torch.float32, device=x.device)
        group = triton.next_power_of_2(group_size)
        groups = max(1, min(triton.next_power_of_2(num_groups), 2048 // group))
        if rows:
            _quant_groups_kernel[(rows, triton.cdiv(num_groups, groups))](
                x2, x2.stride(0), q, q.stride(0), scale, scale.stride(0), k, group_size, num_groups,
                GROUP=group, GROUPS=groups, num_warps=4,
            )
    return q.view(x.shape), scale.view(*x.shape[:-1], scale.shape[-1])
